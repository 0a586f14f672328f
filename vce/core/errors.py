"""The project's own errors: what a user can fix (a parameter, a data file, a missing input).

Stages run through `vce.core.runner.run`: these print one line naming the key or file and exit
2; any other exception is a bug and keeps its full traceback (exit 1). They subclass ValueError
only so that callers catching ValueError keep working; the runner does not treat a plain
ValueError (a numpy broadcast, a pandas merge) as a user error.
"""

from __future__ import annotations


class VCEError(Exception):
    """A problem in the user's parameters, data or files, stated in one line."""


class ParamsError(VCEError, ValueError):
    """A parameter in params.yaml is missing, unknown, of the wrong type or out of range."""


class DataError(VCEError, ValueError):
    """An input file is missing, unreadable or inconsistent (the message names it)."""
