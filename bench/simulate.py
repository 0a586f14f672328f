"""Post-processing on real Galar timelines with simulated frame probabilities: empty vs seed vs ours.

Ground truth: the official events of all 80 Galar videos (`../shared/fixtures/galar_gt_events.json`),
expanded to one 0/1 row per frame (index units).

Frame-score model (binormal, per label k, chosen to resemble the seed system's validation):
- difficulty: the seed's per-class frame ROC AUC (REFERENCE.md), d'_k = sqrt(2) * Phi^-1(AUC_k),
  so that a frame's score has exactly that AUC; AUCs below 0.5 (tiny validation supports) and
  the missing z-line AUC are taken as 0.5 (chance);
- temporal correlation: score z = d'_k * y + e, with e an AR(1) series over consecutive frames,
  e_t = rho * e_(t-1) + sqrt(1 - rho^2) * eps_t (unit variance; rho = 0.9 by default: neighbouring
  frames look alike, so errors come in bursts, as a frame classifier's do);
- probability p = sigmoid(z - d'_k / 2): positives and negatives centred symmetrically around
  0.5, as a classifier trained with a rebalancing sampler and focal loss tends to be (rare
  classes get probabilities far above their prevalence, which is what makes F1 thresholds fire
  in videos where the label is absent).

Protocol: videos split in half at random (seed); the tuning half gives F1 thresholds (seed) and
the `tune_on_map` search (ours); the held-out half is scored with the official metric. Printed:
mAP@0.5/0.95 of an empty submission, the seed's recipe (F1 thresholds, w=7, g=5, m=3, tuple
events, no presence decision), the seed's events kept only for labels truly present in each video
(an oracle presence decision), ours with default parameters and F1 thresholds, and ours tuned;
then the last two again with anatomy-consistent decoding (`events.anatomy: viterbi`: regions as
one monotone path per video, landmarks only near its boundaries), tuned by the same search
(ours tuned with anatomy decoding). First of all: the score engine (`vce.post.engine`, knobs
from params.yaml `thresholds.engine`) fitted on the tuning half, its metric-optimal submission
and its clinical list, the oracle ceilings (the exact region runs alone; the exact runs of all 8
anatomy labels), the engine's fitting time and, per label, the AP it earns as silence credit
and on the videos where the label is present (`engine_per_label`).

Run: python -m bench.simulate [--rho 0.9] [--seed 0] [--videos N] [--engine-only]
(about 4-7 minutes on 2 cores; --engine-only about 1.5)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.signal import lfilter
from scipy.special import expit
from scipy.stats import norm

from vce.core.labels import ANATOMY, LABEL_INDEX, LABELS, REGIONS
from vce.core.params import from_dict, load_params
from vce.eval.score import average_precisions, score
from vce.post.engine import engine_submission, fit_engine, tuning_timeline
from vce.post.events import EventParams, probs_to_submission
from vce.post.thresholds import (
    ThresholdParams,
    f1_thresholds,
    tune_on_map,
)

ROOT = Path(__file__).resolve().parents[1]

FIXTURE = ROOT.parent / "shared" / "fixtures" / "galar_gt_events.json"

# The seed's frame-level validation ROC AUC per class (REFERENCE.md); z-line had no positives.
SEED_AUC = {
    "mouth": 0.990, "esophagus": 0.938, "stomach": 0.981, "small intestine": 0.989,
    "colon": 0.991, "z-line": 0.5, "pylorus": 0.593, "ileocecal valve": 0.322,
    "active bleeding": 0.522, "angiectasia": 0.932, "blood": 0.940, "erosion": 0.829,
    "erythema": 0.537, "hematin": 0.463, "lymphangioectasis": 0.696, "polyp": 0.729,
    "ulcer": 0.468,
}


def frame_labels_from_events(gt: dict) -> pd.DataFrame:
    """One row per frame from each video's first to last event: video_id, t, 17 0/1 columns."""
    parts = []
    for video in gt["videos"]:
        events = video["events"]
        first, last = events[0]["start"], events[-1]["end"]
        labels = np.zeros((last - first + 1, len(LABELS)), dtype=np.uint8)  # (T, 17)
        for event in events:
            for label in event["label"]:
                labels[event["start"] - first : event["end"] - first + 1, LABEL_INDEX[label]] = 1
        part = pd.DataFrame(labels, columns=list(LABELS))
        part.insert(0, "t", np.arange(first, last + 1, dtype=np.int64))
        part.insert(0, "video_id", video["video_id"])
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def simulate_probs(frame_labels: pd.DataFrame, rho: float, rng: np.random.Generator) -> pd.DataFrame:
    """Frame probabilities under the binormal AR(1) model of the module docstring."""
    truth = frame_labels[list(LABELS)].to_numpy(dtype=np.float64)  # (N, 17)
    auc = np.array([max(SEED_AUC[label], 0.5) for label in LABELS])
    separation = np.sqrt(2.0) * norm.ppf(auc)  # (17,)
    shocks = rng.standard_normal(truth.shape)
    noise = lfilter([np.sqrt(1 - rho**2)], [1.0, -rho], shocks, axis=0)  # AR(1), unit variance
    probs = expit(separation * truth + noise - separation / 2).astype(np.float32)
    out = frame_labels[["video_id", "t"]].copy()
    out[list(LABELS)] = probs
    return out


