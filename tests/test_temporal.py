import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from conftest import repo_params, route_rule_of, section_params

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
    with pytest.raises(ParamsError, match="^post.probs = 'video': must be one of 'frame', 'temporal' or 'auto'$"):
        from_dict(PostParams, {"probs": "video"}, "post")
    with pytest.raises(ParamsError, match="^temporal.cross_fit = 1: must be >= 2"):
        from_dict(TemporalParams, {**repo_params()["temporal"], "cross_fit": 1}, "temporal")


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
    # the validation videos only (2 x 300 frames), never the 4 training videos' in-sample embeddings
    assert metrics["enabled"] is True and metrics["train_frames"] == 600 and metrics["train_videos"] == 2
    assert metrics["cross_fit"]["scheme"] == "validation_groups"
    assert sorted(metrics["cross_fit"]["groups"]) == [["1_0"], ["1_1"]]  # min(2 videos, cross_fit 3) groups
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


@pytest.mark.parametrize("source", ["temporal", "auto"])
def test_thresholds_stage_reads_the_temporal_stages_probabilities(workspace, source):
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["post"]["probs"] = source
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    assert run_stage(workspace) == 0
    (workspace / "temporal_params.yaml").write_text(yaml.safe_dump(params))
    assert thresholds_stage.main(["--params", str(workspace / "temporal_params.yaml"),
                                  "--predict-dir", str(workspace / "predict"),
                                  "--temporal-dir", str(workspace / "temporal"),
                                  "--frames", str(workspace / "frames.parquet"),
                                  "--out", str(workspace / "thresholds.json"),
                                  "--metrics", str(workspace / "thresholds_metrics.json")]) == 0
    report = json.loads((workspace / "thresholds_metrics.json").read_text())
    assert report["probs"] == source == json.loads((workspace / "thresholds.json").read_text())["probs"]
    # thresholds tuned on what data/temporal holds: the model's own (temporal), each label's route (auto)
    assert report["frame_map"] == pytest.approx(frame_metrics(
        pd.read_parquet(workspace / "frames.parquet").query("split == 'val'").sort_values(["video_id", "frame"])[
            list(LABELS)].to_numpy(), pd.read_parquet(workspace / "temporal" / "val.parquet")[list(LABELS)].to_numpy())["map"])


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
    assert re.search("post.probs = 'temporal' is refused: no frame embeddings.*predict.embeddings", capsys.readouterr().err)


def test_frame_probabilities_fit_no_temporal_model(workspace, capsys):
    """`dvc exp run -S post.probs=frame` ("no temporal model", README) still fitted one: minutes
    of the demo's experiments for outputs nothing read. With embeddings present, the stage now
    writes the empty contract files, no model and the reason, and nothing is fitted."""
    from vce.infer.temporal import load_routes, load_temporal

    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["post"]["probs"] = "frame"
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    assert run_stage(workspace) == 0
    metrics = json.loads((workspace / "temporal.json").read_text())
    assert metrics == {"enabled": False, "reason": metrics["reason"]} and "post.probs: frame" in metrics["reason"]
    assert "train_frames" not in metrics  # what a fit writes
    for split in ("val", "test"):
        assert pq.read_table(workspace / "temporal" / f"{split}.parquet").num_rows == 0
    assert load_temporal(workspace / "temporal.pt") is None
    assert set(load_routes(workspace / "temporal.pt").values()) == {"frame"}
    assert "disabled, post.probs: frame" in capsys.readouterr().out


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
    from vce.infer.temporal import sequences_of_videos
    from vce.infer.temporal_fit import load_split

    ws = fold_workspace
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["post"]["probs"] = "temporal"  # data/temporal: the model's own probabilities
    (ws / "params.yaml").write_text(yaml.safe_dump(params))
    assert run_stage(ws) == 0
    assert json.loads((ws / "temporal.json").read_text())["cross_fit"]["scheme"] == "folds"
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
        model, _ = train_temporal(sequences_of_videos(train, set(fold_of.index) - held), tparams, lparams, seed + 1 + fold, cpu)
        expected = refine(model, sequences_of_videos(train, held), cpu)
        got = val[val["video_id"].isin(held)][list(LABELS)].to_numpy()
        np.testing.assert_array_equal(got, expected)  # refined by the model that never saw these videos
        assert not np.allclose(np.nan_to_num(got), np.nan_to_num(refine(full, sequences_of_videos(train, held), cpu)))
    test = load_split(ws / "predict", "test", None)
    np.testing.assert_array_equal(pd.read_parquet(ws / "temporal" / "test.parquet")[list(LABELS)].to_numpy(),
                                  refine(full, test, cpu))


