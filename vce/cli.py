"""Shared shape of the stage entry points: user errors become one line, not a traceback."""

from __future__ import annotations

import sys
from typing import Callable

from .frames import FrameError
from .params import ParamsError

USER_ERRORS = (ParamsError, FrameError, FileNotFoundError, ValueError)


def run(main: Callable[[], int | None]) -> int:
    """Call `main`; print `error: <message>` to stderr and return 2 on a user error."""
    try:
        return main() or 0
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
