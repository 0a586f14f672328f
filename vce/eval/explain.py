"""How each label is decided, and why a label emits nothing: one explanation per label.

`explain_labels` is the one source of what metrics/report.md and the exam viewer say about a
label (its route, how it is decided, its events, why it is silent): the report stage computes it
once per set and hands the same rows to both, so a reader of either meets the same reason.
Read from `models/thresholds.json`, `metrics/route.json` and the set's probabilities and events.

A label with a tuned threshold and no event reads like a bug; usually a rule of the post-
processing kept it silent on purpose. For the score engine (`thresholds.method: engine`) the
policy says which: `off` (silence beat every decoding tried on the tuning videos by less than
the min-gain bar, or a region whose gate admits no video), or a presence gate no video's
evidence reached. For the threshold methods (`f1`, `map`) it is the threshold (off above 1),
the presence threshold or the minimum length (`events`, tuned or from params.yaml). The
numbers come with the reason: the tuning AP, the bar, the gate and the peak frame probability
of the label in each video of the set (the strongest run's mean probability, what a `max`
gate reads, is at most that peak).
"""

from __future__ import annotations

import math

import pandas as pd

from vce.core.labels import LABEL_INDEX, LABELS, REGIONS

# How the official metric scores a label absent from a video (stated where a tAP is shown).
ABSENT_RULE = ("a label absent from a video scores AP 1 there when nothing of it is predicted and 0 after "
               "one event; a silent label present in some videos scores the share of videos it is absent from")


def explain_labels(saved: dict, probs: pd.DataFrame, prediction: dict, routes: dict | None,
                   n_tuning_videos: int | None, min_gain_sqrt_videos: float, events: dict | None) -> dict[str, dict]:
    """label -> {route, decision, events, silent}: the one explanation of each label in a set.

    probs: video_id and the 17 label columns (NaN: no valid frame); prediction: the set's events
    (official JSON); routes: metrics/route.json's `routes` (None: unknown); the rest as
    `silence_reason`. `silent` is None for a label with an event, else why it has none.
    """
    maxima = probs.groupby("video_id", sort=False)[list(LABELS)].max()  # NaN: no valid frame
    counts = dict.fromkeys(LABELS, 0)
    for video in prediction["videos"]:
        for event in video["events"]:
            for label in event["label"]:
                counts[label] += 1
    rows = {}
    for label in LABELS:
        silent = None
        if counts[label] == 0:
            peaks = {str(v): float(p) for v, p in maxima[label].items()}
            silent = silence_reason(saved, label, peaks, n_tuning_videos, min_gain_sqrt_videos, events)
        rows[label] = {"route": (routes or {}).get(label), "decision": decision(saved, label),
                       "events": counts[label], "silent": silent}
    return rows


def _spec(spec: dict) -> str:
    """A run decoding as a reader can compare it with params.yaml."""
    if spec.get("detector") == "ar":
        return f"autoregressive HMM runs (min length {spec.get('min_length')})"
    return (f"threshold {spec.get('threshold')}, median window {spec.get('median_window')}, "
            f"min length {spec.get('min_length')}")


def _gate(policy: dict) -> str:
    gate = policy.get("gate")
    if gate is None:
        return "no presence gate"
    if policy.get("kind") in ("region", "head"):
        return f"presence gate {gate:.3g} (the region's evidence)"
    return f"presence gate: {policy.get('evidence', 'max')} evidence >= {gate:.3f}"


def decision(saved: dict, label: str) -> str:
    """One line: how `label` becomes events (the engine's policy, or the threshold)."""
    policy = (saved.get("engine") or {}).get("policies", {}).get(label)
    if policy is None:
        value = float(saved["thresholds"][label])
        return f"off (threshold {value:g})" if value > 1.0 else f"threshold {value:.2f}"
    kind = policy["kind"]
    if kind == "off":
        return "engine: off"
    if kind == "runs":
        centres = (saved.get("engine") or {}).get("centres") or []
        moved = " on re-centred probabilities" if LABEL_INDEX[label] < len(centres) and centres[LABEL_INDEX[label]] \
            is not None else ""
        return f"engine: runs ({_spec(policy)}{moved}); {_gate(policy)}"
    if kind == "anchored":
        return f"engine: anchored at the decoded boundary ({len(policy.get('anchors', []))} offsets)"
    return f"engine: {kind} path; {_gate(policy)}"


