"""Atomic outputs: a killed or failed stage never leaves a file or folder that looks complete."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

from vce.core.errors import DataError

# The process umask, read once (os.umask can only be read by setting it).
_UMASK = os.umask(0o022)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK  # what open() would give a new file; mkstemp's own is 0600
DIR_MODE = 0o777 & ~_UMASK  # what mkdir() would give a new folder; mkdtemp's own is 0700


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


def _owner() -> str:
    """The tag of this process in the names of its temporaries and staging folders: its host
    (hashed) and pid, so a later run can tell one whose writer died (`_sweep`)."""
    return f"{hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]}-{os.getpid()}"


_TAGGED = re.compile(r"^\..+\.(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[^.]+\.(tmp|dir)$")


def _sweep(folder: Path) -> None:
    """Remove the temporaries and staging folders in `folder` whose writer, on this host, is
    dead (a killed run's; e.g. `data/.demo.<x>.dir`, 10,812 files, which nothing else removes
    when DVC restores `data/demo` from its run cache). Those of a live writer are kept."""
    host = _owner().split("-")[0]
    pending = {tmp for tmp, _ in _PENDING.get() or []}
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        match = _TAGGED.match(entry.name)
        if match and match["host"] == host and Path(entry.path) not in pending and not _alive(int(match["pid"])):
            _discard(Path(entry.path))


def _tidy(folder: Path) -> None:
    """Before writing into `folder`: finish a killed publish there, and sweep what dead writers
    left in it and in the folder above (where a folder output's staging lies beside it)."""
    for where in (folder, folder.parent):
        _recover(where)
        _sweep(where)


def _temporary_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    _tidy(path.parent)
    pending = {tmp for tmp, _ in _PENDING.get() or []}
    for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a killed run
        if stale not in pending:
            stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{_owner()}-", suffix=".tmp", dir=path.parent)
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
            _discard(stale)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.{_owner()}-", suffix=".dir", dir=path.parent))
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


def _discard(tmp: Path) -> None:
    """Remove a temporary file or staging folder, if it is there."""
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


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
            _fsync_file(tmp)
    except OSError as err:  # the failing temporary named, for `_named`
        raise OSError(err.errno, err.strerror or str(err), str(tmp)) from None


# Publishing a set (`_publish_all`) is all or nothing, against a failed rename and a kill:
#   1. a journal listing every (temporary, output) pair is written beside each output's folder;
#      the copy in the first folder, renamed into place last, is the commit point;
#   2. each old output is kept aside (a file: a hard link `.<name>.<token>.old`; a folder: renamed
#      to `.<name>.<token>.trash`), then the temporary is renamed over it;
#   3. a failed rename puts back every old output already replaced and removes the temporaries;
#   4. the kept old outputs and the journal copies are removed.
# A run killed after 1 is rolled forward by the next write into any of those folders (`_recover`:
# the temporaries still there are renamed in); killed before, its temporaries are stale.
_JOURNAL_GLOB = ".vce-publish.*.journal"


def _journal_path(folder: Path, token: str) -> Path:
    return folder / f".vce-publish.{token}.journal"


def _aside(path: Path, token: str, folder: bool) -> Path:
    return path.with_name(f".{path.name}.{token}.{'trash' if folder else 'old'}")


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_journal(pairs: list[tuple[Path, Path]], token: str) -> list[Path]:
    """Step 1: the journal copies, the first one (the commit point) written last."""
    folders = list(dict.fromkeys(path.parent for _, path in pairs))
    copies = [_journal_path(folder, token) for folder in folders]
    text = json.dumps({"pairs": [[str(tmp), str(path)] for tmp, path in pairs],
                       "copies": [str(c) for c in copies], "pid": os.getpid()})
    for copy in copies[1:]:
        copy.write_text(text)
        _fsync_file(copy)
    part = copies[0].with_name(copies[0].name + ".part")
    part.write_text(text)
    _fsync_file(part)
    os.rename(part, copies[0])
    _fsync_file(folders[0])
    return copies


def _put(tmp: Path, path: Path, token: str) -> None:
    """Step 2 for one pair: the old output aside, the temporary in its place."""
    if tmp.is_dir():  # two renames: POSIX cannot rename a folder over a non-empty one
        aside = None
        if path.exists() or path.is_symlink():
            aside = _aside(path, token, folder=True)
            os.rename(path, aside)
        try:
            os.rename(tmp, path)
        except BaseException:
            if aside is not None:
                os.rename(aside, path)
            raise
        return
    if path.is_file():
        _aside(path, token, folder=False).unlink(missing_ok=True)  # a killed run's, of this set
        try:
            os.link(path, _aside(path, token, folder=False))
        except OSError:  # a file system without hard links: a copy
            shutil.copy2(path, _aside(path, token, folder=False))
    os.chmod(tmp, FILE_MODE)  # a writer may have replaced the file: set the mode on what is there
    os.replace(tmp, path)


def _put_back(tmp: Path, path: Path, token: str) -> None:
    """Step 3 for one pair already put: the old output back (or none, as before)."""
    old = _aside(path, token, folder=tmp.suffix == ".dir")
    if old.is_dir() and not old.is_symlink():
        os.rename(path, tmp)
        os.rename(old, path)
    elif old.exists():
        os.replace(old, path)
    else:
        _discard(path)


def _finish(pairs: list[tuple[Path, Path]], token: str, copies: list[Path]) -> None:
    """Step 4: the kept old outputs and the journal copies removed."""
    for tmp, path in pairs:
        _discard(_aside(path, token, folder=tmp.suffix == ".dir"))
    for copy in copies:
        copy.unlink(missing_ok=True)


def _publish_all(pairs: list[tuple[Path, Path]]) -> None:
    """Rename a finished set into place, all or nothing (the steps above). One file is one
    atomic rename and needs no journal."""
    latest = {path: tmp for tmp, path in pairs}  # an output written twice in the set: the last one
    for tmp, path in pairs:
        if latest[path] != tmp:
            _discard(tmp)
    pairs = [(tmp, path) for path, tmp in latest.items()]
    if not pairs:
        return
    if len(pairs) == 1 and not pairs[0][0].is_dir():
        tmp, path = pairs[0]
        try:
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, path)
        except BaseException:
            _discard(tmp)
            raise
        return
    token = secrets.token_hex(4)
    try:
        for tmp, path in pairs:  # a folder the user put there since the set began is still not replaced
            if tmp.is_dir():
                check_folder_output(path)
        copies = _write_journal(pairs, token)
    except BaseException:
        for tmp, _ in pairs:
            _discard(tmp)
        for folder in dict.fromkeys(path.parent for _, path in pairs):
            for copy in folder.glob(f".vce-publish.{token}.journal*"):
                copy.unlink(missing_ok=True)
        raise
    done: list[tuple[Path, Path]] = []
    try:
        for tmp, path in pairs:
            _put(tmp, path, token)
            done.append((tmp, path))
    except BaseException:
        for tmp, path in reversed(done):
            _put_back(tmp, path, token)
        for tmp, path in pairs:
            _discard(tmp)
            _discard(_aside(path, token, folder=tmp.suffix == ".dir"))
        _journal_path(pairs[0][1].parent, token).unlink(missing_ok=True)  # uncommitted first
        _finish(pairs, token, copies)
        raise
    _finish(pairs, token, copies)


