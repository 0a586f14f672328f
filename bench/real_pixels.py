"""Real pixels: does the frame model learn a real finding, and beat a colour histogram?

    python -m bench.real_pixels [--work DIR] [--set train.epochs=12 --set train.augment.hue=0]

1. Builds videos from the real WCEBleedGen stills (`../shared/fixtures/wcebleedgen`, 150 bleeding,
   150 not), each source image in one video only: non-bleeding stills held a few frames like a
   slow capsule, runs of bleeding stills labelled `blood` between them, regions and landmarks
   from the demo's Galar-like timeline (`vce.demo.generate.timeline`, its findings cleared).
   Train and validation videos are in the Galar layout; the held-out videos are in the
   RARE-VISION test layout with their ground truth as `score.test_gt`, so nothing upstream
   (training, model selection, thresholds, event tuning) sees them.
2. Runs the project's stages through their `main([...])`: index → split → prompts → train →
   predict → temporal (twice: the default `post.probs: auto` and the pure `temporal` route) →
   thresholds → events → score.
3. A colour baseline: per-frame HSV histogram + RGB moments, one logistic regression per label
   fitted on the training videos; its probabilities go through the same thresholds, events
   and scorer.
4. Prints one JSON object: `blood` on the held-out videos — frame AP and ROC AUC of the frame
   model (`model`), the default auto route (`model+temporal`), the temporal route (`temporal`), and
   the baseline; temporal AP at tIoU 0.5 / 0.95
   of the events built from each — plus the settings used.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score, roc_auc_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from vce.core.contracts import read_index, write_probs
from vce.core.io import read_json
from vce.core.labels import LABEL_INDEX, LABELS, PATHOLOGY
from vce.core.params import from_dict
from vce.data.frames import decode_frame
from vce.demo.generate import (
    DemoParams,
    events_of,
    frame_list_folder,
    test_video_ids,
    timeline,
    write_frame_list,
    write_label_csv,
)
from vce.eval.score import score

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT.parent / "shared" / "fixtures" / "wcebleedgen"
BLOOD = LABEL_INDEX["blood"]


# ---------------------------------------------------------------- videos from real stills

def still_sequence(bleeding: list[str], background: list[str], rng: np.random.Generator,
                   holds: dict) -> tuple[list[str], np.ndarray]:
    """One video's frames: (source file per frame, blood 0/1 per frame).

    Bleeding stills come in runs of `holds["run"]` stills, inserted between background stills
    after the first `holds["lead"]` share of the video (findings start past the esophagus);
    each still is repeated for `holds["background"]` / `holds["blood"]` frames (inclusive ranges).
    """
    runs, rest = [], list(bleeding)
    while rest:
        size = int(rng.integers(holds["run"][0], holds["run"][1] + 1))
        runs.append(rest[:size])
        rest = rest[size:]
    lead = int(np.ceil(holds["lead"] * len(background)))
    slots = np.sort(rng.choice(np.arange(lead, len(background) + 1), size=len(runs), replace=True))
    stills: list[tuple[str, int]] = []
    for position, name in enumerate(background + [None]):
        for run in [runs[k] for k in np.flatnonzero(slots == position)]:
            stills += [(still, 1) for still in run]
        if name is not None:
            stills.append((name, 0))
    files, blood = [], []
    for name, bleeding_still in stills:
        low, high = holds["blood" if bleeding_still else "background"]
        repeat = int(rng.integers(low, high + 1))
        files += [name] * repeat
        blood += [bleeding_still] * repeat
    return files, np.asarray(blood, np.uint8)


def video_labels(blood: np.ndarray, demo: DemoParams, rng: np.random.Generator,
                 anatomy: bool = True) -> np.ndarray:
    """(N, 17) labels: the demo's region/landmark timeline, findings cleared, `blood` as given.

    The stills carry no anatomy, so region and landmark labels cannot be learnt from their
    pixels; `anatomy=False` leaves them 0 (a diagnostic: blood alone).
    """
    labels = timeline(len(blood), demo, rng)
    cleared = PATHOLOGY if anatomy else LABELS
    labels[:, [LABEL_INDEX[label] for label in cleared]] = 0
    labels[:, BLOOD] = blood
    return labels


def place(source: Path, target: Path) -> None:
    """The still at `target`: a hard link (no copy of the fixture) where the file system allows."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def write_video(out: Path, fixtures: Path, v: int, n_labelled: int, test_videos: list[tuple[str, int]],
                files: list[str], blood: np.ndarray, labels: np.ndarray, demo: DemoParams,
                rng: np.random.Generator, truth: list) -> pd.DataFrame:
    """Video `v` on disk: the Galar layout (id v + 1) when v < n_labelled, else the test layout
    (its ground truth appended to `truth`). Returns video_id, frame, source, blood of its frames."""
    if v < n_labelled:
        video_id = str(v + 1)
        frames = int(rng.integers(0, demo.frame_step)) + demo.frame_step * np.arange(len(files))
        folder = out / "galar" / video_id
        names = [f"frame_{f:06d}.PNG" for f in frames]
        write_label_csv(out / "galar", video_id, labels, frames, rng)
    else:
        video_id, first = test_videos[v - n_labelled]
        frames = first + np.arange(len(files))
        folder = out / "test" / video_id
        names = [f"frame_{f:07d}.png" for f in frames]
        write_frame_list(frame_list_folder(out / "test", [i for i, _ in test_videos]), video_id, names)
        truth.append({"video_id": video_id, "events": events_of(labels, frames)})
    folder.mkdir(parents=True, exist_ok=True)
    for name, source in zip(names, files):
        place(fixtures / "frames" / source, folder / name)
    return pd.DataFrame({"video_id": video_id, "frame": frames, "source": files, "blood": blood})


