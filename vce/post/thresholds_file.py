"""`models/thresholds.json`: its schema, and the one writer and reader of it.

The thresholds stage writes it (`write_thresholds`); the events stage and `vce.infer.detect`
read it (`read_thresholds`), which checks everything before any output is touched. Keys:

    method             f1 | map | engine: how it was fitted (params.yaml `thresholds.method`)
    probs              frame | temporal | auto: the probabilities it was fitted on (`post.probs`)
    thresholds         label -> threshold for all 17 labels (a number >= 0; above 1: never fires)
    events             method map: the tuned event post-processing (`EventParams`); else null
    engine             method engine: the fitted score engine (`Engine.to_dict`); else null
    thresholds_sha256  method engine: the thresholds' checksum. The engine decides every event and
                       the thresholds are only a report (shown by the report and viewer): an edit
                       to them would change nothing, silently, so an edited one is refused.

A method whose block is missing (an engine without `engine`: plain thresholds would decode it
silently) or a block the method does not use is refused in one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from vce.core.contracts import PROBS_SOURCES
from vce.core.errors import DataError
from vce.core.io import read_json, write_json
from vce.core.labels import LABELS, check_labels
from vce.post.engine import Engine

METHODS = ("f1", "map", "engine")
# The block each method needs; the others must be null.
_BLOCKS = {"f1": None, "map": "events", "engine": "engine"}


@dataclass(frozen=True)
class SavedThresholds:
    """A checked thresholds.json: `engine` parsed, `saved` the file as read (for the report and viewer)."""

    method: str
    probs: str
    thresholds: dict[str, float]
    events: dict | None
    engine: Engine | None
    saved: dict


def thresholds_checksum(thresholds: dict) -> str:
    """sha256 of the per-label thresholds as JSON (sorted keys): `thresholds_sha256`."""
    return hashlib.sha256(json.dumps(thresholds, sort_keys=True).encode()).hexdigest()


def write_thresholds(path, method: str, probs: str, thresholds: dict, events: dict | None, engine: dict | None) -> None:
    """Write thresholds.json (through `vce.core.io`: one output of the stage's set)."""
    saved = {"method": method, "probs": probs, "thresholds": thresholds, "events": events, "engine": engine}
    if method == "engine":
        saved["thresholds_sha256"] = thresholds_checksum(thresholds)
    check_saved(saved, path)  # never write what the reader refuses
    write_json(path, saved)


def read_thresholds(path) -> SavedThresholds:
    """Read and check thresholds.json (module docstring); every problem is one line naming the file."""
    try:
        saved = read_json(path, "thresholds file")
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{err} (run the thresholds stage)") from None
    check_saved(saved, path)
    engine = Engine.from_dict(saved["engine"], f"{path}:engine") if saved["method"] == "engine" else None
    return SavedThresholds(saved["method"], saved["probs"], saved["thresholds"], saved.get("events"), engine, saved)


def check_saved(saved, path) -> None:
    """The schema's rules (module docstring), each a `DataError` naming `path`."""
    if not isinstance(saved, dict):
        raise DataError(f"{path}: not a JSON object (run the thresholds stage)")
    method = saved.get("method")
    if method not in METHODS:
        raise DataError(f"{path}: method {method!r}: must be one of {list(METHODS)} (run the thresholds stage)")
    if saved.get("probs") not in PROBS_SOURCES:
        raise DataError(f"{path}: probs {saved.get('probs')!r}: must be one of {list(PROBS_SOURCES)}")
    thresholds = saved.get("thresholds")
    if not isinstance(thresholds, dict):
        raise DataError(f"{path}: no 'thresholds' mapping label -> threshold (run the thresholds stage)")
    check_labels(thresholds, str(path))
    missing = [label for label in LABELS if label not in thresholds]
    if missing:
        raise DataError(f"{path}: thresholds lack label(s) {missing} (run the thresholds stage)")
    for label, value in thresholds.items():
        # Above 1 means "never fires" (labels without validation positives); NaN fails `>=`.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0.0:
            raise DataError(f"{path}: threshold of '{label}' is {value!r}, must be a number >= 0")
    for block in ("events", "engine"):
        present = saved.get(block) is not None
        if block == _BLOCKS[method] and not isinstance(saved.get(block), dict):
            raise DataError(f"{path}: method {method} needs its '{block}' block, which is "
                            f"{'missing' if not present else 'not a mapping'}: rerun the thresholds stage")
        if block != _BLOCKS[method] and present:
            raise DataError(f"{path}: method {method} with an '{block}' block, which only method "
                            f"{'map' if block == 'events' else 'engine'} writes: rerun the thresholds stage")
    if method == "engine":
        _check_checksum(saved, path)


def _check_checksum(saved: dict, path) -> None:
    stored = saved.get("thresholds_sha256")
    if stored is None:
        raise DataError(f"{path}: method engine without 'thresholds_sha256' (written by an older version or "
                        "edited): rerun the thresholds stage")
    if thresholds_checksum(saved["thresholds"]) != stored:
        raise DataError(f"{path}: its 'thresholds' were edited, but under method engine the engine decides the "
                        "events, not them: rerun the thresholds stage (or use thresholds.method f1/map to set them)")

