"""A second simulation with another error model, so the decoder is not tuned to one simulator.

Same ground truth and protocol as `bench.simulate` (the 80 real Galar timelines, tuned on a
random half, the other half scored with the official metric; `bench.simulate.run_protocol`),
but the frame probabilities fail differently:

- **region boundary noise**: the region scores follow a *blurred, shifted* truth: each true
  region boundary is moved by N(0, `--boundary-sd`) frames and the score ramps linearly from
  one region to the next over `--ramp` frames, so the probabilities disagree with the ground
  truth near every boundary (as a frame model does where the mucosa changes gradually);
- **probability drift between devices**: each video comes from one of `--devices` capsules;
  each (device, label) adds a logit offset N(0, `--device-sd`), and each video a slow drift
  (AR(1) with correlation 0.999, standard deviation `--drift-sd`) to every label's logit;
- **false-positive bursts**: per video and finding, Poisson(`--bursts`) bursts of 5-60 frames
  where the finding's score jumps by its separation + 1 (an artefact, bubbles, a lookalike);
- **miscalibration**: per label, the logit is multiplied by a temperature in [0.5, 2] and
  shifted by N(0, 1) (the same for every video: a property of the model).

The boundary noise is information the probabilities do not hold: `oracle_region_runs_as_scored`
(the region runs exactly where the blurred truth puts them, what a perfect decoder of the
region scores would emit) is the ceiling of one event per region here, next to
`oracle_region_runs` (the true runs).

What would lift the regions above that: `oracle_..._cut_at_true_*` are those runs followed by
their pieces cut at the *exact* ground-truth events of some findings (the engine's
`region_cuts` with a perfect finding decoder): the ground truth is fragmented wherever a
finding starts or ends, and only a decoder that places those events exactly earns the pieces
(`..._jitter1`: the same with each of those events' ends moved by N(0, 1) frames, rounded).

The noise is AR(1) with correlation `--rho` (0.8 by default; `bench.simulate` uses 0.9), the
per-label separations come from the seed's AUCs as there.

Run: python -m bench.simulate2 [--seed 0] [--videos N] [--with-classic]   (about 2 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import pandas as pd
from scipy.signal import lfilter
from scipy.special import expit
from scipy.stats import norm

from bench.simulate import FIXTURE, ROOT, SEED_AUC, run_protocol, setup
from vce.core.labels import LABELS, PATHOLOGY, REGIONS
from vce.post.engine.candidates import _pieces
from vce.post.runs import runs_of


def _ar1(rng, shape, rho: float) -> np.ndarray:
    return lfilter([np.sqrt(1 - rho**2)], [1.0, -rho], rng.standard_normal(shape), axis=0)


def blurred_regions(regions: np.ndarray, rng, boundary_sd: float, ramp: int) -> np.ndarray:
    """(T, 5) soft region truth: every boundary shifted by N(0, boundary_sd), ramped over `ramp` frames."""
    n = len(regions)
    state = regions.argmax(axis=1).astype(float)
    state[regions.sum(axis=1) == 0] = np.nan
    changes = np.flatnonzero(np.diff(regions.argmax(axis=1)) != 0) + 1
    # The soft state index: piecewise linear between consecutive shifted boundaries.
    soft = np.nan_to_num(state, nan=0.0).copy()
    for c in changes:
        before, after = regions[c - 1].argmax(), regions[c].argmax()
        centre = c + rng.normal(0, boundary_sd)
        lo, hi = int(max(centre - ramp / 2, 0)), int(min(centre + ramp / 2, n))
        if hi > lo:
            t = np.arange(lo, hi)
            frac = np.clip((t - (centre - ramp / 2)) / max(ramp, 1), 0, 1)
            soft[lo:hi] = before + (after - before) * frac
    out = np.zeros((n, len(REGIONS)))
    for k in range(len(REGIONS)):
        out[:, k] = np.clip(1 - np.abs(soft - k), 0, 1)
    return out


def as_scored_runs(video_id: str, times: np.ndarray, soft: np.ndarray) -> dict:
    """One video's region runs where the blurred truth `soft` (T, 5) puts them (argmax, frames
    without a region skipped): the exact runs a perfect decoder of the region scores could find."""
    state = np.where(soft.sum(axis=1) > 0, soft.argmax(axis=1), -1)
    events = []
    for k, region in enumerate(REGIONS):
        events += [{"start": int(times[a]), "end": int(times[b]), "label": [region]}
                   for a, b in zip(*runs_of(state == k))]
    return {"video_id": video_id, "events": events}


def cut_at_true_events(gt: dict, runs: dict, labels: set, order: str = "shortest") -> dict:
    """Each region run of `runs`, then its pieces cut wherever an event of `labels` starts or
    ends + 1 in the ground truth `gt`, ranked as the engine ranks its cut pieces (`_pieces`,
    `order`: shortest or longest first; the engine picks one per region, `cut_orders`)."""
    by_id = {video["video_id"]: video["events"] for video in runs["videos"]}
    videos = []
    for video in gt["videos"]:
        cuts = sorted({t for e in video["events"] if set(e["label"]) & labels for t in (e["start"], e["end"] + 1)})
        events = []
        for run in by_id.get(video["video_id"], []):
            pieces = _pieces(run["start"], run["end"], cuts, order)
            events += [run] + [{"start": s, "end": e, "label": run["label"]} for s, e in pieces]
        videos.append({"video_id": video["video_id"], "events": events})
    return {"videos": videos}


def jittered(gt: dict, labels: set, sd: float, rng) -> dict:
    """`gt` with the start and end of every event holding one of `labels` moved by N(0, sd) frames (rounded)."""
    def move(event):
        if not set(event["label"]) & labels:
            return event
        start, end = (int(event[key] + np.rint(rng.normal(0, sd))) for key in ("start", "end"))
        return {**event, "start": start, "end": max(end, start)}
    return {"videos": [{**video, "events": [move(e) for e in video["events"]]} for video in gt["videos"]]}


def simulate_probs2(frame_labels: pd.DataFrame, rng, args) -> tuple[pd.DataFrame, dict]:
    """Frame probabilities under the error model of the module docstring, and the region runs
    as the region scores place them (`as_scored_runs`, a ceiling for any decoder)."""
    auc = np.array([max(SEED_AUC[label], 0.5) for label in LABELS])
    separation = np.sqrt(2.0) * norm.ppf(auc)  # (17,)
    temperature = rng.uniform(0.5, 2.0, len(LABELS))
    shift = rng.normal(0, 1, len(LABELS))
    device_offset = rng.normal(0, args.device_sd, (args.devices, len(LABELS)))
    region_cols = [LABELS.index(r) for r in REGIONS]
    finding_cols = [LABELS.index(f) for f in PATHOLOGY]
    out = frame_labels[["video_id", "t"]].copy()
    probs = np.empty((len(frame_labels), len(LABELS)), np.float32)
    as_scored = []
    times = frame_labels["t"].to_numpy()
    for video_id, rows in frame_labels.groupby("video_id", sort=False).indices.items():
        truth = frame_labels.iloc[rows][list(LABELS)].to_numpy(dtype=np.float64)  # (T, 17)
        signal = truth.copy()
        signal[:, region_cols] = blurred_regions(truth[:, region_cols], rng, args.boundary_sd, args.ramp)
        as_scored.append(as_scored_runs(video_id, times[rows], signal[:, region_cols]))
        z = separation * signal + _ar1(rng, truth.shape, args.rho) - separation / 2
        z += device_offset[rng.integers(args.devices)] + args.drift_sd * _ar1(rng, truth.shape, 0.999)
        for k in finding_cols:
            for _ in range(rng.poisson(args.bursts)):
                length = int(rng.integers(5, 61))
                start = int(rng.integers(0, max(len(z) - length, 1)))
                burst = slice(start, start + length)
                z[burst, k] += (separation[k] + 1) * (truth[burst, k] == 0)
        probs[rows] = expit(z * temperature + shift)
    out[list(LABELS)] = probs
    return out, {"videos": as_scored}


def parser() -> argparse.ArgumentParser:
    """The simulator's command line (its error model's knobs and the protocol's)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rho", type=float, default=0.8, help="AR(1) correlation of consecutive frames' noise")
    parser.add_argument("--boundary-sd", type=float, default=8.0, help="region boundary shift, frames (std)")
    parser.add_argument("--ramp", type=int, default=30, help="frames over which a region's score ramps to the next")
    parser.add_argument("--devices", type=int, default=3)
    parser.add_argument("--device-sd", type=float, default=0.7, help="per (device, label) logit offset (std)")
    parser.add_argument("--drift-sd", type=float, default=0.5, help="slow within-video logit drift (std)")
    parser.add_argument("--bursts", type=float, default=3.0, help="mean false-positive bursts per (video, finding)")
    parser.add_argument("--fixture", default=str(FIXTURE))
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--videos", type=int, default=0, help="use a random subset of this many videos (0: all 80)")
    parser.add_argument("--with-classic", action="store_true", help="also the tune_on_map variants (minutes)")
    return parser


