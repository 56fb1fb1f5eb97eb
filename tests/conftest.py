"""Shared fixtures: a kernel on a temporary home with the bundled skills."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from opencortex.actuators import MessageActuator
from opencortex.approvals import ApprovalDecision, ApprovalRequest, Approver
from opencortex.config import load_config

REPO = Path(__file__).resolve().parents[1]

ENV_VARS = ("OPENCORTEX_HOME", "OPENCORTEX_CONFIG", "OPENCORTEX_BACKEND", "OPENCORTEX_MODEL",
            "OPENCORTEX_SCRIPT",
            "OPENCORTEX_SKILL_DIRS", "OPENCORTEX_PERSONA", "ANTHROPIC_API_KEY", "OPENAI_API_KEY")


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch, tmp_path):
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))


@pytest.fixture
def home(tmp_path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture
def config(home):
    return load_config(home)


class RecordingActuator(MessageActuator):
    """Stands in for a frontend this tree does not have yet (Emacs, bridges)."""

    def __init__(self, *targets: str):
        self.targets = targets
        self.delivered: list[tuple[str, str]] = []

    async def deliver(self, address: str, text: str, key: str | None = None) -> None:
        self.delivered.append((address, text))


def cli_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS}
    env.update({"OPENCORTEX_HOME": str(home), **extra})
    return env


class AnsweringApprover(Approver):
    """Answers every approval request with one decision, keeping what it was shown."""

    def __init__(self, how: str):
        self.how = how
        self.asked: list[ApprovalRequest] = []

    async def ask(self, request: ApprovalRequest) -> ApprovalDecision:
        self.asked.append(request)
        return ApprovalDecision(self.how)
