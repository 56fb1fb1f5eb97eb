"""opencortex: a kernel that reads every model reply as data, verifies it, then acts."""

__version__ = "0.1.0"