# ----------------------------------------------------------------------------- nothing in-sample


def fit(ws, frames=None, **temporal):
    """`fit_temporal` on a workspace with its params (temporal overrides), on the CPU."""
    from vce.infer.temporal_fit import fit_temporal

    params = yaml.safe_load((ws / "params.yaml").read_text())
    tparams = from_dict(TemporalParams, {**params["temporal"], **temporal}, "temporal")
    frames = pd.read_parquet(ws / "frames.parquet") if frames is None else frames
    return fit_temporal(ws / "predict", frames, tparams, from_dict(LossParams, params["loss"], "loss"),
                        params["base"]["seed"], torch.device("cpu")), tparams, params


def assert_out_of_sample(fitted, labelled):
    """Every refined labelled video came from a model that did not train on it; only validation videos train."""
    refined = set(fitted.val.frames["video_id"]) | set(fitted.test.frames["video_id"])
    assert refined <= set(fitted.provenance)
    for video in refined:
        assert video not in fitted.provenance[video], video
        assert fitted.provenance[video] <= set(fitted.val.frames["video_id"])
    assert set(labelled) <= refined


def test_one_split_trains_on_validation_only_each_video_refined_by_a_model_that_never_saw_it(workspace):
    from vce.infer.temporal import sequences_of_videos

    frames = pd.read_parquet(workspace / "frames.parquet")
    (fitted, tparams, params), cpu = fit(workspace), torch.device("cpu")
    val_videos = sorted(frames.query("split == 'val'")["video_id"].unique())
    assert_out_of_sample(fitted, val_videos)
    assert not set(frames.query("split == 'train'")["video_id"]) & set().union(*fitted.provenance.values())
    lparams, seed = from_dict(LossParams, params["loss"], "loss"), params["base"]["seed"]
    for g, held in enumerate(fitted.metrics["cross_fit"]["groups"]):  # the provenance is what happened
        model, _ = train_temporal(sequences_of_videos(fitted.val, set(fitted.provenance[held[0]])), tparams, lparams,
                                  seed + 1 + g, cpu)
        rows = fitted.val.frames["video_id"].isin(held).to_numpy()
        np.testing.assert_array_equal(fitted.val_probs[rows], refine(model, sequences_of_videos(fitted.val, set(held)), cpu))
    full, _ = train_temporal(fitted.val, tparams, lparams, seed, cpu)  # test: the model of every validation video
    np.testing.assert_array_equal(fitted.test_probs, refine(full, fitted.test, cpu))
    assert not np.allclose(np.nan_to_num(fitted.val_probs), np.nan_to_num(refine(full, fitted.val, cpu)))


def test_folds_provenance_is_out_of_sample(fold_workspace):
    frames = pd.read_parquet(fold_workspace / "frames.parquet")
    fitted, _, _ = fit(fold_workspace, steps=5)
    assert_out_of_sample(fitted, frames["video_id"].unique())
    fold_of = frames.drop_duplicates("video_id").set_index("video_id")["fold"]
    for video, trained_on in fitted.provenance.items():
        if video in fold_of:  # k-fold: a video's model trained on every other fold, none of its own
            assert trained_on == set(fold_of.index[fold_of != fold_of[video]])


