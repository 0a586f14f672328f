"""The one runner of every stage: a user error is one line and exit 2, a bug a traceback.

    @runner.stage
    def main(argv=None) -> int: ...

    if __name__ == "__main__":
        sys.exit(main())

A user error is the project's own `VCEError` (bad params, bad data, a missing input) or an
OSError from the file system (file not found, permission denied, disk full): the message names
the key or file, so a traceback would add nothing. Anything else is a bug and keeps its full
traceback (Python exits 1).

Started from the command line (`argv` None), a stage first applies `base.exact_cpu`
(vce/core/exact.py): it re-executes itself with baseline numerics before anything heavy is
imported, so the demo gives the same bytes on any x86-64 CPU.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from vce.core.errors import VCEError

USER_ERRORS = (VCEError, OSError)


def run(main: Callable[[], int | None]) -> int:
    """Call `main`; on a user error print `error: <message>` to stderr and return 2."""
    try:
        return main() or 0
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def stage(main: Callable[..., int | None]) -> Callable[..., int]:
    """Wrap a stage's `main(argv=None)` in `run`: it returns 0, or 2 after a one-line error."""

    @functools.wraps(main)
    def wrapped(argv=None) -> int:
        if argv is None:
            from vce.core import exact
            exact.reexec_if_wanted()
        return run(lambda: main(argv))

    return wrapped
