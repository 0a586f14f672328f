"""Atomic file outputs: a killed stage never leaves a file that looks complete."""

from __future__ import annotations

import json
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

from vce.core.errors import DataError


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success rename it over `path`.

    The rename is atomic on POSIX, so readers see either the old file or the whole
    new one. On an exception the temporary file is removed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a killed run
        stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_json(path, what: str):
    """Load a JSON file; a missing or malformed one is an error naming `what` and the path."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{what}: file not found: {path}") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{what}: {path} is not valid JSON ({err})") from None


def write_json(path, obj, indent: int | None = 2) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=indent)
            f.write("\n")


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
