"""The score engine: decode what the official metric rewards, label by label, learned on held-out videos.

The metric scores every (video, label) on its own and ranks a label's events by file order, so
the engine builds the submission label by label and tunes it the same way, on the tuning
videos' probabilities and ground truth (`thresholds.method: engine`, knobs `thresholds.engine`).
Design and measurements: docs/engine.md. One module per concern:

- `params`: the knobs (`EngineParams`); `policies`: one typed policy per label, its JSON and how it
  decodes; `fitted`: the fitted engine (`Engine`) holding them, and its JSON;
- `regions`: ground truth on the frame axis, calibrated region emissions, the decoded path, the region phase;
- `calibration`: findings re-centred per video and read through per-label temperatures;
- `candidates`: each label's ranked events per video; `variants`: spans learned from the ground truth;
- `gate`: the per-label objective, the presence gates and the joint presence model;
- `findings`: the label phase (off, decoded runs, anchors); `fit`: `fit_engine`, `cross_fit`;
- `apply`: `engine_submission`, the metric-optimal submission and the clinical event list (each
  phase asks the policies to decode themselves).
"""

from vce.post.engine.apply import engine_submission, tuning_timeline
from vce.post.engine.findings import presence_rates
from vce.post.engine.fit import cross_fit, fit_engine
from vce.post.engine.fitted import Engine
from vce.post.engine.params import EngineParams

__all__ = ["Engine", "EngineParams", "cross_fit", "engine_submission", "fit_engine", "presence_rates", "tuning_timeline"]
