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
one monotone path per video, landmarks only near its boundaries), tuned by the same search.

Run: python -m bench.simulate [--rho 0.9] [--seed 0]   (about 4-7 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.signal import lfilter
from scipy.special import expit
from scipy.stats import norm

from vce.core.labels import LABEL_INDEX, LABELS
from vce.eval.score import score
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rho", type=float, default=0.9, help="AR(1) correlation of consecutive frames' noise")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixture", default=str(FIXTURE))
    parser.add_argument("--emission", default=EventParams.emission, choices=["probs", "runs"], help="anatomy decoding: region scores")
    parser.add_argument("--switch-penalty", type=float, default=EventParams.switch_penalty, help="anatomy decoding: cost per region switch")
    parser.add_argument("--landmarks", default=EventParams.landmarks, choices=["window", "peak"], help="anatomy decoding: landmark placement")
    parser.add_argument("--landmark-window", type=int, default=EventParams.landmark_window, help="anatomy decoding: frames around a boundary")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    gt = json.loads(Path(args.fixture).read_text())
    frame_labels = frame_labels_from_events(gt)
    frame_probs = simulate_probs(frame_labels, args.rho, rng)

    video_ids = [v["video_id"] for v in gt["videos"]]
    tune_ids = set(rng.permutation(video_ids)[: len(video_ids) // 2].tolist())
    test_ids = set(video_ids) - tune_ids
    gt_tune, gt_test = restrict(gt, tune_ids), restrict(gt, test_ids)
    in_tune = frame_probs["video_id"].isin(tune_ids).to_numpy()
    probs_tune, probs_test = frame_probs[in_tune], frame_probs[~in_tune]
    labels_tune = frame_labels[in_tune][list(LABELS)].to_numpy()

    threshold_params = ThresholdParams()
    seed_thresholds = f1_thresholds(labels_tune, probs_tune[list(LABELS)].to_numpy(), threshold_params)
    seed_params = EventParams(style="tuple", median_window=7, fill_gap=5, min_length=3, presence="none")
    seed_sub = probs_to_submission(probs_test, seed_thresholds, seed_params)
    empty_sub = {"videos": [{"video_id": v, "events": []} for v in sorted(test_ids)]}
    defaults_sub = probs_to_submission(probs_test, seed_thresholds, EventParams())

    tuned_thresholds, tuned_params, report = tune_on_map(
        probs_tune, gt_tune, seed_thresholds, EventParams(), threshold_params
    )
    ours_sub = probs_to_submission(probs_test, tuned_thresholds, tuned_params)

    # The same two variants with anatomy-consistent decoding (vce.anatomy), tuned the same way.
    anatomy = EventParams(anatomy="viterbi", emission=args.emission, switch_penalty=args.switch_penalty, landmarks=args.landmarks,
                          landmark_window=args.landmark_window)
    anatomy_defaults_sub = probs_to_submission(probs_test, seed_thresholds, anatomy)
    anatomy_thresholds, anatomy_params, anatomy_report = tune_on_map(
        probs_tune, gt_tune, seed_thresholds, anatomy, threshold_params
    )
    anatomy_sub = probs_to_submission(probs_test, anatomy_thresholds, anatomy_params)

    results = {
        "model": {"rho": args.rho, "seed": args.seed, "auc": SEED_AUC},
        "anatomy": {"emission": args.emission, "switch_penalty": args.switch_penalty,
                    "landmarks": args.landmarks, "landmark_window": args.landmark_window},
        "videos": {"tune": len(tune_ids), "test": len(test_ids), "frames": len(frame_probs)},
        "held_out": {
            "empty": maps(gt_test, empty_sub),
            "seed_recipe": maps(gt_test, seed_sub),
            "seed_recipe_present_labels_only": maps(gt_test, present_only(seed_sub, gt_test)),
            "ours_defaults_f1_thresholds": maps(gt_test, defaults_sub),
            "ours_tuned": maps(gt_test, ours_sub),
            "ours_defaults_f1_thresholds_anatomy": maps(gt_test, anatomy_defaults_sub),
            "ours_tuned_anatomy": maps(gt_test, anatomy_sub),
        },
        "seed_thresholds": seed_thresholds,
        "tuned_thresholds": tuned_thresholds,
        "tuned_event_params": dataclasses.asdict(tuned_params),
        "tuning": {k: v for k, v in report.items() if k != "steps"},
        "tuned_thresholds_anatomy": anatomy_thresholds,
        "tuning_anatomy": {k: v for k, v in anatomy_report.items() if k != "steps"},
        "seconds": round(time.perf_counter() - began, 1),
    }
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