def write_ground_truth(out: Path, truth: list) -> None:
    (out / "test").mkdir(parents=True, exist_ok=True)
    (out / "test_ground_truth.json").write_text(json.dumps({"videos": truth}) + "\n")


def build_videos(fixtures: Path, out: Path, n_labelled: int, n_test: int, demo: DemoParams,
                 holds: dict, seed: int, anatomy: bool = True) -> pd.DataFrame:
    """Write `out/galar` (labelled videos 1..n_labelled) and `out/test` (+ its ground truth).

    Source stills are dealt to videos without repetition, half bleeding and half not per video.
    Returns video_id, frame, source, blood of every written frame (test videos included).
    """
    table = pd.read_csv(fixtures / "labels.csv")
    rng = np.random.default_rng(seed)
    n_videos = n_labelled + n_test
    deal = {flag: np.array_split(rng.permutation(table.loc[table["bleeding"] == flag, "file"].to_numpy()),
                                 n_videos) for flag in (0, 1)}
    test_videos = test_video_ids(n_test)
    rows, truth = [], []
    for v in range(n_videos):
        files, blood = still_sequence(list(deal[1][v]), list(deal[0][v]), rng, holds)
        labels = video_labels(blood, demo, rng, anatomy)
        rows.append(write_video(out, fixtures, v, n_labelled, test_videos, files, blood, labels, demo, rng, truth))
    write_ground_truth(out, truth)
    return pd.concat(rows, ignore_index=True)


# ---------------------------------------------------------------- a learning curve over distinct stills

def picture_groups(table: pd.DataFrame) -> pd.Series:
    """The near-duplicate group of each still: its `source_file` without Roboflow's export suffix
    (`.rf.<hash>.jpg`), so two exports of one original picture fall in one group."""
    return table["source_file"].astype(str).str.replace(r"\.rf\.[0-9a-f]+(\.[A-Za-z]+)?$", "", regex=True)


def check_no_leak(truth: pd.DataFrame, table: pd.DataFrame) -> None:
    """Refuse a build where a still, or a still of the same picture group, is in a training video
    and in a validation or held-out one (`truth` has a `role` column: train | val | test)."""
    group = dict(zip(table["file"], picture_groups(table)))
    training = truth["role"] == "train"
    shared_stills = set(truth.loc[training, "source"]) & set(truth.loc[~training, "source"])
    shared_groups = ({group[s] for s in truth.loc[training, "source"]}
                     & {group[s] for s in truth.loc[~training, "source"]})
    if shared_stills or shared_groups:
        raise RuntimeError(f"training and validation/held-out videos share stills {sorted(shared_stills)[:5]} "
                           f"or source pictures {sorted(shared_groups)[:5]}")


