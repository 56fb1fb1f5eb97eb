"""Actuators carry out accepted actions, one registry entry per target.

Interfaces the Emacs, bridge and tool actuators implement:
- `Actuator`: `targets` it serves and `carry_out(action, event) -> Outcome`.
- `MessageActuator`: for targets that show text to a person (Emacs buffer,
  terminal, Telegram, Signal, Matrix): implement `deliver(address, text)`.
A target with no registered actuator raises `NoActuator`, never a silent drop.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass

from opencortex.actions import Action, ChatIdMessage, CliPrint, EmacsInsert, MatrixMessage
from opencortex.events import Event


class ActuatorError(Exception):
    """An actuator could not carry out an action; the message says why and what to do."""


class NoActuator(ActuatorError):
    """No actuator is registered for a target."""


@dataclass(frozen=True)
class Outcome:
    """What carrying out an action produced: text shown, or a result to report back."""

    shown: str | None = None
    result: str | None = None


class Actuator(abc.ABC):
    targets: tuple[str, ...] = ()

    @abc.abstractmethod
    async def carry_out(self, action: Action, event: Event, *,
                        key: str | None = None) -> Outcome:
        """Do ACTION (already verified) for EVENT; raise ActuatorError on failure.  KEY
        names what is said (the archived reply's id), the same when it is said again
        after a crash, so a platform that can (Matrix) says it only once."""

    def saying(self, event: Event) -> None:
        """EVENT's reply, for this actuator, is decided and its turn is being written: from
        now on the turn is kept and said whatever happens, so a frontend that offers to
        abort turns refuses (nothing by default)."""

    async def aclose(self) -> None:
        """Release what the actuator holds; the default holds nothing."""


def address_of(action: Action) -> str:
    """Where a message action goes: a buffer, chat id or room id."""
    if isinstance(action, EmacsInsert):
        return action.buffer
    if isinstance(action, ChatIdMessage):
        return action.chat_id
    if isinstance(action, MatrixMessage):
        return action.room_id
    return "terminal"


class MessageActuator(Actuator):
    """Base for targets that show text to a person."""

    @abc.abstractmethod
    async def deliver(self, address: str, text: str, key: str | None = None) -> None:
        """Show TEXT at ADDRESS (a buffer, chat id or room id); KEY: see `carry_out`."""

    async def show_error(self, address: str, text: str) -> None:
        """Show an error; frontends that can set errors apart (a face, a prefix) override this."""
        await self.deliver(address, text)

    async def carry_out(self, action: Action, event: Event, *,
                        key: str | None = None) -> Outcome:
        await self.deliver(self.message_address(action), action.text, key)
        return Outcome(shown=action.text)

    def message_address(self, action: Action) -> str:
        """Where the message ACTION goes (`address_of`); ActuatorError for another action."""
        if not isinstance(action, (EmacsInsert, ChatIdMessage, MatrixMessage, CliPrint)):
            raise ActuatorError(f"{type(self).__name__} cannot carry out {type(action).__name__}")
        return address_of(action)


class ActuatorRegistry:
    """Actuators by target."""

    def __init__(self, actuators: list[Actuator] | None = None):
        self._by_target: dict[str, Actuator] = {}
        for actuator in actuators or []:
            self.register(actuator)

    def register(self, actuator: Actuator) -> None:
        for target in actuator.targets:
            self._by_target[target] = actuator

    def targets(self) -> list[str]:
        return sorted(self._by_target)

    def for_target(self, target: str) -> Actuator:
        actuator = self._by_target.get(target)
        if actuator is None:
            known = ", ".join(self.targets()) or "none"
            raise NoActuator(f"no actuator is registered for target :{target} "
                             f"(this kernel can reach: {known})")
        return actuator

    async def aclose(self) -> None:
        for actuator in set(self._by_target.values()):
            await actuator.aclose()
