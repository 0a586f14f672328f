"""The one runner of every stage: a user error is one line and exit 2, a bug a traceback.

    @runner.stage
    def main(argv=None) -> int: ...

    if __name__ == "__main__":
        sys.exit(main())

Every file a stage writes through `vce.core.io` (atomic_path, write_json, …) is one output set
(`output_set`): renamed over the old files only when `main` returns, so a failure anywhere (a
bad input found late, a full disk at the last file) leaves the previous run's set whole.

A user error is the project's own `VCEError` (bad params, bad data, a missing input) or an
OSError from the file system (file not found, permission denied, disk full): the message names
the key or file, so a traceback would add nothing. Anything else is a bug and keeps its full
traceback (Python exits 1).

Started from the command line (`argv` None), a stage first applies `base.exact_cpu`
(vce/core/exact.py): it re-executes itself with baseline numerics before anything heavy is
imported, so the demo gives the same bytes on any x86-64 CPU.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable

from vce.core.errors import VCEError
from vce.core.io import output_set

USER_ERRORS = (VCEError, OSError)


def run(main: Callable[[], int | None]) -> int:
    """Call `main`; on a user error print `error: <message>` to stderr and return 2."""
    try:
        with pipe_safe_stdout(), output_set():  # the stage's outputs: all renamed at the end, or none
            return main() or 0
    except USER_ERRORS as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


class _PipeSafe:
    """stdout that a reader may stop reading (`| head`): the first BrokenPipeError points the
    descriptor at /dev/null and the program goes on quietly. What a stage prints is a summary;
    its outputs are files, and a closed pipe must not leave them unwritten."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())  # also what the interpreter flushes at exit
        os.close(devnull)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def pipe_safe_stdout():
    """Within: `print` to a closed pipe is silent (`_PipeSafe`); stdout is restored after."""
    stream = sys.stdout
    sys.stdout = _PipeSafe(stream)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stdout = stream


def module_prog(spec) -> str | None:
    """argparse's `prog` for a module run as `python -m <module>`: the command a user types in
    `usage:` (argparse's own default is the file name, `events.py`)."""
    return f"python -m {spec.name}" if spec is not None else None


def stage(main: Callable[..., int | None]) -> Callable[..., int]:
    """Wrap a stage's `main(argv=None)` in `run`: it returns 0, or 2 after a one-line error."""

    @functools.wraps(main)
    def wrapped(argv=None) -> int:
        if argv is None:
            from vce.core import exact
            exact.reexec_if_wanted()
        return run(lambda: main(argv))

    return wrapped