def deal_by_picture(files: pd.Series, groups: pd.Series, quota: int, rng: np.random.Generator
                    ) -> tuple[list[str], list[str]]:
    """Shuffle whole picture groups; the first groups until `quota` stills, and the rest."""
    order = rng.permutation(np.unique(groups.to_numpy()))
    first, rest = [], []
    for name in order:
        members = files[groups == name].tolist()
        (first if len(first) < quota else rest).extend(members)
    return first, rest


def scaled_holds(holds: dict, factor: float) -> dict:
    """Hold ranges × factor (at least 1 frame): fewer distinct stills held longer, as many frames."""
    return {**holds, **{key: tuple(max(1, int(round(n * factor))) for n in holds[key])
                        for key in ("background", "blood")}}


def build_curve_videos(fixtures: Path, out: Path, n_labelled: int, n_test: int, n_val: int, train_stills: int,
                       demo: DemoParams, holds: dict, seed: int, anatomy: bool = True
                       ) -> tuple[pd.DataFrame, list[str]]:
    """The videos of one point of the learning curve over distinct training pictures.

    1. Per class (bleeding / not), whole picture groups (`picture_groups`) are shuffled with
       `seed`, and the first ones fill the `n_test` held-out and `n_val` validation videos with
       the share of stills a video gets when all are dealt over n_labelled + n_test videos
       (15 + 15 of the 300): these videos depend on `seed` only, not on `train_stills`.
    2. The training videos (the other labelled ones) get the first `train_stills` bleeding and
       `train_stills` non-bleeding stills of the remaining pool (the same number of each, as
       the full deal has; nested: 20 of them are among the 45), holds scaled by
       pool / train_stills so the training frame count stays about that of the full pool.
    3. `check_no_leak` refuses any still or picture in training and elsewhere.

    Validation videos are the last n_val labelled ids (pin them with `split.val_videos`).
    Returns the frames (video_id, frame, source, blood, role) and the validation video ids.
    """
    table = pd.read_csv(fixtures / "labels.csv")
    groups = picture_groups(table)
    n_videos = n_labelled + n_test
    n_train = n_labelled - n_val
    deal_rng = np.random.default_rng(seed)
    fixed, train = {}, {}
    for flag in (0, 1):
        mask = table["bleeding"] == flag
        per_video = int(mask.sum()) // n_videos
        held, pool = deal_by_picture(table.loc[mask, "file"], groups[mask], per_video * (n_test + n_val), deal_rng)
        if not 0 < train_stills <= len(pool):
            raise SystemExit(f"--train-stills {train_stills}: the pool left after the held-out and validation "
                             f"videos has {len(pool)} stills of bleeding = {flag}")
        fixed[flag] = np.array_split(np.asarray(held), n_test + n_val)
        train[flag] = np.array_split(np.asarray(pool[:train_stills]), n_train)
        factor = len(pool) / train_stills
    train_holds = scaled_holds(holds, factor)
    test_videos = test_video_ids(n_test)
    val_ids = [str(v + 1) for v in range(n_train, n_labelled)]
    rows, truth = [], []
    for v in range(n_videos):
        rng = np.random.default_rng([seed, v])  # one stream per video: fixed videos equal for every N
        role = "train" if v < n_train else "val" if v < n_labelled else "test"
        k = v - n_train
        bleeding, background = (train[1][v], train[0][v]) if role == "train" else (fixed[1][k], fixed[0][k])
        files, blood = still_sequence(list(bleeding), list(background), rng,
                                      train_holds if role == "train" else holds)
        labels = video_labels(blood, demo, rng, anatomy)
        video = write_video(out, fixtures, v, n_labelled, test_videos, files, blood, labels, demo, rng, truth)
        rows.append(video.assign(role=role))
    write_ground_truth(out, truth)
    frames = pd.concat(rows, ignore_index=True)
    check_no_leak(frames, table)
    return frames, val_ids


# ---------------------------------------------------------------- the colour baseline

