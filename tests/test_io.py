"""Atomic outputs and file names derived from data."""

from __future__ import annotations

import pytest

from vce.core.io import atomic_path, safe_file_name, write_json


def test_atomic_path_leaves_the_old_file_on_failure(tmp_path):
    target = tmp_path / "out.json"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text().strip().replace(" ", "").replace("\n", "") == '{"v":1}'
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_atomic_path_clears_temporaries_of_a_dead_run(tmp_path):
    stale = tmp_path / ".out.json.abc123.tmp"
    stale.write_text("from a killed run")
    write_json(tmp_path / "out.json", {"v": 2})
    assert not stale.exists()


@pytest.mark.parametrize("video_id,name", [
    ("ukdd_navi_00051", "ukdd_navi_00051"), ("12", "12"), ("../../etc/passwd", ".._.._etc_passwd"),
    ("..", "_.."), ("", "_"), ("a b/c", "a_b_c"),
])
def test_safe_file_name_never_leaves_the_folder(video_id, name):
    assert safe_file_name(video_id) == name
    assert "/" not in safe_file_name(video_id)


def test_outputs_get_the_mode_open_would_give_not_mkstemps_0600(tmp_path):
    import os
    import stat

    from vce.core.io import FILE_MODE

    write_json(tmp_path / "out.json", {"v": 1})
    (tmp_path / "plain").write_text("x")
    mode = stat.S_IMODE((tmp_path / "out.json").stat().st_mode)
    assert mode == stat.S_IMODE((tmp_path / "plain").stat().st_mode) == FILE_MODE
    umask = os.umask(0)
    os.umask(umask)
    assert FILE_MODE == 0o666 & ~umask and mode & 0o044 == 0o044 & ~umask  # readable by others


def test_a_failure_while_writing_a_set_leaves_the_whole_old_set(tmp_path):
    """Disk full half-way through: no new file beside old ones (the index's frames + test)."""
    from vce.core.io import atomic_paths

    first, second = tmp_path / "frames.parquet", tmp_path / "test.parquet"
    first.write_text("old frames")
    second.write_text("old test")
    with pytest.raises(OSError, match="No space"):
        with atomic_paths(first, second) as (tmp_first, tmp_second):
            tmp_first.write_text("new frames")
            raise OSError(28, "No space left on device")
    assert (first.read_text(), second.read_text()) == ("old frames", "old test")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["frames.parquet", "test.parquet"]
    with atomic_paths(first, second) as (tmp_first, tmp_second):
        tmp_first.write_text("new frames")
        tmp_second.write_text("new test")
    assert (first.read_text(), second.read_text()) == ("new frames", "new test")


# ----------------------------------------------------------------------------- folder outputs

def _folder(path, files: dict) -> None:
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)


def _contents(path) -> dict:
    return {str(p.relative_to(path)): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}


def test_atomic_dir_leaves_the_old_folder_whole_on_failure(tmp_path):
    """Mutations killed: writing into the folder itself, removing it before the block ends,
    leaving the staging folder behind."""
    from vce.core.io import atomic_dir

    out = tmp_path / "viewer"
    _folder(out, {"index.html": "old", "thumbs/a/1.jpg": "old thumb"})
    with pytest.raises(OSError, match=rf"cannot write {out} \(No space left on device\); the previous output is kept"):
        with atomic_dir(out) as staging:
            assert staging.parent == tmp_path and staging.name.startswith(".viewer.")
            _folder(staging, {"index.html": "new"})
            raise OSError(28, "No space left on device")
    assert _contents(out) == {"index.html": "old", "thumbs/a/1.jpg": "old thumb"}
    assert [p.name for p in tmp_path.iterdir()] == ["viewer"]
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as staging:
            raise RuntimeError("killed")
    assert _contents(out) == {"index.html": "old", "thumbs/a/1.jpg": "old thumb"}
    assert [p.name for p in tmp_path.iterdir()] == ["viewer"]


def test_atomic_dir_replaces_the_folder_whole_with_ordinary_modes(tmp_path):
    import stat

    from vce.core.io import DIR_MODE, FILE_MODE, atomic_dir

    out = tmp_path / "demo"
    _folder(out, {"stale.png": "from an earlier run", "galar/a.csv": "old"})
    with atomic_dir(out) as staging:
        _folder(staging, {"galar/a.csv": "new", "test/b.csv": "new"})
    assert _contents(out) == {"galar/a.csv": "new", "test/b.csv": "new"}  # no stale file survives
    assert [p.name for p in tmp_path.iterdir()] == ["demo"]  # no staging or trash folder left
    plain = tmp_path / "plain"
    plain.mkdir()
    assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE(plain.stat().st_mode) == DIR_MODE  # not mkdtemp's 0700
    assert stat.S_IMODE((out / "galar/a.csv").stat().st_mode) == FILE_MODE
    with atomic_dir(tmp_path / "new_folder") as staging:  # no previous folder
        _folder(staging, {"meta.json": "{}"})
    assert _contents(tmp_path / "new_folder") == {"meta.json": "{}"}


def test_atomic_dir_removes_staging_and_trash_folders_of_a_killed_run(tmp_path):
    from vce.core.io import atomic_dir

    out = tmp_path / "cache"
    _folder(out, {"meta.json": "old"})
    for stale in (".cache.k1ll3d.dir", ".cache.0badc0de.trash"):
        _folder(tmp_path / stale, {"pixels.npy": "half"})
    _folder(tmp_path / ".other.k1ll3d.dir", {"x": "another output's"})
    with atomic_dir(out) as staging:
        _folder(staging, {"meta.json": "new"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.k1ll3d.dir", "cache"]
    assert _contents(out) == {"meta.json": "new"}


def test_inside_an_output_set_the_swap_waits_for_the_set_end(tmp_path):
    """A folder is one output of the stage's set: a later failure keeps the old folder too."""
    from vce.core.io import atomic_dir, output_set

    out, report = tmp_path / "viewer", tmp_path / "report.md"
    _folder(out, {"index.html": "old"})
    report.write_text("old report")
    with pytest.raises(OSError, match="No space"):
        with output_set():
            with atomic_dir(out) as staging:
                _folder(staging, {"index.html": "new"})
            assert _contents(out) == {"index.html": "old"}  # not yet
            with atomic_path(report) as tmp:
                tmp.write_text("new report")
                raise OSError(28, "No space left on device")
    assert _contents(out) == {"index.html": "old"} and report.read_text() == "old report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "viewer"]
    with output_set():
        with atomic_dir(out) as staging:
            _folder(staging, {"index.html": "new"})
        write_json(report, {"v": 1})
        assert _contents(out) == {"index.html": "old"}
        with atomic_dir(out) as again:  # a second folder of the set beside: its pending staging is kept
            assert staging.is_dir()
            _folder(again, {"index.html": "newer"})
    assert _contents(out) == {"index.html": "newer"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "viewer"]