def _recover(folder: Path) -> None:
    """Finish what a killed run's publish left in `folder`: a set whose commit point (the first
    journal copy) exists is rolled forward; one killed before it is dropped (its temporaries
    removed). A set whose writer is still running is left alone."""
    for copy in list(folder.glob(_JOURNAL_GLOB + "*")):
        try:
            journal = json.loads(copy.read_text())
            pairs = [(Path(tmp), Path(path)) for tmp, path in journal["pairs"]]
            copies, writer = [Path(c) for c in journal["copies"]], int(journal["pid"])
        except (OSError, ValueError, KeyError, TypeError):  # a copy cut short by the kill
            copy.unlink(missing_ok=True)
            continue
        if writer != os.getpid() and _alive(writer):
            continue
        token = copies[0].name.split(".")[2]
        if copies[0].exists():  # committed: every temporary still there goes in
            for tmp, path in pairs:
                if tmp.exists():
                    _put(tmp, path, token)
        else:
            for tmp, _ in pairs:
                _discard(tmp)
        _finish(pairs, token, [*copies, copies[0].with_name(copies[0].name + ".part")])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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
    _publish_all(list(zip(temps, paths)))


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
            _discard(staging)
        if isinstance(err, OSError):
            raise _named(err, [staging], [Path(shown)]) from None
        raise
    pending = _PENDING.get()
    if pending is not None:  # the enclosing output set swaps it in with the rest
        pending.append((staging, path))
        return
    _publish_all([(staging, path)])


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
            _discard(tmp)
        raise
    finally:
        _PENDING.reset(token)
    _publish_all(pending)


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