def drawn_threshold(saved: dict, label: str) -> float | None:
    """The threshold a timeline draws for `label`: the one that cuts its runs, or None.

    Threshold methods: the label's threshold (None when off, above 1). Engine: a thresholded-
    runs policy's run threshold (on the re-centred probabilities when the engine re-centres);
    none for regions, autoregressive runs, anchors and `off`, which no threshold decides.
    """
    policy = (saved.get("engine") or {}).get("policies", {}).get(label)
    if policy is None:
        value = float(saved["thresholds"][label])
        return None if value > 1.0 else value
    if policy["kind"] == "runs" and policy.get("detector") == "threshold":
        return float(policy["threshold"])
    return None


def _peaks(peaks: dict) -> str:
    shown = [f"{p:.2f} ({video_id})" for video_id, p in peaks.items() if not math.isnan(p)]
    return "peak frame probability per video: " + (", ".join(shown) if shown else "no valid frame")


def silence_reason(saved: dict, label: str, peaks: dict, n_tuning_videos: int | None, min_gain_sqrt_videos: float,
                   events: dict | None) -> str:
    """Why `label` has no event in a set, with the numbers.

    saved: models/thresholds.json; peaks: video id -> the label's highest valid frame probability
    in the set; n_tuning_videos: the validation videos the engine was fitted on (None: unknown);
    min_gain_sqrt_videos: params.yaml thresholds.engine; events: the event knobs the events
    stage used (tuned ones from thresholds.json, else params.yaml `events`), for threshold methods.
    """
    policy = (saved.get("engine") or {}).get("policies", {}).get(label)
    peak = max((p for p in peaks.values() if not math.isnan(p)), default=float("nan"))
    if policy is not None:
        kind = policy["kind"]
        tuning = policy.get("tuning_ap")
        if kind == "off" and label in REGIONS:
            return f"engine policy off: the region's presence gate admits no tuning video (tuning AP {tuning:.3f})"
        if kind == "off":
            best = f" (the best: {_spec(policy['shadow'])})" if "shadow" in policy else ""
            if n_tuning_videos is None:  # one exam outside the pipeline: the tuning set is not known here
                on, bar = "", f"{min_gain_sqrt_videos:g} x sqrt(tuning videos) summed AP"
            else:
                on = f" on the {n_tuning_videos} tuning videos"
                bar = (f"{min_gain_sqrt_videos:g} x sqrt({n_tuning_videos}) = "
                       f"{min_gain_sqrt_videos * math.sqrt(n_tuning_videos):.3f} summed AP")
            return (f"engine policy off: silence scores tuning AP {tuning:.3f} per video{on}, and no decoding "
                    f"tried{best} beat it by the min-gain bar {bar}")
        return (f"engine {kind} policy ({_gate(policy)}): no video of the set passed it or had a run; {_peaks(peaks)}")
    threshold = float(saved["thresholds"][label])
    if threshold > 1.0:
        return (f"threshold off ({threshold:g}): the thresholds stage switched it off (no validation positives, "
                "or emitting nothing scored best)")
    if math.isnan(peak) or peak < threshold:
        return f"no frame reached the threshold {threshold:.2f}; {_peaks(peaks)}"
    knobs = {**(events or {}), **((events or {}).get("per_label") or {}).get(label, {})}
    if knobs.get("presence") == "max":
        return (f"frames pass the threshold {threshold:.2f}, but no event's mean probability reached the presence "
                f"threshold {knobs.get('presence_threshold')} (events.presence max); {_peaks(peaks)}")
    if knobs.get("presence") == "frames":
        return (f"frames pass the threshold {threshold:.2f}, but no video had presence_min_frames "
                f"{knobs.get('presence_min_frames')} event frames (events.presence frames); {_peaks(peaks)}")
    return (f"frames pass the threshold {threshold:.2f}, but no run survived the median window "
            f"{knobs.get('median_window')} and min length {knobs.get('min_length')}; {_peaks(peaks)}")
