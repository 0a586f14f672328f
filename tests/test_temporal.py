import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import repo_params, section_params

from stages import temporal as temporal_stage
from stages import thresholds as thresholds_stage
from vce.core.labels import LABEL_INDEX, LABELS, NUM_LABELS
from vce.core.params import ParamsError, PostParams, from_dict
from vce.eval.frame_metrics import frame_metrics
from vce.infer.temporal import TemporalParams, build_sequences, refine, train_temporal
from vce.train.losses import LossParams

ROOT = Path(__file__).resolve().parents[1]

FAST = section_params(TemporalParams, "temporal", hidden=32, dilations=[1, 2, 4, 8], steps=120, batch_chunks=8,
                      chunk_frames=128, lr=3e-3)


def synthetic_videos(n_videos, n_frames, dim, seed, noise=2.5):
    """Labels that persist over consecutive frames; each frame's embedding = label signal + strong noise.

    Regions in anatomical order, plus 'blood' in runs of 10-30 frames. One frame alone is
    ambiguous; its neighbours share its labels.
    """
    rng = np.random.default_rng(seed)
    directions = np.random.default_rng(1234).normal(size=(NUM_LABELS, dim))  # shared across splits
    rows, labels, embeddings = [], [], []
    for v in range(n_videos):
        truth = np.zeros((n_frames, NUM_LABELS), np.uint8)
        cuts = np.sort(rng.choice(np.arange(20, n_frames - 20), size=2, replace=False))
        truth[: cuts[0], LABEL_INDEX["stomach"]] = 1
        truth[cuts[0] : cuts[1], LABEL_INDEX["small intestine"]] = 1
        truth[cuts[1] :, LABEL_INDEX["colon"]] = 1
        for start in rng.choice(n_frames - 30, size=3, replace=False):
            truth[start : start + rng.integers(10, 30), LABEL_INDEX["blood"]] = 1
        embeddings.append(truth @ directions + noise * rng.normal(size=(n_frames, dim)))
        labels.append(truth)
        rows.append(pd.DataFrame({"video_id": f"{seed}_{v}", "frame": np.arange(n_frames, dtype=np.int64) * 5}))
    frames = pd.concat(rows, ignore_index=True)
    return frames, np.concatenate(embeddings).astype(np.float32), np.concatenate(labels), directions


def frame_probs_of(embeddings, directions):
    """The raw per-frame probabilities: each label's projection of its own frame only."""
    return 1 / (1 + np.exp(-(embeddings @ directions.T) / np.linalg.norm(directions, axis=1)))


def test_temporal_refinement_beats_single_frames():
    train_frames, train_emb, train_labels, directions = synthetic_videos(6, 500, 16, seed=0)
    val_frames, val_emb, val_labels, _ = synthetic_videos(3, 500, 16, seed=1)
    train = build_sequences(train_frames, train_emb, labels=train_labels)
    val = build_sequences(val_frames, val_emb, labels=val_labels)
    model, losses = train_temporal(train, FAST, section_params(LossParams, "loss"), seed=0, device=torch.device("cpu"))
    refined = refine(model, val, torch.device("cpu"))
    raw = frame_metrics(val_labels, frame_probs_of(val_emb, directions))["map"]
    ours = frame_metrics(val_labels, refined)["map"]
    assert losses[-1] < losses[0]
    assert ours > raw + 0.1, (raw, ours)


def test_training_is_deterministic_from_the_seed():
    frames, emb, labels, _ = synthetic_videos(2, 200, 8, seed=3)
    seq = build_sequences(frames, emb, labels=labels)
    params = section_params(TemporalParams, "temporal", hidden=8, dilations=[1, 2], steps=5, chunk_frames=64)
    first = refine(train_temporal(seq, params, section_params(LossParams, "loss"), 7, torch.device("cpu"))[0], seq, torch.device("cpu"))
    second = refine(train_temporal(seq, params, section_params(LossParams, "loss"), 7, torch.device("cpu"))[0], seq, torch.device("cpu"))
    np.testing.assert_array_equal(first, second)


