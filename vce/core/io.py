"""Atomic file outputs: a killed stage never leaves a file that looks complete."""

from __future__ import annotations

import json
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

from vce.core.errors import DataError

# The process umask, read once (os.umask can only be read by setting it).
_UMASK = os.umask(0o022)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK  # what open() would give a new file; mkstemp's own is 0600


def _temporary_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a killed run
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def _publish(tmp: Path, path: Path) -> None:
    if tmp.is_file():  # a writer may have replaced the file: set the mode on what is there
        os.chmod(tmp, FILE_MODE)
    os.replace(tmp, path)


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success rename it over `path`.

    The rename is atomic on POSIX, so readers see either the old file or the whole
    new one. On an exception the temporary file is removed. The file gets the mode a plain
    `open()` would give it (0666 less the umask), not mkstemp's private 0600.
    """
    path = Path(path)
    tmp = _temporary_beside(path)
    try:
        yield tmp
        _publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def atomic_paths(*paths: str | os.PathLike):
    """`atomic_path` for a set of outputs written together: yields their temporary paths and
    renames them only after every one was written, so a failure while writing (disk full,
    kill) leaves the whole old set, never new files beside old ones."""
    paths = [Path(p) for p in paths]
    temps = []
    try:
        temps = [_temporary_beside(p) for p in paths]
        yield temps
        for tmp, path in zip(temps, paths):
            _publish(tmp, path)
    except BaseException:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        raise


def read_json(path, what: str):
    """Load a JSON file; a missing or malformed one is an error naming `what` and the path."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: file not found: {path}") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{what}: {path} is not valid JSON ({err})") from None
    except RecursionError:  # json recurses once per nesting level
        raise DataError(f"{what}: {path} is JSON nested too deeply") from None


def json_text(obj, indent: int | None = 2) -> str:
    """The text `write_json` writes."""
    return json.dumps(obj, indent=indent) + "\n"


def write_json(path, obj, indent: int | None = 2) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json_text(obj, indent))


def write_text(path, text: str) -> None:
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def write_parquet(path, frame, **kwargs) -> None:
    """Write a pandas DataFrame to Parquet atomically (deterministic bytes for equal data)."""
    with atomic_path(path) as tmp:
        frame.to_parquet(tmp, index=False, **kwargs)


def safe_file_name(name: str) -> str:
    """A single, harmless file name for a value read from data (e.g. a video id).

    Video ids come from folder names and JSON files a user may not have written: anything
    but letters, digits, '.', '_' and '-' becomes '_', so no id can climb out of the output
    folder ('../x') or name a special entry ('.', '..').
    """
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", str(name))
    return cleaned if cleaned not in ("", ".", "..") else f"_{cleaned}"
