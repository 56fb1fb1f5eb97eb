"""An unexpected error named by its type and the place it was raised, never its text.

An error's text may quote what was received (a message, a model's reply, a
provider's stream), and that must not reach a log, a status line or a person's
screen; its type and the file and line where it was raised say enough to report
it.
"""

from __future__ import annotations

import traceback
from pathlib import Path


def unexpected(error: BaseException) -> str:
    """ERROR as "unexpected TypeError at reader.py:12" (its innermost frame)."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return f"unexpected {type(error).__name__}"
    last = frames[-1]
    return f"unexpected {type(error).__name__} at {Path(last.filename).name}:{last.lineno}"