def restrict(sub: dict, video_ids: set) -> dict:
    return {"videos": [v for v in sub["videos"] if v["video_id"] in video_ids]}


def present_only(sub: dict, gt: dict) -> dict:
    """Drop every event label that the video's ground truth does not hold (oracle presence)."""
    present = {v["video_id"]: {name for e in v["events"] for name in e["label"]} for v in gt["videos"]}
    videos = []
    for video in sub["videos"]:
        events = []
        for event in video["events"]:
            labels = [name for name in event["label"] if name in present[video["video_id"]]]
            if labels:
                events.append({**event, "label": labels})
        videos.append({"video_id": video["video_id"], "events": events})
    return {"videos": videos}


def maps(gt: dict, sub: dict) -> dict:
    result = score(gt, sub)
    return {"map@0.5": round(result["map@0.5"], 4), "map@0.95": round(result["map@0.95"], 4)}


def oracle_runs(gt: dict, labels) -> dict:
    """Each video's exact continuous runs of `labels` (merged fragments), nothing else predicted."""
    videos = []
    for video in gt["videos"]:
        events = []
        for label in labels:
            spans = sorted((e["start"], e["end"]) for e in video["events"] if label in e["label"])
            merged: list = []
            for start, end in spans:
                if merged and start <= merged[-1][1] + 1:
                    merged[-1][1] = max(merged[-1][1], end)
                else:
                    merged.append([start, end])
            events += [{"start": a, "end": b, "label": [label]} for a, b in merged]
        videos.append({"video_id": video["video_id"], "events": events})
    return {"videos": videos}


def decomposition(gt: dict, sub: dict) -> dict:
    """Per label and threshold: AP earned as silence credit (absent, left out) and on present videos.

    Both are sums over videos divided by the number of videos, so silence + present = the
    label's mean AP; `present_videos` says over how many videos the second was earned.
    """
    video_ids, aps = average_precisions(gt, sub)
    by_id = {v["video_id"]: v for v in gt["videos"]}
    present = np.array([[any(label in e["label"] for e in by_id[v]["events"]) for label in LABELS] for v in video_ids])
    out = {}
    for k, label in enumerate(LABELS):
        out[label] = {"present_videos": int(present[:, k].sum())}
        for threshold, ap in aps.items():
            out[label][f"silence@{threshold}"] = round(float(ap[~present[:, k], k].sum() / len(video_ids)), 4)
            out[label][f"present@{threshold}"] = round(float(ap[present[:, k], k].sum() / len(video_ids)), 4)
    return out


def setup(args):
    """What both simulations share: the knobs of params.yaml, the seeded generator, the Galar
    ground truth (a random subset of `--videos` when asked) and its per-frame labels."""
    params = load_params(args.params)
    event_params = from_dict(EventParams, params["events"], "events").replace(anatomy="none")
    threshold_params = from_dict(ThresholdParams, params["thresholds"], "thresholds")
    rng = np.random.default_rng(args.seed)
    gt = json.loads(Path(args.fixture).read_text())
    if args.videos:
        gt = restrict(gt, set(rng.permutation([v["video_id"] for v in gt["videos"]])[: args.videos].tolist()))
    return gt, frame_labels_from_events(gt), rng, event_params, threshold_params


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rho", type=float, default=0.9, help="AR(1) correlation of consecutive frames' noise")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixture", default=str(FIXTURE))
    parser.add_argument("--params", default=str(ROOT / "params.yaml"), help="events / thresholds knobs (thresholds.engine)")
    parser.add_argument("--videos", type=int, default=0, help="use a random subset of this many videos (0: all 80)")
    parser.add_argument("--engine-only", action="store_true", help="skip the slow tune_on_map variants")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    gt, frame_labels, rng, event_params, threshold_params = setup(args)
    frame_probs = simulate_probs(frame_labels, args.rho, rng)
    results = run_protocol(gt, frame_labels, frame_probs, rng, event_params, threshold_params, args.engine_only)
    results = {"model": {"rho": args.rho, "seed": args.seed, "auc": SEED_AUC, "videos": args.videos or len(gt["videos"])},
               **results, "seconds": round(time.perf_counter() - began, 1)}
    print(json.dumps(results, indent=2))
    return 0