def colour_features(path: Path) -> np.ndarray:
    """HSV histogram (8 hue × 4 saturation, 8 value bins) and RGB mean / std of one frame."""
    import cv2

    rgb = decode_frame(path)  # (H, W, 3) uint8, as stored (224 px)
    hsv = cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV)
    hue_sat = cv2.calcHist([hsv], [0, 1], None, [8, 4], [0, 180, 0, 256]).ravel()
    value = cv2.calcHist([hsv], [2], None, [8], [0, 256]).ravel()
    pixels = rgb.reshape(-1, 3).astype(np.float64) / 255
    hist = np.concatenate([hue_sat, value]) / pixels.shape[0]
    return np.concatenate([hist, pixels.mean(0), pixels.std(0)])


def baseline_probs(frames: pd.DataFrame, test: pd.DataFrame, galar: Path, test_root: Path,
                   out_dir: Path, seed: int) -> None:
    """Fit on the training frames; write val.parquet and test.parquet (probabilities contract)."""
    cache: dict[Path, np.ndarray] = {}

    def features(rows: pd.DataFrame, root: Path) -> np.ndarray:
        paths = [(root / p).resolve() for p in rows["path"]]  # held frames share one inode
        for path in paths:
            if path not in cache:
                cache[path] = colour_features(path)
        return np.stack([cache[path] for path in paths])

    train = frames[frames["split"] == "train"]
    x_train = features(train, galar)
    parts = {"val": (frames[frames["split"] == "val"], galar), "test": (test, test_root)}
    for split, (rows, root) in parts.items():
        x = features(rows, root)
        probs = pd.DataFrame({"video_id": rows["video_id"].to_numpy(), "frame": rows["frame"].to_numpy()})
        for label in LABELS:
            y = train[label].to_numpy()
            if y.min() == y.max():  # one class only: its training prevalence
                probs[label] = np.float32(y.mean())
                continue
            fit = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=2000, random_state=seed))
            probs[label] = fit.fit(x_train, y).predict_proba(x)[:, 1].astype(np.float32)
        probs["valid"] = True
        write_probs(out_dir / f"{split}.parquet", probs)


# ---------------------------------------------------------------- stages and numbers

def stage(name: str, argv: list[str]) -> None:
    import importlib

    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the one JSON object
        code = importlib.import_module(f"stages.{name}").main(argv)
    if code != 0:
        raise SystemExit(f"stage {name} failed (exit {code})")


def set_value(params: dict, assignment: str) -> None:
    """Apply `section.key[.sub]=value` (value parsed as YAML) to the params dict."""
    key, _, text = assignment.partition("=")
    *parents, leaf = key.split(".")
    node = params
    for part in parents:
        node = node[part]
    if leaf not in node:
        raise SystemExit(f"--set {assignment}: unknown key {key}")
    node[leaf] = yaml.safe_load(text)


def frame_numbers(probs_path: Path, truth: pd.DataFrame) -> dict:
    probs = read_index(probs_path, ["video_id", "frame", "blood", "valid"])
    joined = probs.merge(truth, on=["video_id", "frame"], suffixes=("_prob", ""), validate="one_to_one")
    joined = joined[joined["valid"]]
    return {"ap": round(float(average_precision_score(joined["blood"], joined["blood_prob"])), 4),
            "auc": round(float(roc_auc_score(joined["blood"], joined["blood_prob"])), 4)}