@pytest.fixture()
def identity_workspace(tmp_path):
    """12 validation videos whose embeddings carry only the video's identity (a random offset) and
    whose `blood` label is a function of that identity alone: nothing generalises across videos."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["temporal"].update(hidden=16, dilations=[1, 2], steps=80, chunk_frames=64, lr=3e-3, device="cpu",
                              cross_fit=4)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    rng = np.random.default_rng(5)
    rows = [pd.DataFrame({"video_id": f"v{v:02d}", "frame": np.arange(60, dtype=np.int64)}) for v in range(12)]
    frames = pd.concat(rows, ignore_index=True)
    offsets = 3.0 * rng.normal(size=(12, 8))
    video = frames["video_id"].str[1:].astype(int).to_numpy()
    embeddings = (offsets[video] + 0.3 * rng.normal(size=(len(frames), 8))).astype(np.float32)
    labels = np.zeros((len(frames), NUM_LABELS), np.uint8)
    labels[:, LABEL_INDEX["blood"]] = video % 2
    (tmp_path / "predict").mkdir()
    for split, keep in (("val", slice(None)), ("test", slice(0, 60))):
        write_embeddings(tmp_path / "predict" / f"{split}_embeddings.parquet", frames[keep], embeddings[keep])
        write_probs(tmp_path / "predict" / f"{split}.parquet", frames[keep], np.full((len(frames[keep]), NUM_LABELS), 0.5),
                    np.ones(len(frames[keep]), bool))
    table = frames.assign(index=frames["frame"], event_unit="index", split="val")
    table[list(LABELS)] = labels
    table.to_parquet(tmp_path / "frames.parquet", index=False)
    return tmp_path, labels


def test_a_label_that_only_names_the_video_is_reproduced_in_sample_but_not_cross_fitted(identity_workspace):
    """The behaviour the provenance rules out: an in-sample temporal model memorises which video is
    which (blood AP ~1); the cross-fitted outputs cannot, so they stay near chance (prevalence 0.5)."""
    from sklearn.metrics import average_precision_score

    ws, labels = identity_workspace
    fitted, tparams, params = fit(ws)
    blood = LABEL_INDEX["blood"]
    in_sample, _ = train_temporal(fitted.val, tparams, from_dict(LossParams, params["loss"], "loss"),
                                  params["base"]["seed"], torch.device("cpu"))
    memorised = average_precision_score(labels[:, blood], refine(in_sample, fitted.val, torch.device("cpu"))[:, blood])
    cross_fitted = average_precision_score(labels[:, blood], fitted.val_probs[:, blood])
    assert memorised > 0.95 and cross_fitted < 0.75, (memorised, cross_fitted)
    assert len(fitted.metrics["cross_fit"]["groups"]) == 4


def test_one_validation_video_refuses_temporal_and_auto_falls_back_to_frame(workspace, capsys):
    frames = pd.read_parquet(workspace / "frames.parquet")
    frames.loc[frames["video_id"] == "1_1", "split"] = "train"  # one validation video left
    frames.to_parquet(workspace / "frames.parquet", index=False)
    predict = workspace / "predict"
    for suffix in ("", "_embeddings"):
        table = pq.read_table(predict / f"val{suffix}.parquet")
        pq.write_table(table.filter(pa.compute.equal(table["video_id"], "1_0")), predict / f"val{suffix}.parquet")
    params = yaml.safe_load((workspace / "params.yaml").read_text())
    params["post"]["probs"] = "temporal"
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    assert run_stage(workspace) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: post.probs = 'temporal' is refused: 1 validation video(s) ['1_0']") and err.count("\n") == 1
    params["post"]["probs"] = "auto"
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    assert run_stage(workspace) == 0
    route = json.loads((workspace / "temporal_route.json").read_text())
    assert set(route["routes"].values()) == {"frame"} and "1 validation video" in route["reason"]
    for split in ("val", "test"):  # what thresholds, events and report read: the frame model's probabilities
        assert pd.read_parquet(workspace / "temporal" / f"{split}.parquet").equals(pd.read_parquet(predict / f"{split}.parquet"))
    from vce.infer.temporal import load_routes, load_temporal
    assert load_temporal(workspace / "temporal.pt") is None and set(load_routes(workspace / "temporal.pt").values()) == {"frame"}


# ----------------------------------------------------------------------------- the route


def test_auto_writes_each_labels_route_and_is_never_worse_than_frame_on_the_evidence(workspace):
    from vce.infer.route import blend
    from vce.infer.temporal import load_routes

    params = yaml.safe_load((workspace / "params.yaml").read_text())
    # The plain rule (any AP gain moves a label): the tiny fit's gains are too small for the default
    # margin, and this test is about what the stage writes for each route (tests/test_route.py: the rule).
    params["post"].update(probs="auto", route_min_gain=0.0, route_replicates=0, route_regions_together=False,
                          route_min_positive_blocks=1)
    (workspace / "params.yaml").write_text(yaml.safe_dump(params))
    assert run_stage(workspace) == 0
    route = json.loads((workspace / "temporal_route.json").read_text())
    assert route["post_probs"] == "auto" and route["reason"] is None and "cross-fitted" in route["evidence"]
    assert list(route["routes"]) == list(LABELS) and load_routes(workspace / "temporal.pt") == route["routes"]
    assert sum(route["counts"].values()) == NUM_LABELS and route["counts"]["temporal"] + route["counts"]["blend"] > 0
    fitted, _, _ = fit(workspace)
    frame = pd.read_parquet(workspace / "predict" / "val.parquet")[list(LABELS)].to_numpy()
    written = pd.read_parquet(workspace / "temporal" / "val.parquet")[list(LABELS)].to_numpy()
    candidates = {"frame": frame, "temporal": fitted.val_probs, "blend": blend(frame, fitted.val_probs)}
    for k, label in enumerate(LABELS):  # each column is its route's cross-fitted probabilities
        np.testing.assert_array_equal(written[:, k], candidates[route["routes"][label]][:, k])
        evidence = route["per_label"][label]
        if evidence["frame_ap"] is not None:
            chosen = evidence[f"{route['routes'][label]}_ap"]
            assert chosen == max(evidence[f"{r}_ap"] for r in candidates) and chosen >= evidence["frame_ap"]
        else:
            assert route["routes"][label] == "frame"
    test = pd.read_parquet(workspace / "temporal" / "test.parquet")[list(LABELS)].to_numpy()
    frame_test = pd.read_parquet(workspace / "predict" / "test.parquet")[list(LABELS)].to_numpy()
    for k, label in enumerate(LABELS):
        expected = {"frame": frame_test, "temporal": fitted.test_probs, "blend": blend(frame_test, fitted.test_probs)}
        np.testing.assert_array_equal(test[:, k], expected[route["routes"][label]][:, k])


def test_choose_routes_takes_the_best_ap_and_gives_ties_and_empty_labels_to_frame():
    from vce.infer.route import choose_routes, mix

    rng = np.random.default_rng(0)
    labels = np.zeros((400, NUM_LABELS), np.uint8)
    labels[:, :4] = rng.random((400, 4)) < 0.3  # labels 0-3 have positives, the rest none
    truth = labels.astype(float)
    frame = rng.random((400, NUM_LABELS))
    temporal = frame.copy()
    frame[:, 0], temporal[:, 0] = truth[:, 0] + rng.normal(0, 2, 400), truth[:, 0] + rng.normal(0, 0.3, 400)
    frame[:, 1], temporal[:, 1] = truth[:, 1] + rng.normal(0, 0.3, 400), truth[:, 1] + rng.normal(0, 2, 400)
    frame[:, 2], temporal[:, 2] = (truth[:, 2] + rng.normal(0, 0.8, 400) for _ in range(2))  # independent errors
    # label 3: identical probabilities, a three-way tie
    frame, temporal = frame.astype(np.float32), temporal.astype(np.float32)
    choice = choose_routes(labels, frame, temporal, None, rule=route_rule_of(min_gain=0.02, block_frames=10, regions_together=False))
    assert [choice.routes[LABELS[k]] for k in range(4)] == ["temporal", "frame", "blend", "frame"]
    assert all(choice.routes[label] == "frame" and choice.evidence[label]["frame_ap"] is None for label in LABELS[4:])
    mixed = mix(frame, temporal, choice.routes)
    np.testing.assert_array_equal(mixed[:, 0], temporal[:, 0])
    np.testing.assert_array_equal(mixed[:, 1], frame[:, 1])
    np.testing.assert_allclose(mixed[:, 2], (frame[:, 2] + temporal[:, 2]) / 2, rtol=1e-6)


def test_invalid_frames_are_left_out_of_the_mean_embedding():
    """Issue 48, untested rule: an undecodable frame's embedding (zeros, or garbage) must not move
    the normalisation mean and spread that every valid frame is measured against. Mutation
    killed: the mean over every row."""
    frames, embeddings, labels, _ = synthetic_videos(2, 100, 8, seed=3)
    valid = np.ones(len(frames), bool)
    valid[::4] = False
    garbage = embeddings.copy()
    garbage[~valid] = 1e3  # what an undecodable frame's row may hold
    params = section_params(TemporalParams, "temporal", hidden=8, dilations=[1, 2], steps=1, chunk_frames=64)
    model, _ = train_temporal(build_sequences(frames, garbage, valid, labels), params, section_params(LossParams, "loss"),
                              0, torch.device("cpu"))
    assert np.allclose(model.mean.numpy(), embeddings[valid].mean(axis=0), atol=1e-5)
    assert np.allclose(model.std.numpy(), embeddings[valid].std(axis=0) + 1e-6, atol=1e-5)
