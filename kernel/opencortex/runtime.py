"""Assembling a kernel from a Config: archive, skills, backend, tools, actuators."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Callable, TextIO

from opencortex.actuators import ActuatorRegistry, CliActuator, ToolActuator
from opencortex.actuators.shell import ShellActuator
from opencortex.config import Config
from opencortex.conversation.conversations import Conversations
from opencortex.conversation.dense import DenseRecall
from opencortex.conversation.summaries import backend_summarizer
from opencortex.kernel import Kernel
from opencortex.llm import Backend, make_backend
from opencortex.memory import Archive
from opencortex.skills import SkillRegistry
from opencortex.tools import ToolRegistry, default_tools
from opencortex.tools.memory_view import OwnerMemory
from opencortex.tools.settings import ToolSettings

log = logging.getLogger(__name__)


def read_persona(path: Path) -> str:
    """The persona note's text, without org file keywords (`#+TITLE:` …)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        log.warning("persona note %s cannot be read; using none", path)
        return ""
    lines = [line for line in text.splitlines() if not line.lstrip().lower().startswith("#+")]
    return "\n".join(lines).strip()


def skill_cache_dir(config: Config) -> Path:
    """Where the home keeps compiled skill files (see `opencortex.skills.compile_cache`)."""
    return config.home / "cache" / "skills"


def load_skills(config: Config, tools: ToolRegistry | None = None) -> SkillRegistry:
    """The skills (and the tools they define, added to TOOLS) of the configured directories."""
    registry = SkillRegistry(config.all_skill_dirs, tools if tools is not None else default_tools(),
                             cache_dir=skill_cache_dir(config))
    registry.load()
    return registry


def tool_settings(config: Config) -> ToolSettings:
    """`[tools]` with the home's defaults filled in (the notes file)."""
    if config.tools.notes_file is not None:
        return config.tools
    return config.tools.model_copy(update={"notes_file": config.memory_dir / "notes.org"})


def build_kernel(config: Config, *, backend: Backend | None = None,
                 writer: Callable[[str], None] | None = None,
                 stream: TextIO | None = None) -> Kernel:
    """A ready kernel; skill load errors are in `kernel.skills.errors`."""
    tools = default_tools()
    backend = backend or make_backend(config)
    archive = Archive(config.memory_dir, background=True,   # a long-lived kernel
                      tokenizer=config.memory.tokenizer)
    summarizer = (backend_summarizer(backend, timeout=config.llm_timeout)
                  if backend.name not in ("echo", "script") else None)
    unarchived = [name for name, bridge in config.bridges.enabled().items() if not bridge.archive]
    conversations = Conversations(archive, config.conversation, summarizer=summarizer,
                                  unarchived=unarchived)
    conversations.recall.dense = DenseRecall.from_settings(archive, config.memory.embeddings)
    actuators = ActuatorRegistry([CliActuator(stream=stream, writer=writer),
                                  ToolActuator(tools, tool_settings(config),
                                               memory_for=partial(OwnerMemory.of, conversations)),
                                  ShellActuator(config.shell, config.home)])
    kernel = Kernel(config=config, skills=load_skills(config, tools), backend=backend,
                    actuators=actuators, archive=archive, tools=tools,
                    conversations=conversations, persona=read_persona(config.persona_file))
    kernel.reporters["index"] = archive.index_report
    return kernel