def test_params_are_checked():
    with pytest.raises(ParamsError, match="temporal.kernel_size"):
        from_dict(TemporalParams, {**repo_params()["temporal"], "kernel_size": 2}, "temporal")
    with pytest.raises(ParamsError, match="temporal.dilations"):
        from_dict(TemporalParams, {**repo_params()["temporal"], "dilations": []}, "temporal")
    with pytest.raises(ParamsError, match="^post.probs = 'video': must be one of 'frame' or 'temporal'$"):
        from_dict(PostParams, {"probs": "video"}, "post")


# ----------------------------------------------------------------------------- the stage


def write_embeddings(path, frames, embeddings):
    values = pa.FixedSizeListArray.from_arrays(pa.array(embeddings.astype(np.float16).reshape(-1)), embeddings.shape[1])
    pq.write_table(pa.table({"video_id": frames["video_id"].astype(str), "frame": frames["frame"], "embedding": values}), path)


def write_probs(path, frames, probs, valid):
    table = frames[["video_id", "frame"]].copy()
    for k, label in enumerate(LABELS):
        table[label] = probs[:, k].astype(np.float32)
    table["valid"] = valid
    table.to_parquet(path, index=False)


@pytest.fixture()
def workspace(tmp_path):
    """A split frame index, predict's probabilities and embeddings for train/val/test, params.yaml."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["temporal"].update(hidden=16, dilations=[1, 2, 4], steps=40, chunk_frames=128, device="cpu")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    predict = tmp_path / "predict"
    predict.mkdir()
    index = []
    for split, seed, n_videos in (("train", 0, 4), ("val", 1, 2), ("test", 2, 1)):
        frames, emb, labels, directions = synthetic_videos(n_videos, 300, 16, seed)
        valid = np.ones(len(frames), bool)
        valid[5] = False  # one undecodable frame
        probs = frame_probs_of(emb, directions)
        probs[~valid] = np.nan
        write_embeddings(predict / f"{split}_embeddings.parquet", frames, emb)
        write_probs(predict / f"{split}.parquet", frames, probs, valid)
        if split != "test":
            table = frames.copy()
            table["index"] = table.groupby("video_id").cumcount()
            table[list(LABELS)] = labels
            table["event_unit"] = "index"
            table["split"] = split
            index.append(table)
    pd.concat(index, ignore_index=True).to_parquet(tmp_path / "frames.parquet", index=False)
    return tmp_path


def run_stage(ws, out="temporal", metrics="temporal.json", predict="predict", params="params.yaml"):
    return temporal_stage.main(["--params", str(ws / params), "--predict-dir", str(ws / predict),
                                "--frames", str(ws / "frames.parquet"), "--out-dir", str(ws / out),
                                "--metrics", str(ws / metrics), "--route", str(ws / f"{out}_route.json"),
                                "--model-out", str(ws / f"{out}.pt")])


def test_stage_writes_the_probabilities_contract(workspace):
    assert run_stage(workspace) == 0
    metrics = json.loads((workspace / "temporal.json").read_text())
    assert metrics["enabled"] is True and metrics["train_frames"] == 1200
    assert 0 < metrics["frame_map"] <= 1 and 0 < metrics["input_frame_map"] <= 1
    for split, n in (("val", 600), ("test", 300)):
        table = pq.read_table(workspace / "temporal" / f"{split}.parquet")
        assert table.column_names == ["video_id", "frame", *LABELS, "valid"]
        assert table.schema.field("mouth").type == pa.float32() and table.num_rows == n
        probs = table.to_pandas()
        assert not probs["valid"].iloc[5] and np.isnan(probs["colon"].iloc[5])
        assert probs["valid"].sum() == n - 1
        assert probs.equals(probs.sort_values(["video_id", "frame"]).reset_index(drop=True))
    # Same seed, same bytes of probabilities.
    assert run_stage(workspace, out="again") == 0
    assert pd.read_parquet(workspace / "again" / "val.parquet").equals(pd.read_parquet(workspace / "temporal" / "val.parquet"))


def test_thresholds_stage_reads_the_temporal_probabilities(workspace):
    assert run_stage(workspace) == 0
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["post"]["probs"] = "temporal"
    (workspace / "temporal_params.yaml").write_text(yaml.safe_dump(params))
    assert thresholds_stage.main(["--params", str(workspace / "temporal_params.yaml"),
                                  "--predict-dir", str(workspace / "predict"),
                                  "--temporal-dir", str(workspace / "temporal"),
                                  "--frames", str(workspace / "frames.parquet"),
                                  "--out", str(workspace / "thresholds.json"),
                                  "--metrics", str(workspace / "thresholds_metrics.json")]) == 0
    report = json.loads((workspace / "thresholds_metrics.json").read_text())
    assert report["probs"] == "temporal"
    assert report["frame_map"] == pytest.approx(json.loads((workspace / "temporal.json").read_text())["frame_map"])


def test_stage_without_embeddings(workspace, capsys):
    for path in (workspace / "predict").glob("*_embeddings.parquet"):
        path.unlink()
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["post"]["probs"] = "frame"
    (workspace / "frame_params.yaml").write_text(yaml.safe_dump(params))
    assert run_stage(workspace, params="frame_params.yaml") == 0  # frame probabilities selected: empty outputs
    assert json.loads((workspace / "temporal.json").read_text())["enabled"] is False
    assert pq.read_table(workspace / "temporal" / "val.parquet").num_rows == 0
    params["post"]["probs"] = "temporal"
    (workspace / "temporal_params.yaml").write_text(yaml.safe_dump(params))
    assert run_stage(workspace, params="temporal_params.yaml") == 2
    assert re.search("post.probs is temporal.*predict.embeddings", capsys.readouterr().err)


@pytest.fixture()
def fold_workspace(workspace):
    """data/ensemble with 3 folds: every labelled video out of fold, train = val, a `fold` column."""
    frames = pd.read_parquet(workspace / "frames.parquet")
    videos = sorted(frames["video_id"].unique())
    frames["fold"] = frames["video_id"].map({v: k % 3 for k, v in enumerate(videos)}).astype(np.int64)
    frames["split"] = "val"
    frames.to_parquet(workspace / "frames.parquet", index=False)
    predict = workspace / "predict"
    for suffix in ("", "_embeddings"):
        both = pa.concat_tables([pq.read_table(predict / f"{s}{suffix}.parquet") for s in ("train", "val")])
        both = both.sort_by([("video_id", "ascending"), ("frame", "ascending")])
        for split in ("train", "val"):
            pq.write_table(both, predict / f"{split}{suffix}.parquet")
    return workspace


def test_folds_cross_fit_validation_and_train_the_test_model_on_every_video(fold_workspace):
    from vce.infer.temporal import select_videos
    from vce.infer.temporal_fit import load_split

    ws = fold_workspace
    assert run_stage(ws) == 0
    assert json.loads((ws / "temporal.json").read_text())["cross_fitted_folds"] == 3
    params = yaml.safe_load((ws / "params.yaml").read_text())
    tparams = from_dict(TemporalParams, params["temporal"], "temporal")
    lparams = from_dict(LossParams, params["loss"], "loss")
    frames = pd.read_parquet(ws / "frames.parquet")
    train = load_split(ws / "predict", "train", frames)
    val = pd.read_parquet(ws / "temporal" / "val.parquet")
    fold_of = frames.drop_duplicates("video_id").set_index("video_id")["fold"]
    seed, cpu = params["base"]["seed"], torch.device("cpu")
    full, _ = train_temporal(train, tparams, lparams, seed, cpu)
    for fold in range(3):
        held = set(fold_of.index[fold_of == fold])
        model, _ = train_temporal(select_videos(train, set(fold_of.index) - held), tparams, lparams, seed + 1 + fold, cpu)
        expected = refine(model, select_videos(train, held), cpu)
        got = val[val["video_id"].isin(held)][list(LABELS)].to_numpy()
        np.testing.assert_array_equal(got, expected)  # refined by the model that never saw these videos
        assert not np.allclose(np.nan_to_num(got), np.nan_to_num(refine(full, select_videos(train, held), cpu)))
    test = load_split(ws / "predict", "test", None)
    np.testing.assert_array_equal(pd.read_parquet(ws / "temporal" / "test.parquet")[list(LABELS)].to_numpy(),
                                  refine(full, test, cpu))


def test_overlapping_train_and_val_without_folds_is_an_error(fold_workspace, capsys):
    frames = pd.read_parquet(fold_workspace / "frames.parquet").drop(columns="fold")
    frames.to_parquet(fold_workspace / "frames.parquet", index=False)
    assert run_stage(fold_workspace) == 2
    assert "no two folds to cross-fit" in capsys.readouterr().err
