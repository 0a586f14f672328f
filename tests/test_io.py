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
