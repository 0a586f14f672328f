"""Fold fusion: AP as sklearn computes it, per-class weights, streamed fusion and concatenation."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.metrics import average_precision_score

from vce.core.contracts import embeddings_schema, probs_schema
from vce.core.errors import DataError
from vce.core.labels import LABELS
from vce.infer.detect import fusion_weights
from vce.infer.ensemble import class_weights, concat_parquet, frame_average_precision, fuse, fuse_embeddings


def probs_file(path, videos, frames, probs, valid=None, group=4):
    valid = np.ones(len(frames), bool) if valid is None else valid
    with pq.ParquetWriter(path, probs_schema()) as writer:
        for start in range(0, len(frames), group):
            sl = slice(start, start + group)
            columns = {"video_id": list(videos[sl]), "frame": frames[sl]}
            columns.update({label: probs[sl, k].astype(np.float32) for k, label in enumerate(LABELS)})
            columns["valid"] = valid[sl]
            writer.write_table(pa.Table.from_pydict(columns, schema=probs_schema()))
    return path


@pytest.mark.parametrize("seed", range(5))
def test_average_precision_equals_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    y = rng.random(500) < 0.1
    scores = np.round(rng.random(500), 1)  # many ties
    assert frame_average_precision(y, scores) == pytest.approx(average_precision_score(y, scores), abs=1e-12)
    assert frame_average_precision(np.zeros(5, bool), scores[:5]) is None


def test_ap_weights_follow_each_folds_ap_and_fall_back_to_equal():
    members = {"fold_0": {"per_class_ap": {label: 0.6 for label in LABELS}},
               "fold_1": {"per_class_ap": {label: 0.2 for label in LABELS}}}
    members["fold_1"]["per_class_ap"]["polyp"] = None  # fold 1 held out no polyp: no say
    for label in ("ulcer",):
        members["fold_0"]["per_class_ap"][label] = members["fold_1"]["per_class_ap"][label] = None
    weights = class_weights(members, "ap")
    k = LABELS.index
    np.testing.assert_allclose(weights[:, k("mouth")], [0.75, 0.25])
    np.testing.assert_allclose(weights[:, k("polyp")], [1.0, 0.0])
    np.testing.assert_allclose(weights[:, k("ulcer")], [0.5, 0.5])
    np.testing.assert_allclose(class_weights(members, "mean"), 0.5)


def test_fuse_weights_per_class_streams_row_groups_and_ands_validity(tmp_path):
    rng = np.random.default_rng(0)
    videos, frames = np.array(["a"] * 6 + ["b"] * 4), np.arange(10, dtype=np.int64)
    a, b = rng.random((10, 17)), rng.random((10, 17))
    valid_b = np.ones(10, bool)
    valid_b[3] = False
    paths = [probs_file(tmp_path / "a.parquet", videos, frames, a),
             probs_file(tmp_path / "b.parquet", videos, frames, b, valid_b)]
    weights = np.stack([np.linspace(0, 1, 17), 1 - np.linspace(0, 1, 17)])
    assert fuse(paths, weights, tmp_path / "fused.parquet") == 10
    fused = pd.read_parquet(tmp_path / "fused.parquet")
    np.testing.assert_allclose(fused[list(LABELS)], a * weights[0] + b * weights[1], rtol=1e-6)
    assert fused["valid"].tolist() == [i != 3 for i in range(10)]
    assert pq.ParquetFile(tmp_path / "fused.parquet").num_row_groups == 3  # 4 + 4 + 2, as written


def test_fuse_refuses_folds_that_predicted_different_frames(tmp_path):
    videos, probs = np.array(["a"] * 4), np.zeros((4, 17))
    paths = [probs_file(tmp_path / "a.parquet", videos, np.arange(4), probs),
             probs_file(tmp_path / "b.parquet", videos, np.arange(1, 5), probs)]
    with pytest.raises(DataError, match="differ in their frames .*rerun predict_test"):
        fuse(paths, np.full((2, 17), 0.5), tmp_path / "fused.parquet")
    assert not (tmp_path / "fused.parquet").exists()  # no partial output


def test_concat_keeps_rows_in_order_and_refuses_another_schema(tmp_path):
    first = probs_file(tmp_path / "1.parquet", np.array(["a"] * 5), np.arange(5), np.zeros((5, 17)))
    second = probs_file(tmp_path / "2.parquet", np.array(["b"] * 3), np.arange(3), np.ones((3, 17)))
    concat_parquet([first, second], tmp_path / "all.parquet")
    both = pd.read_parquet(tmp_path / "all.parquet")
    assert both["video_id"].tolist() == ["a"] * 5 + ["b"] * 3
    pq.write_table(pa.table({"video_id": ["c"]}), tmp_path / "other.parquet")
    with pytest.raises(DataError, match="schema differs"):
        concat_parquet([first, tmp_path / "other.parquet"], tmp_path / "bad.parquet")


def test_detect_uses_the_ensemble_weights_only_for_as_many_folds(tmp_path):
    path = tmp_path / "ensemble.json"
    path.write_text(json.dumps({"weights": {label: [0.7, 0.3] for label in LABELS}}))
    np.testing.assert_allclose(fusion_weights(path, 2)[:, 0], [0.7, 0.3])
    np.testing.assert_allclose(fusion_weights(path, 3), 1 / 3)  # other models: the mean
    np.testing.assert_allclose(fusion_weights(tmp_path / "none.json", 2), 0.5)


# ----------------------------------------------------------------------------- out-of-fold coverage


def _fold_dirs(tmp_path, held: dict, trained: dict, fold_in_file: dict | None = None):
    """Per fold a folder with val.parquet holding `held[fold]` and coverage.json naming `trained[fold]`."""
    dirs = {}
    for fold, videos in held.items():
        folder = tmp_path / f"fold_{fold}"
        folder.mkdir()
        pd.DataFrame({"video_id": videos}).to_parquet(folder / "val.parquet")
        coverage = {"fold": (fold_in_file or {}).get(fold, fold), "model": f"fold_{fold}/model.pt",
                    "model_train_videos": trained[fold]}
        (folder / "coverage.json").write_text(json.dumps(coverage))
        dirs[fold] = folder
    return dirs


INDEX = pd.DataFrame({"video_id": ["a", "b", "c", "d"], "fold": [0, 0, 1, 1]})


def test_coverage_of_complete_folds_is_each_folds_held_out_videos(tmp_path):
    from vce.infer.ensemble import check_coverage

    dirs = _fold_dirs(tmp_path, {0: ["a", "b"], 1: ["c", "d"]}, {0: ["c", "d"], 1: ["a", "b"]})
    assert check_coverage(INDEX, dirs, 2) == {0: ["a", "b"], 1: ["c", "d"]}


@pytest.mark.parametrize("case, message", [
    ("duplicate", r"video b is predicted by folds 0 and 1: every labelled video must be held out by one fold only"),
    ("fold_in_file", r"fold_1: predicts videos \['c', 'd'\]… for fold 0, but the split index has fold 1 hold out"),
    ("saw", r"fold 1's model \(fold_1/model.pt\) trained on held-out video\(s\) \['d'\]"),
    ("missing", r"1 labelled video\(s\) have no out-of-fold prediction, e.g. d"),
])
def test_coverage_refuses_what_is_not_out_of_fold_by_name(tmp_path, case, message):
    from vce.infer.ensemble import check_coverage

    index, held, trained, fold_in_file = INDEX.copy(), {0: ["a", "b"], 1: ["c", "d"]}, {0: ["c", "d"], 1: ["a", "b"]}, None
    if case == "duplicate":  # the index and fold 1's file both hold b
        index = pd.DataFrame({"video_id": ["a", "b", "b", "c", "d"], "fold": [0, 0, 1, 1, 1]})
        held[1] = ["b", "c", "d"]
        trained[1] = ["a"]
    elif case == "fold_in_file":
        fold_in_file = {1: 0}
    elif case == "saw":
        trained[1] = ["a", "b", "d"]
    elif case == "missing":  # fold 1 predicted c only, though the index says it holds out d too
        index = INDEX.assign(fold=[0, 0, 1, -1])
        held[1] = ["c"]
    with pytest.raises(DataError, match=message):
        check_coverage(index, _fold_dirs(tmp_path, held, trained, fold_in_file), 2)


def test_one_split_need_not_cover_every_labelled_video_and_a_missing_coverage_names_the_stage(tmp_path):
    from vce.infer.ensemble import check_coverage

    index = INDEX.assign(fold=[0, 0, -1, -1])  # one split: c and d train the model
    dirs = _fold_dirs(tmp_path, {0: ["a", "b"]}, {0: ["c", "d"]})
    assert check_coverage(index, dirs, 1) == {0: ["a", "b"]}
    with pytest.raises(DataError, match="no out-of-fold prediction"):
        check_coverage(index, dirs, 2)
    (dirs[0] / "coverage.json").unlink()
    with pytest.raises(DataError, match=r"coverage.json not found: run `python -m stages.predict --part labelled`"):
        check_coverage(index, dirs, 1)


def embeddings_file(path, videos, frames, vectors, group=4):
    """The embeddings contract, written in row groups of `group` rows."""
    dim = vectors.shape[1]
    with pq.ParquetWriter(path, embeddings_schema(dim)) as writer:
        for start in range(0, len(frames), group):
            sl = slice(start, start + group)
            values = pa.FixedSizeListArray.from_arrays(pa.array(vectors[sl].astype(np.float16).ravel()), dim)
            writer.write_table(pa.Table.from_arrays([pa.array(list(videos[sl])), pa.array(frames[sl]), values],
                                                    schema=embeddings_schema(dim)))
    return path


def test_fused_embeddings_are_the_mean_over_every_fold(tmp_path):
    # Three folds (with two, a divisor of 2 would pass): small integers, so float16 holds the
    # inputs and their mean exactly.
    rng = np.random.default_rng(0)
    videos, frames = np.array(["a"] * 6 + ["b"] * 4), np.arange(10, dtype=np.int64)
    folds = [rng.integers(-8, 9, (10, 5)) * 3.0 for _ in range(3)]  # sums divisible by 3
    paths = [embeddings_file(tmp_path / f"fold_{k}.parquet", videos, frames, v) for k, v in enumerate(folds)]
    fuse_embeddings(paths, tmp_path / "fused.parquet")
    fused = pd.read_parquet(tmp_path / "fused.parquet")
    assert fused["video_id"].tolist() == list(videos) and fused["frame"].tolist() == list(frames)
    np.testing.assert_array_equal(np.stack(fused["embedding"]), sum(folds) / 3)
    assert pq.ParquetFile(tmp_path / "fused.parquet").num_row_groups == 3
