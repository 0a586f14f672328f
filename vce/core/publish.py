"""Publishing a finished output set, all or nothing against a failed rename and a kill, and
finishing what a killed run left (`vce.core.io` writes the sets; this module renames them in).

Publishing a set (`publish_all`) is all or nothing, against a failed rename and a kill:
  1. a journal listing every (temporary, output) pair is written beside each output's folder;
     the copy in the first folder, renamed into place last, is the commit point;
  2. each old output is kept aside (a file: a hard link `.<name>.<token>.old`; a folder: renamed
     to `.<name>.<token>.trash`), then the temporary is renamed over it;
  3. a failed rename puts back every old output already replaced and removes the temporaries;
  4. the kept old outputs and the journal copies are removed.
A run killed after 1 is rolled forward by the next write into any of those folders (`recover`:
the temporaries still there are renamed in); killed before, its temporaries are stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable
from pathlib import Path

# The process umask, read once (os.umask can only be read by setting it).
_UMASK = os.umask(0o022)
os.umask(_UMASK)
FILE_MODE = 0o666 & ~_UMASK  # what open() would give a new file; mkstemp's own is 0600
DIR_MODE = 0o777 & ~_UMASK  # what mkdir() would give a new folder; mkdtemp's own is 0700

_JOURNAL_GLOB = ".vce-publish.*.journal"


def _journal_path(folder: Path, token: str) -> Path:
    return folder / f".vce-publish.{token}.journal"


def _aside(path: Path, token: str, folder: bool) -> Path:
    return path.with_name(f".{path.name}.{token}.{'trash' if folder else 'old'}")


def fsync_file(path: Path) -> None:
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
        fsync_file(copy)
    part = copies[0].with_name(copies[0].name + ".part")
    part.write_text(text)
    fsync_file(part)
    os.rename(part, copies[0])
    fsync_file(folders[0])
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
        discard(path)


def _finish(pairs: list[tuple[Path, Path]], token: str, copies: list[Path]) -> None:
    """Step 4: the kept old outputs and the journal copies removed."""
    for tmp, path in pairs:
        discard(_aside(path, token, folder=tmp.suffix == ".dir"))
    for copy in copies:
        copy.unlink(missing_ok=True)


def publish_all(pairs: list[tuple[Path, Path]], check_folder: Callable[[Path], object]) -> None:
    """Rename a finished set into place, all or nothing (the steps above). One file is one
    atomic rename and needs no journal."""
    latest = {path: tmp for tmp, path in pairs}  # an output written twice in the set: the last one
    for tmp, path in pairs:
        if latest[path] != tmp:
            discard(tmp)
    pairs = [(tmp, path) for path, tmp in latest.items()]
    if not pairs:
        return
    if len(pairs) == 1 and not pairs[0][0].is_dir():
        tmp, path = pairs[0]
        try:
            os.chmod(tmp, FILE_MODE)
            os.replace(tmp, path)
        except BaseException:
            discard(tmp)
            raise
        return
    token = secrets.token_hex(4)
    try:
        for tmp, path in pairs:  # a folder the user put there since the set began is still not replaced
            if tmp.is_dir():
                check_folder(path)
        copies = _write_journal(pairs, token)
    except BaseException:
        for tmp, _ in pairs:
            discard(tmp)
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
            discard(tmp)
            discard(_aside(path, token, folder=tmp.suffix == ".dir"))
        _journal_path(pairs[0][1].parent, token).unlink(missing_ok=True)  # uncommitted first
        _finish(pairs, token, copies)
        raise
    _finish(pairs, token, copies)


def recover(folder: Path) -> None:
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
        if writer != os.getpid() and alive(writer):
            continue
        token = copies[0].name.split(".")[2]
        if copies[0].exists():  # committed: every temporary still there goes in
            for tmp, path in pairs:
                if tmp.exists():
                    _put(tmp, path, token)
        else:
            for tmp, _ in pairs:
                discard(tmp)
        _finish(pairs, token, [*copies, copies[0].with_name(copies[0].name + ".part")])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def discard(tmp: Path) -> None:
    """Remove a temporary file or staging folder, if it is there."""
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)


def owner() -> str:
    """The tag of this process in the names of its temporaries and staging folders: its host
    (hashed) and pid, so a later run can tell one whose writer died (`sweep`)."""
    return f"{hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]}-{os.getpid()}"


_TAGGED = re.compile(r"^\..+\.(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[^.]+\.(tmp|dir)$")


def sweep(folder: Path, pending: set) -> None:
    """Remove the temporaries and staging folders in `folder` whose writer, on this host, is
    dead (a killed run's; e.g. `data/.demo.<x>.dir`, 10,812 files, which nothing else removes
    when DVC restores `data/demo` from its run cache). Those of a live writer are kept."""
    host = owner().split("-")[0]
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        match = _TAGGED.match(entry.name)
        if match and match["host"] == host and Path(entry.path) not in pending and not alive(int(match["pid"])):
            discard(Path(entry.path))
