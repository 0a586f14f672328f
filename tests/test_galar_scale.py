"""bench.galar_scale's tree: real Galar timelines the index reads back, written once (resumable)."""

from __future__ import annotations

import os

import pandas as pd
import yaml
from conftest import ROOT, load_stage

from bench.galar_scale import build_tree, galar_timelines, subsample
from vce.core.labels import LABELS


def test_subsample_keeps_the_anatomy_order_and_the_length_asked():
    _, labels = galar_timelines(1)[0]
    small = subsample(labels, 0.01)
    assert len(small) == round(len(labels) * 0.01)
    regions = [LABELS.index(r) for r in ("stomach", "small intestine", "colon")]
    first = [int(small[:, k].argmax()) for k in regions]
    assert first == sorted(first)  # stomach before small intestine before colon


def test_tree_is_indexed_whole_and_a_rerun_writes_nothing(tmp_path, fixtures_dir):
    tree = tmp_path / "tree"
    counts = build_tree(tree, 2, 0.005, 0.0003)
    frame_files = sorted(str(p) for p in tree.rglob("*") if p.suffix.lower() == ".png")
    stamps = {p: os.stat(p).st_ino for p in frame_files}
    assert build_tree(tree, 2, 0.005, 0.0003) == counts
    assert {p: os.stat(p).st_ino for p in frame_files} == stamps  # no frame relinked
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["data"].update(root=str(tree / "galar"), test_root=str(tree / "test"))
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert load_stage("index").main(["--params", str(tmp_path / "params.yaml"),
                                     "--frames-out", str(tmp_path / "f.parquet"), "--test-out", str(tmp_path / "t.parquet"),
                                     "--report", str(tmp_path / "r.json")]) == 0
    frames, test = pd.read_parquet(tmp_path / "f.parquet"), pd.read_parquet(tmp_path / "t.parquet")
    assert len(frames) == counts["frames"] and frames["video_id"].nunique() == 2
    assert len(test) == counts["test_frames"] and test["video_id"].nunique() == 3
    assert frames[list(LABELS)].to_numpy().any()  # the real timelines, not empty labels
