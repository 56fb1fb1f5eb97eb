"""Actuators, by target."""

from opencortex.actuators.base import (Actuator, ActuatorError, ActuatorRegistry, MessageActuator,
                                       NoActuator, Outcome)
from opencortex.actuators.cli import CliActuator
from opencortex.actuators.tool import ToolActuator

__all__ = ["Actuator", "ActuatorError", "ActuatorRegistry", "MessageActuator", "NoActuator",
           "Outcome", "CliActuator", "ToolActuator"]
