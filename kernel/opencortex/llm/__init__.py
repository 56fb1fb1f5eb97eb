"""LLM backends behind one interface (see `base`): echo, script, anthropic, openai.

The names this package exports load their module on first use (PEP 562), so the
configuration, which imports `opencortex.llm.settings`, loads no backend, and
`opencortex serve` prints its port line sooner.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from opencortex.lazy import lazy_exports

if TYPE_CHECKING:  # config.py imports llm.settings: no import of config at run time
    from opencortex.config import Config
    from opencortex.llm.base import Backend
    from opencortex.llm.provider import ProviderBackend
    from opencortex.llm.settings import LLMSettings

_LAZY = {**dict.fromkeys(["Backend", "LLMError", "PromptMessage", "PromptRequest",
                          "ReplyAddress", "Thinking", "Usage"], "base"),
         "estimate_cost": "cost", "ECHO_WARNING": "echo", "EchoBackend": "echo",
         "EchoFallback": "fallback", "ProviderBackend": "provider",
         "archetype_for": "routing", "choose_model": "routing",
         "ScriptBackend": "script", "LLMSettings": "settings"}


__getattr__ = lazy_exports(__name__, _LAZY)

__all__ = ["Backend", "LLMError", "PromptMessage", "PromptRequest", "ReplyAddress", "Thinking",
           "Usage",
           "EchoBackend", "EchoFallback", "ScriptBackend", "LLMSettings", "make_backend",
           "provider_backend", "auto_backend_name", "archetype_for", "choose_model",
           "estimate_cost"]

PROVIDERS = ("anthropic", "openai")


def auto_backend_name(settings: LLMSettings) -> str | None:
    """What `backend = "auto"` means here: anthropic when its key is set, else an
    OpenAI-compatible server when its key is set or `[llm.openai] base_url` is
    configured, else None (echo)."""
    if os.environ.get(settings.anthropic.api_key_env):
        return "anthropic"
    if os.environ.get(settings.openai.api_key_env) or settings.openai.base_url:
        return "openai"
    return None


def provider_backend(name: str, settings: LLMSettings) -> ProviderBackend:
    """The provider backend NAME (anthropic or openai), not wrapped."""
    if name == "anthropic":
        from opencortex.llm.anthropic_api import AnthropicBackend
        return AnthropicBackend(settings)
    if name == "openai":
        from opencortex.llm.openai_compatible import OpenAICompatibleBackend
        return OpenAICompatibleBackend(settings)
    raise ValueError(f"unknown LLM backend {name!r}; expected one of {', '.join(PROVIDERS)}")


def make_backend(config: Config) -> Backend:
    """The backend the configuration asks for.

    `auto` picks a provider whose key is set (see `auto_backend_name`), else echo.
    A provider is wrapped in `EchoFallback` unless `[llm] fallback_to_echo = false`.
    """
    from opencortex.llm.echo import ECHO_WARNING, EchoBackend
    from opencortex.llm.fallback import EchoFallback
    from opencortex.llm.script import ScriptBackend
    if config.backend == "script":
        if config.script is None:
            raise ValueError("backend 'script' needs a script file: set `script` in the "
                             "configuration, OPENCORTEX_SCRIPT, or pass --script FILE")
        return ScriptBackend(config.script)
    if config.backend == "echo":
        return EchoBackend()
    settings = config.llm
    name = config.backend if config.backend in PROVIDERS else auto_backend_name(settings)
    if name is None:
        return EchoBackend(warning=f"{ECHO_WARNING} Set ANTHROPIC_API_KEY (or configure "
                                   "[llm.openai] for a local server) to talk to a model.")
    backend = provider_backend(name, settings)
    if not settings.fallback_to_echo:
        return backend
    fallback = EchoFallback(backend)
    if backend.key_missing:
        variable = backend.provider.key_variable
        fallback.warning = (f"{variable} is not set: {ECHO_WARNING} "
                            f"export {variable}=… to use {name}.")
    return fallback