def event_numbers(work: Path, params_path: Path, name: str, val_probs: Path, test_probs: Path,
                  test_gt: dict) -> dict:
    """Thresholds, events and score of one probability set; blood's temporal AP on the test videos."""
    p = ["--params", str(params_path)]
    d = work / name
    stage("thresholds", p + ["--probs", str(val_probs), "--frames", str(work / "split/frames.parquet"),
                             "--out", str(d / "thresholds.json"), "--metrics", str(d / "thresholds_metrics.json")])
    held = ["--held-out", str(work / "split/test.parquet")]  # split.test_videos: none here, an empty table
    stage("events", p + held + ["--thresholds", str(d / "thresholds.json"), "--val-probs", str(val_probs),
                         "--test-probs", str(test_probs), "--frames", str(work / "split/frames.parquet"),
                         "--test-frames", str(work / "index/test.parquet"), "--out-dir", str(d / "events")])
    stage("score", p + held + ["--events", str(d / "events/val.json"), "--test-events", str(d / "events/submission.json"),
                        "--frames", str(work / "split/frames.parquet"), "--gt-out", str(d / "val_gt.json"),
                        "--metrics", str(d / "score.json"), "--frame-metrics", str(d / "thresholds_metrics.json"),
                        "--val-headline", str(d / "headline_val.json"), "--test-headline", str(d / "headline_test.json")])
    result = score(test_gt, read_json(d / "events/submission.json", "test events"))
    return {"temporal_ap@0.5": round(result["per_label@0.5"]["blood"], 4),
            "temporal_ap@0.95": round(result["per_label@0.95"]["blood"], 4),
            "test_map@0.5": round(result["map@0.5"], 4), "test_map@0.95": round(result["map@0.95"], 4)}


def recipe_assignments(name: str | None) -> list[str]:
    """`recipes/<name>.yaml` as `--set` assignments (applied before the command line's own)."""
    if not name:
        return []
    from vce.core.recipe import load_recipe

    return [f"{key}={json.dumps(value)}" for key, value in load_recipe(name).items()]


def scratch_params(work: Path, assignments: list[str]) -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["data"].update(root=str(work / "videos/galar"), test_root=str(work / "videos/test"), metadata=None)
    params["score"]["test_gt"] = str(work / "videos/test_ground_truth.json")
    params["train"].update(num_workers=0)
    params["predict"].update(num_workers=0)
    for assignment in assignments:
        set_value(params, assignment)
    return params


def distinct_stills(truth: pd.DataFrame) -> dict:
    """Distinct bleeding / background stills and frames in the training videos, and the holds used."""
    train = truth[truth["role"] == "train"]
    stills = train.drop_duplicates("source")
    return {"blood": int(stills["blood"].sum()), "background": int((stills["blood"] == 0).sum()),
            "frames": int(len(train)), "mean_hold": round(len(train) / len(stills), 2)}


def route_counts(path: Path) -> dict:
    """Which route (frame / temporal / blend) each label took under post.probs, from metrics/route.json."""
    route = read_json(path, "route")
    return {"post_probs": route["post_probs"], "counts": route["counts"], "blood": route["routes"].get("blood"),
            "moved": {label: r for label, r in route["routes"].items() if r != "frame"}}


