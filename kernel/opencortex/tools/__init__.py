"""Tools: the registry and its contract, what a running tool sees, `deftool`."""

from opencortex.tools.registry import (RISKS, NoArguments, Risk, Tool, ToolRegistry, Trust,
                                       default_tools)

__all__ = ["RISKS", "NoArguments", "Risk", "Tool", "ToolRegistry", "Trust", "default_tools"]
