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
