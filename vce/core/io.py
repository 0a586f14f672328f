"""Atomic outputs: a killed or failed stage never leaves a file or folder that looks complete."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import json
import os
import re
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from vce.core.errors import DataError
from vce.core.publish import (  # noqa: F401  (FILE_MODE: read here by callers)
    DIR_MODE,
    FILE_MODE,
    discard,
    fsync_file,
    owner,
    publish_all,
    recover,
    sweep,
)

# In every folder `atomic_dir` writes: the mark that the folder is this tool's own output, which
# the next run may replace whole. A folder without it is the user's, and is never replaced.
OWN_MARK = ".vce-output"
_OWN_MARK_TEXT = "written by vce (vce.core.io.atomic_dir): the next run replaces this folder whole\n"

# The temporaries of the output set being written (`output_set`), or None outside one.
_PENDING: ContextVar[list | None] = ContextVar("output_set", default=None)


def _real(path: str | os.PathLike) -> Path:
    """The output's real location: a symlinked output is written where the link points (the link
    and its disk are kept); relative paths are made absolute once."""
    path = Path(os.path.abspath(path))
    return path.resolve() if path.is_symlink() else path


def _tidy(folder: Path) -> None:
    """Before writing into `folder`: finish a killed publish there, and sweep what dead writers
    left in it and in the folder above (where a folder output's staging lies beside it)."""
    for where in (folder, folder.parent):
        recover(where)
        sweep(where, {tmp for tmp, _ in _PENDING.get() or []})


def _temporary_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    _tidy(path.parent)
    pending = {tmp for tmp, _ in _PENDING.get() or []}
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a killed run
        if stale not in pending:
            stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{owner()}-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def _staging_beside(path: Path) -> Path:
    """A new hidden folder beside `path` (`atomic_dir`); staging and trash folders a killed run
    left there are removed first (not those of the output set being written)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _tidy(path.parent)
    pending = {tmp for tmp, _ in _PENDING.get() or []}
    for stale in [*path.parent.glob(f".{path.name}.*.dir"), *path.parent.glob(f".{path.name}.*.trash")]:
        if stale not in pending:
            discard(stale)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.{owner()}-", suffix=".dir", dir=path.parent))
    os.chmod(staging, DIR_MODE)
    (staging / OWN_MARK).write_text(_OWN_MARK_TEXT)
    return staging


def check_folder_output(path: str | os.PathLike) -> Path:
    """The folder `atomic_dir` may replace whole at `path` (a symlink's target), or one line
    refusing it: never the working folder or one holding it, never a file, never a non-empty
    folder this tool did not write (no `OWN_MARK` in it)."""
    real = _real(path)
    cwd = Path.cwd().resolve()
    if real == cwd or real in cwd.parents:
        raise DataError(f"{path}: is the working folder or holds it; a folder output is replaced whole: name a new folder")
    if real.is_file():
        raise DataError(f"{path}: is a file; a folder output would replace it: name a new folder")
    if real.is_dir() and not (real / OWN_MARK).is_file() and any(real.iterdir()):
        raise DataError(f"{path}: exists and was not written by this tool (no {OWN_MARK} in it); "
                        "it would be replaced whole: name a new or empty folder, or remove it")
    return real


def _sync_filesystem(folder: Path) -> None:
    """Flush the file system holding `folder` and report a failed write-back (syncfs(2), which
    reports errors since Linux 5.8): one call, where an fsync per file would cost ~2 ms each
    (the demo's 10,800 frames: 20 s). Without syncfs, os.sync (which reports nothing)."""
    syncfs = getattr(_libc(), "syncfs", None)
    if syncfs is None:
        os.sync()
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        if syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(folder))
    finally:
        os.close(fd)


@functools.cache
def _libc():
    name = ctypes.util.find_library("c")
    return ctypes.CDLL(name, use_errno=True) if name else None


def _complete(tmp: Path, path: Path) -> None:
    """Make a written temporary durable before anything is renamed: fsync (a staging folder:
    its file system's sync), where a full disk that the writes themselves did not report
    (delayed allocation) shows up. The one step every output passes once (tests fake a full
    disk at its k-th call). Outside an output set (training state, a stage's scratch) the
    file is scratch and skips the sync."""
    if _PENDING.get() is None:
        return
    try:
        if tmp.is_dir():
            _sync_filesystem(tmp)
        elif tmp.is_file():
            fsync_file(tmp)
    except OSError as err:  # the failing temporary named, for `_named`
        raise OSError(err.errno, err.strerror or str(err), str(tmp)) from None


def _named(err: OSError, temps: list[Path], paths: list[Path]) -> OSError:
    """A disk-full `err` naming the output it failed on (pyarrow, zipfile and torch name the
    temporary, or nothing); other errors, and named ones, pass unchanged."""
    full = err.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) or "No space left" in str(err)
    if not full or any(str(p) in str(err) for p in paths):  # another error (a missing input): as it is
        return err
    if (err.strerror or "").startswith("cannot write "):  # named by an inner output's context (nested atomic_paths)
        return err
    failed = [p for tmp, p in zip(temps, paths) if err.filename is not None and str(tmp) == str(err.filename)]
    target = failed[0] if failed else paths[0] if len(paths) == 1 else ", ".join(map(str, paths))
    reason = err.strerror or (str(err).splitlines()[0] if str(err) else type(err).__name__)
    return OSError(err.errno, f"cannot write {target} ({reason}); the previous output is kept")


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; on success rename it over `path`.

    The rename is atomic on POSIX, so readers see either the old file or the whole
    new one. On an exception the temporary file is removed. The file gets the mode a plain
    `open()` would give it (0666 less the umask), not mkstemp's private 0600. Inside an
    `output_set` the rename waits for the whole set.
    """
    with atomic_paths(path) as (tmp,):
        yield tmp


@contextmanager
def atomic_paths(*paths: str | os.PathLike):
    """`atomic_path` for a set of outputs written together: yields their temporary paths and
    renames them only after every one was written, so a failure while writing (disk full,
    kill) leaves the whole old set, never new files beside old ones."""
    shown = [Path(p) for p in paths]
    paths = [_real(p) for p in paths]
    temps: list[Path] = []
    try:
        temps = [_temporary_beside(p) for p in paths]
        yield temps
        for tmp, path in zip(temps, paths):
            _complete(tmp, path)
    except BaseException as err:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise _named(err, temps, shown) from None
        raise
    pending = _PENDING.get()
    if pending is not None:  # the enclosing output set renames them with the rest
        pending.extend(zip(temps, paths))
        return
    publish_all(list(zip(temps, paths)), check_folder_output)


@contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a hidden staging folder beside `path`; on success swap it in for `path` whole.

    For outputs that are folders (the demo, the frame cache, the viewer, DVCLive's logs): the
    files inside are written plainly (the folder is the unit), and the previous folder is left
    whole by any failure before the swap; the staging folder is then removed (one a killed run
    left is removed by the next). The folder gets the mode mkdir() would give it. Inside an
    `output_set` the swap waits for the whole set.
    """
    shown = path
    path = check_folder_output(path)
    staging = None
    try:
        staging = _staging_beside(path)
        yield staging
        _complete(staging, path)
    except BaseException as err:
        if staging is not None:
            discard(staging)
        if isinstance(err, OSError):
            raise _named(err, [staging], [Path(shown)]) from None
        raise
    pending = _PENDING.get()
    if pending is not None:  # the enclosing output set swaps it in with the rest
        pending.append((staging, path))
        return
    publish_all([(staging, path)], check_folder_output)


@contextmanager
def output_set():
    """Every `atomic_path` / `atomic_paths` output written inside goes to a temporary, and all
    are renamed only when the block ends without an error; on an error every temporary is
    removed and the previous outputs are left whole (a stage's files stay one run's set: never
    a new submission.json beside last run's submission.xlsx). Nested sets join the outer one."""
    if _PENDING.get() is not None:
        yield
        return
    pending: list = []
    token = _PENDING.set(pending)
    try:
        yield
    except BaseException:
        for tmp, _ in pending:
            discard(tmp)
        raise
    finally:
        _PENDING.reset(token)
    publish_all(pending, check_folder_output)


@contextmanager
def outside_output_set():
    """Files published at once even inside an `output_set` (parts another step reads back)."""
    token = _PENDING.set(None)
    try:
        yield
    finally:
        _PENDING.reset(token)


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