def defaults():
    """The error model's default knobs (`bench.engine_speed`)."""
    return parser().parse_args([])


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    began = time.perf_counter()
    gt, frame_labels, rng, event_params, threshold_params = setup(args)
    frame_probs, as_scored = simulate_probs2(frame_labels, rng, args)
    true_ab, jitter_ab = gt, jittered(gt, {"angiectasia", "blood"}, 1.0, np.random.default_rng(args.seed + 1))
    ceilings = {"oracle_region_runs_as_scored": as_scored}
    for order, suffix in (("shortest", ""), ("longest", "_longest_first")):  # the engine picks one per region
        ceilings |= {f"oracle_region_runs_as_scored_cut_at_true_angiectasia_blood{suffix}":
                     cut_at_true_events(true_ab, as_scored, {"angiectasia", "blood"}, order),
                     f"oracle_region_runs_as_scored_cut_at_true_angiectasia_blood_jitter1{suffix}":
                     cut_at_true_events(jitter_ab, as_scored, {"angiectasia", "blood"}, order),
                     f"oracle_region_runs_as_scored_cut_at_true_findings{suffix}":
                     cut_at_true_events(gt, as_scored, set(PATHOLOGY), order)}
    results = run_protocol(gt, frame_labels, frame_probs, rng, event_params, threshold_params, not args.with_classic,
                           ceilings=ceilings)
    model = {key: getattr(args, key) for key in ("seed", "rho", "boundary_sd", "ramp", "devices", "device_sd", "drift_sd", "bursts")}
    print(json.dumps({"model": {**model, "videos": args.videos or len(gt["videos"])}, **results,
                      "seconds": round(time.perf_counter() - began, 1)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