def run(work: Path, args) -> dict:
    params = scratch_params(work, recipe_assignments(args.recipe) + args.set)
    demo = from_dict(DemoParams, params["demo"], "demo")
    holds = {"lead": 0.15, "run": (2, 4), "background": (3, 8), "blood": (2, 4)}
    if args.train_stills:
        # The split stage's own count of validation videos, pinned so the builder knows which train.
        n_val = int(np.clip(round(params["split"]["val_fraction"] * args.labelled), 1, args.labelled - 1))
        truth, val_ids = build_curve_videos(Path(args.fixtures), work / "videos", args.labelled, args.test, n_val,
                                            args.train_stills, demo, holds, args.seed, args.anatomy)
        params["split"].update(val_videos=val_ids, folds=[0])
    else:
        truth = build_videos(Path(args.fixtures), work / "videos", args.labelled, args.test, demo, holds, args.seed,
                             args.anatomy)
    params_path = work / "params.yaml"
    params_path.write_text(yaml.safe_dump(params))
    p = ["--params", str(params_path)]
    w = {key: str(work / rel) for key, rel in {
        "frames": "index/frames.parquet", "test": "index/test.parquet", "split": "split/frames.parquet",
        "prompts": "models/prompt_embeddings.pt", "model": "models/model.pt", "predict": "predict",
        "temporal": "temporal", "temporal_route": "temporal_route", "cache": "cache", "embed": "embed"}.items()}
    stage("index", p + ["--frames-out", w["frames"], "--test-out", w["test"],
                        "--report", str(work / "metrics/index_report.json")])
    stage("split", p + ["--index", w["frames"], "--out", w["split"], "--metrics", str(work / "metrics/split.json")])
    stage("prompts", p + ["--out", w["prompts"]])
    started = time.perf_counter()
    reused = args.reuse_frame_model and all((Path(w["predict"]) / f"{name}.parquet").is_file() for name in
                                            ("val", "test", "val_embeddings", "test_embeddings"))
    # --reuse-features: a frozen backbone's features of these same videos (same --seed) are kept.
    features_kept = args.reuse_features and (Path(w["embed"]) / "labelled.parquet").is_file()
    if not (reused or features_kept):
        stage("embed", p + ["--frames", w["split"], "--test", w["test"], "--held-out", str(work / "split/test.parquet"),
                            "--cache", w["cache"], "--out", w["embed"]])
    embed_s = time.perf_counter() - started
    if not reused:  # --reuse-frame-model: the frame model and its probabilities do not depend on what follows
        stage("train", p + ["--frames", w["split"], "--cache", w["cache"], "--prompts", w["prompts"],
                            "--features", w["embed"],
                            "--model-out", w["model"], "--state-dir", str(work / "models/train_state"),
                            "--metrics", str(work / "metrics/train.json"), "--live-dir", str(work / "metrics/train")])
        stage("predict", p + ["--held-out", str(work / "split/test.parquet"), "--model", w["model"], "--frames",
                              w["split"], "--test", w["test"], "--cache", w["cache"], "--features", w["embed"],
                              "--out-dir", w["predict"], "--report", str(work / "metrics/predict.json")])
    train_s = time.perf_counter() - started - embed_s
    if args.temporal:
        stage("temporal", p + ["--predict-dir", w["predict"], "--frames", w["split"], "--out-dir", w["temporal"],
                               "--metrics", str(work / "metrics/temporal.json"),
                               "--route", str(work / "metrics/route.json"), "--model-out", str(work / "temporal.pt")])
        # The temporal route itself (post.probs: temporal, every label on the cross-fitted temporal
        # model), scored beside the default auto route: what auto leaves on the table, or avoids.
        only = dict(params, post={**params["post"], "probs": "temporal"})
        only_path = work / "params_temporal_route.yaml"
        only_path.write_text(yaml.safe_dump(only))
        stage("temporal", ["--params", str(only_path), "--predict-dir", w["predict"], "--frames", w["split"],
                           "--out-dir", w["temporal_route"], "--metrics", str(work / "metrics/temporal_route.json"),
                           "--route", str(work / "metrics/route_temporal_route.json"),
                           "--model-out", str(work / "temporal_route.pt")])
    frames, test = read_index(w["split"]), read_index(w["test"])
    if args.train_stills:  # the split trained on exactly the builder's training videos
        built_train = set(truth.loc[truth["role"] == "train", "video_id"])
        if set(frames.loc[frames["split"] == "train", "video_id"]) != built_train:
            raise SystemExit(f"split's training videos differ from the builder's {sorted(built_train)}")
    baseline_probs(frames, test, work / "videos/galar", work / "videos/test", work / "baseline", args.seed)
    test_gt = read_json(work / "videos/test_ground_truth.json", "test ground truth")
    held = truth[truth["video_id"].isin(set(test["video_id"]))]
    result = {}
    sources = [("model", w["predict"])] + [("model+temporal", w["temporal"]),
                                           ("temporal", w["temporal_route"])] * args.temporal
    for name, probs_dir in sources + [("baseline", str(work / "baseline"))]:
        probs_dir = Path(probs_dir)
        result[name] = {"frame": frame_numbers(probs_dir / "test.parquet", held),
                        **event_numbers(work, params_path, f"events_{name}", probs_dir / "val.parquet",
                                        probs_dir / "test.parquet", test_gt)}
    split_videos = frames.groupby("split")["video_id"].unique()
    train_metrics = read_json(work / "metrics/train.json", "train metrics")
    model_cfg = json.loads((ROOT / "vce/model/configs" / f"{params['model']['source']}.json").read_text()) \
        if params["model"]["source"] in ("tiny", "random") else {}
    return {
        "label": "blood", "held_out": "RARE-VISION test layout videos (never seen by train, thresholds or tuning)",
        "results": result,
        "data": {
            "source": "WCEBleedGen stills (../shared/fixtures/wcebleedgen), each in one video only",
            "videos": {"train": sorted(split_videos.get("train", []), key=int),
                       "val": sorted(split_videos.get("val", []), key=int), "test": sorted(test["video_id"].unique())},
            "frames": {"train": int((frames["split"] == "train").sum()), "val": int((frames["split"] == "val").sum()),
                       "test": int(len(test))},
            "blood_prevalence_test": round(float(held["blood"].mean()), 3),
            "holds": {k: list(v) if isinstance(v, tuple) else v for k, v in holds.items()},
            "seed": args.seed, "anatomy_labels": args.anatomy,
            **({"train_stills": distinct_stills(truth)} if args.train_stills else {}),
        },
        **({"routes": route_counts(work / "metrics/route.json")} if args.temporal else {}),
        "settings": {
            "recipe": args.recipe, "model_source": params["model"]["source"],
            "freeze_backbone": params["train"]["freeze_backbone"],
            "image_size": model_cfg.get("model_cfg", {}).get("vision_cfg", {}).get("image_size"),
            "train": {k: params["train"][k] for k in ("epochs", "batch_size", "lr_head", "lr_backbone",
                                                      "mixup_alpha", "samples_per_epoch")},
            "augment": params["train"]["augment"], "loss": params["loss"], "fusion": params["model"]["fusion"],
            "overrides": args.set, "thresholds_method": params["thresholds"]["method"],
            "torch_threads": args.threads or "default",
        },
        "train": {"seconds": round(train_s, 1), "embed_seconds": round(embed_s, 1), "reused": reused,
                  "features_reused": bool(features_kept), "best_epoch": train_metrics["best"].get("epoch"),
                  "best_val_map": train_metrics["best"].get("val_map")},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", default=str(FIXTURES), help="wcebleedgen folder (frames/, labels.csv)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed)")
    parser.add_argument("--labelled", type=int, default=8, help="Galar-layout videos (train + val)")
    parser.add_argument("--test", type=int, default=2, help="held-out test-layout videos")
    parser.add_argument("--seed", type=int, default=0, help="seed of the video builder")
    parser.add_argument("--train-stills", type=int, default=0, metavar="N",
                        help="learning-curve point: held-out and validation videos fixed by --seed, training "
                             "videos from N distinct bleeding + N non-bleeding stills of the rest, held longer "
                             "(about the same frames for every N); 0: every still dealt as before")
    parser.add_argument("--no-anatomy", dest="anatomy", action="store_false",
                        help="no region/landmark labels (the stills carry none): blood is the only label")
    parser.add_argument("--no-temporal", dest="temporal", action="store_false",
                        help="skip the temporal stage (frame model and baseline only; quicker sweeps)")
    parser.add_argument("--reuse-frame-model", action="store_true",
                        help="keep --work's trained model and predictions (train and predict skipped where "
                             "predict/ is complete): re-run only the stages after predict")
    parser.add_argument("--reuse-features", action="store_true",
                        help="keep --work's frozen-backbone features (embed skipped where embed/ is complete): a probe "
                             "setting swept on the same videos trains and predicts from them")
    parser.add_argument("--recipe", default=None, metavar="NAME",
                        help="apply recipes/NAME.yaml before the --set values (e.g. lite0_probe: a real pretrained "
                             "backbone, frozen, its heads probed)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (0: torch's default; 1 is faster on a shared, loaded CPU)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a params.yaml value for this run (repeatable)")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    if args.work:
        work = Path(args.work)
        if work.exists() and args.reuse_features and not args.reuse_frame_model:  # everything but the features
            for entry in work.iterdir():
                if entry.name != "embed":
                    shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        elif work.exists() and not args.reuse_frame_model:
            shutil.rmtree(work)
        elif (work / "videos").exists():  # reuse keeps the model and predictions; the videos are rebuilt
            shutil.rmtree(work / "videos")
        work.mkdir(parents=True, exist_ok=True)
        result = run(work, args)
    else:
        with tempfile.TemporaryDirectory(prefix="real_pixels_") as tmp:
            result = run(Path(tmp), args)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
