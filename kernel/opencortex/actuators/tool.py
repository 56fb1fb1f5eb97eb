"""The tool actuator: runs a registered tool with its checked arguments."""

from __future__ import annotations

import inspect

from opencortex.actions import Action, ToolCall
from opencortex.actuators.base import Actuator, ActuatorError, Outcome
from opencortex.events import Event
from opencortex.tools import ToolRegistry


class ToolActuator(Actuator):
    targets = ("tool",)

    def __init__(self, tools: ToolRegistry):
        self.tools = tools

    async def carry_out(self, action: Action, event: Event) -> Outcome:
        if not isinstance(action, ToolCall):
            raise ActuatorError(f"the tool actuator cannot carry out {type(action).__name__}")
        tool = self.tools.get(action.tool)
        if tool is None:
            raise ActuatorError(f"tool {action.tool!r} is not registered")
        args = tool.arguments.model_validate(
            {k.replace("-", "_"): v for k, v in action.args.items()})
        try:
            result = tool.run(args)
            if inspect.isawaitable(result):
                result = await result
        except Exception as error:  # a tool is trusted code, but may still fail
            raise ActuatorError(f"tool {action.tool!r} failed: {type(error).__name__}") from error
        return Outcome(result=str(result))
