"""What a landmark placed at the *true* region boundary earns, emitted in every video: the bound on
landmarks without a presence signal.

On the real Galar timelines (`../shared/fixtures/galar_gt_events.json`, 80 videos), per landmark:
each video with a true crossing into the region the landmark marks (its first event of a region
at or after it, following one before it) emits the landmark's spans (offset, length) from that
crossing, learned on the *other* videos (leave one out), weighted by their share of their video's
events and ranked by that weight, the first `--candidates` of them. Scored by the official metric
per (video, label): AP on the videos that hold the landmark, silence credit lost on those that
do not. Printed: per landmark, the videos with a crossing and those that hold it, the mean AP
over the holding ones at tIoU 0.5 and 0.95, and the summed gain over silence (mean of both
thresholds) of emitting it everywhere: negative means no exact boundary can make the landmark
pay without a gate that predicts where it is present. Then the best such gate can do from the
*true* anatomy (`loo_gate_gain`): per feature of a video's anatomy around the crossing (the
crossing's position, the length of the region before and after it), a threshold and direction
chosen on the other videos by the engine's gate rule (`fit_gate`) decide whether the held-out one emits; printed is the summed gain of
those leave-one-out decisions (0: silence everywhere), an upper bound for a presence gate on the
decoded anatomy. The same three figures follow per tIoU threshold (`at_0.5`, `at_0.95`: the gate
fitted to that threshold's gains alone), the bound for an acceptance read at each threshold: a
landmark whose gate earns nothing at 0.95 even here is not to be expected to earn there from the
decoded anatomy.

Run: python -m bench.landmark_oracle [--candidates 30]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.simulate import FIXTURE
from vce.core.labels import LABEL_INDEX, LANDMARKS, REGIONS
from vce.eval.score import average_precisions
from vce.post.engine.gate import fit_gate


def true_crossing(events: list, region: int) -> int | None:
    """The start of the first event of a region >= `region` that follows one of a lower region."""
    seen_before = False
    for event in events:
        states = [REGIONS.index(label) for label in event["label"] if label in REGIONS]
        if states and states[0] < region:
            seen_before = True
        if states and states[0] >= region and seen_before:
            return event["start"]
    return None


def loo_gate_gain(gain: np.ndarray, feature: np.ndarray) -> float:
    """Summed `gain` (V,) of the videos a leave-one-out gate admits: for each video, the engine's
    gate rule (`fit_gate`, silence worth 0) fitted on the other videos to `feature` and to minus it
    (the larger summed gain wins, `feature` on a tie; none positive: silence) decides whether that
    video emits."""
    total = 0.0
    for i in range(len(gain)):
        rest = np.arange(len(gain)) != i
        fits = [(fit_gate(d * feature[rest], gain[rest], np.zeros(len(gain) - 1)), d) for d in (1.0, -1.0)]
        (gate, value), d = max(fits, key=lambda fit: fit[0][1])  # max keeps the first of equal values
        if gate != float("inf") and (gate is None or d * feature[i] >= gate):
            total += float(gain[i])
    return total


def landmark_oracle(gt: dict, landmark: str, candidates: int) -> dict:
    region = REGIONS.index(LANDMARKS[landmark][1])
    rows = []  # (video, crossing, [(offset, length)])
    for video in gt["videos"]:
        at = true_crossing(video["events"], region)
        if at is not None:
            spans = [(e["start"] - at, e["end"] - e["start"] + 1) for e in video["events"] if landmark in e["label"]]
            rows.append((video, at, spans))
    truth, submission = {"videos": []}, {"videos": []}
    for i, (video, at, _) in enumerate(rows):
        weights: dict = defaultdict(float)
        for j, (_, _, spans) in enumerate(rows):
            if j != i:
                for span in spans:
                    weights[span] += 1.0 / len(spans)
        ranked = sorted(weights, key=lambda span: (-weights[span], span))[:candidates]
        events = [{"start": at + o, "end": at + o + n - 1, "label": [landmark]} for o, n in ranked]
        truth["videos"].append(video)
        submission["videos"].append({"video_id": video["video_id"], "events": events})
    _, aps = average_precisions(truth, submission)
    holds = np.array([bool(spans) for _, _, spans in rows])
    k = LABEL_INDEX[landmark]
    by_threshold = gains_over_silence(holds, {t: aps[t][:, k] for t in (0.5, 0.95)})
    gain = by_threshold.pop("mean")
    lengths = {name: np.array([sum(e["end"] - e["start"] + 1 for e in video["events"] if state in e["label"])
                               for video, _, _ in rows], np.float64)
               for name, state in (("region_before", REGIONS[region - 1]), ("region_after", REGIONS[region]))}
    features = {"crossing": np.array([at for _, at, _ in rows], np.float64), **lengths}

    def loo_gates(gain: np.ndarray) -> dict:
        return {name: round(loo_gate_gain(gain, x), 2) for name, x in features.items()}

    return {"videos_with_crossing": len(rows), "holding": int(holds.sum()),
            "ap_holding@0.5": round(float(aps[0.5][holds, k].mean()), 3),
            "ap_holding@0.95": round(float(aps[0.95][holds, k].mean()), 3),
            "gain_over_silence_emitted_everywhere": round(float(gain.sum()), 2),
            "gain_if_emitted_only_where_held": round(float(gain[holds].sum()), 2),
            "loo_gate_gain": loo_gates(gain),
            **{f"at_{t}": {"emitted_everywhere": round(float(g.sum()), 2),
                           "only_where_held": round(float(g[holds].sum()), 2),
                           "loo_gate_gain": loo_gates(g)}
               for t, g in by_threshold.items()}}


def gains_over_silence(holds: np.ndarray, aps: dict) -> dict:
    """Per tIoU threshold of `aps` (threshold -> (V,) AP) and for their mean ("mean"), each
    video's gain over silence if it emits: its AP where it holds the landmark (`holds`, (V,)
    bool), the silence credit lost (-1) where it does not."""
    out = {t: np.where(holds, ap, -1.0) for t, ap in aps.items()}
    out["mean"] = np.where(holds, np.mean([aps[t] for t in aps], axis=0), -1.0)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixture", default=str(FIXTURE))
    parser.add_argument("--candidates", type=int, default=30, help="spans emitted per video, heaviest first")
    args = parser.parse_args(argv)
    gt = json.loads(Path(args.fixture).read_text())
    print(json.dumps({landmark: landmark_oracle(gt, landmark, args.candidates) for landmark in LANDMARKS}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
