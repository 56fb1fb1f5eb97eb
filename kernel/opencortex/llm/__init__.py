"""LLM backends behind one interface (see `base`)."""

from __future__ import annotations

import os

from opencortex.config import Config
from opencortex.llm.base import (Backend, LLMError, PromptMessage, PromptRequest, ReplyAddress,
                                 Usage)
from opencortex.llm.echo import ECHO_WARNING, EchoBackend
from opencortex.llm.script import ScriptBackend

__all__ = ["Backend", "LLMError", "PromptMessage", "PromptRequest", "ReplyAddress", "Usage",
           "EchoBackend", "ScriptBackend", "make_backend"]

KEY_VARIABLES = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")


def make_backend(config: Config) -> Backend:
    """The backend the configuration asks for; `auto` means echo until a real one is set up."""
    if config.backend == "script":
        if config.script is None:
            raise ValueError("backend 'script' needs a script file: set `script` in the "
                             "configuration, OPENCORTEX_SCRIPT, or pass --script FILE")
        return ScriptBackend(config.script)
    if config.backend == "echo":
        return EchoBackend()
    keys = [name for name in KEY_VARIABLES if os.environ.get(name)]
    if keys:
        return EchoBackend(warning=(
            f"{keys[0]} is set, but this kernel has no {keys[0].split('_')[0].lower()} "
            f"backend yet; {ECHO_WARNING}"))
    return EchoBackend(warning=f"{ECHO_WARNING} Set ANTHROPIC_API_KEY to talk to a model.")