def run_protocol(gt, frame_labels, frame_probs, rng, event_params, threshold_params, engine_only: bool,
                 ceilings: dict | None = None) -> dict:
    """Tune on a random half of the videos, score every variant on the other half (shared by simulate2;
    `ceilings`: more oracle submissions, name -> submission over all videos, scored on that half)."""
    video_ids = [v["video_id"] for v in gt["videos"]]
    tune_ids = set(rng.permutation(video_ids)[: len(video_ids) // 2].tolist())
    test_ids = set(video_ids) - tune_ids
    gt_tune, gt_test = restrict(gt, tune_ids), restrict(gt, test_ids)
    in_tune = frame_probs["video_id"].isin(tune_ids).to_numpy()
    probs_tune, probs_test = frame_probs[in_tune], frame_probs[~in_tune]
    labels_tune = frame_labels[in_tune][list(LABELS)].to_numpy()
    empty_sub = {"videos": [{"video_id": v, "events": []} for v in sorted(test_ids)]}
    held_out = {"empty": maps(gt_test, empty_sub),
                "oracle_region_runs": maps(gt_test, oracle_runs(gt_test, REGIONS)),
                "oracle_anatomy_runs": maps(gt_test, oracle_runs(gt_test, ANATOMY)),
                **{name: maps(gt_test, restrict(sub, test_ids)) for name, sub in (ceilings or {}).items()}}
    out: dict = {"videos": {"tune": len(tune_ids), "test": len(test_ids), "frames": len(frame_probs)}}

    # The score engine (vce.post.engine), fitted on the tuning half only; tuning time on it.
    engine_began = time.perf_counter()
    engine = fit_engine(tuning_timeline(probs_tune, threshold_params.engine), gt_tune, threshold_params.engine)
    engine_seconds = time.perf_counter() - engine_began
    engine_sub, clinical_sub = engine_submission(probs_test, engine)
    held_out["engine"] = maps(gt_test, engine_sub)
    held_out["engine_clinical"] = maps(gt_test, clinical_sub)

    if not engine_only:
        seed_thresholds = f1_thresholds(labels_tune, probs_tune[list(LABELS)].to_numpy(), threshold_params)
        seed_params = event_params.replace(style="tuple", median_window=7, fill_gap=5, min_length=3, presence="none",
                                           per_label={})
        seed_sub = probs_to_submission(probs_test, seed_thresholds, seed_params)
        held_out["seed_recipe"] = maps(gt_test, seed_sub)
        held_out["seed_recipe_present_labels_only"] = maps(gt_test, present_only(seed_sub, gt_test))
        held_out["ours_defaults_f1_thresholds"] = maps(gt_test, probs_to_submission(probs_test, seed_thresholds, event_params))
        tuned_thresholds, tuned_params, report = tune_on_map(probs_tune, gt_tune, seed_thresholds, event_params, threshold_params)
        held_out["ours_tuned"] = maps(gt_test, probs_to_submission(probs_test, tuned_thresholds, tuned_params))
        anatomy = event_params.replace(anatomy="viterbi")
        anatomy_thresholds, anatomy_params, _ = tune_on_map(probs_tune, gt_tune, seed_thresholds, anatomy, threshold_params)
        held_out["ours_tuned_anatomy"] = maps(gt_test, probs_to_submission(probs_test, anatomy_thresholds, anatomy_params))
        out["tuning_map_seconds"] = report.get("seconds")
    out["held_out"] = held_out
    out["engine_tuning_seconds"] = round(engine_seconds, 1)
    out["engine_report"] = engine.report
    out["engine_policies"] = {label: {k: v for k, v in policy.to_dict().items() if k not in ("variants", "anchors", "length_priors")}
                              for label, policy in engine.policies.items()}
    out["engine_per_label"] = decomposition(gt_test, engine_sub)
    oracle = decomposition(gt_test, oracle_runs(gt_test, ANATOMY))
    out["oracle_anatomy_gap_per_label"] = oracle_gaps(out["engine_per_label"], oracle)
    out["engine_by_group"] = by_group(out["engine_per_label"], out["oracle_anatomy_gap_per_label"],
                                      decomposition(gt_test, empty_sub))
    return out


def oracle_gaps(engine: dict, oracle: dict) -> dict:
    """Per label and threshold: the oracle's mean AP minus the engine's (both `decomposition`s):
    what a decoder that emits the exact anatomy runs (findings silent) earns over it."""
    return {label: {f"gap@{t}": round(sum(oracle[label][f"{part}@{t}"] - engine[label][f"{part}@{t}"]
                                          for part in ("silence", "present")), 4) for t in (0.5, 0.95)}
            for label in engine}


def by_group(engine: dict, gaps: dict, empty: dict | None = None) -> dict:
    """Regions, landmarks and findings: the engine's silence credit, its AP earned on present
    videos and the anatomy oracle's gap, each summed over the group's labels (mAP points x 17);
    with `empty` (the empty submission's `decomposition`), `if_silent`: what the group scores
    left silent, against which its summed AP (silence + present) is above or below silence."""
    groups = {"regions": REGIONS, "landmarks": [label for label in ANATOMY if label not in REGIONS],
              "findings": [label for label in LABELS if label not in ANATOMY]}
    parts = ("silence", "present", "gap")
    out = {name: {f"{part}@{t}": round(sum((gaps if part == "gap" else engine)[label][f"{part}@{t}"] for label in labels), 4)
                  for t in (0.5, 0.95) for part in parts}
           for name, labels in groups.items()}
    if empty is not None:
        for name, labels in groups.items():
            out[name] |= {f"if_silent@{t}": round(sum(empty[label][f"silence@{t}"] for label in labels), 4)
                          for t in (0.5, 0.95)}
    return out


if __name__ == "__main__":
    sys.exit(main())
