"""The probabilities route: `post.probs` names the folder every later stage reads."""

from pathlib import Path

import pytest

from vce.core.contracts import probs_file, temporal_probs
from vce.core.errors import DataError


def test_post_probs_picks_the_temporal_or_the_frame_models_folder():
    assert probs_file("temporal", "val", "data/predict", "data/temporal") == Path("data/temporal/val.parquet")
    assert probs_file("frame", "test", "data/predict", "data/temporal") == Path("data/predict/test.parquet")
    assert temporal_probs("temporal") and not temporal_probs("frame")
    # auto: the temporal stage writes each label's routed probabilities (frame, temporal or blend) there
    assert probs_file("auto", "test", "data/predict", "data/temporal") == Path("data/temporal/test.parquet")


def test_an_unknown_source_is_refused_by_name():
    with pytest.raises(DataError, match=r"unknown probabilities source 'tcn'; allowed: \['frame', 'temporal', 'auto'\]"):
        probs_file("tcn", "val", "data/predict", "data/temporal")


def _probs_file(path, **columns):
    import numpy as np
    import pandas as pd

    from vce.core.labels import LABELS

    table = pd.DataFrame({"video_id": ["a", "a", "b"], "frame": np.array([0, 1, 0], np.int64),
                          **{label: np.full(3, 0.2, np.float32) for label in LABELS}, "valid": True})
    for name, values in columns.items():
        table[name] = values
    table.to_parquet(path, index=False)
    return path


def test_read_probs_checks_only_the_columns_asked_for_and_treats_a_missing_valid_as_all_valid(tmp_path):
    """Mutations killed: requiring every label when a reader asks for `valid` alone (temporal_fit),
    skipping the finite check when `valid` is absent."""
    import numpy as np

    from vce.core.contracts import read_probs

    path = _probs_file(tmp_path / "p.parquet", blood=np.array([0.2, np.nan, 0.2], np.float32),
                       valid=[True, False, True])
    assert read_probs(path)["valid"].tolist() == [True, False, True]  # NaN on an invalid row: a gap
    assert list(read_probs(path, ["valid"]).columns) == ["video_id", "frame", "valid"]
    no_valid = _probs_file(tmp_path / "q.parquet", blood=np.array([0.2, np.nan, 0.2], np.float32))
    table = __import__("pandas").read_parquet(no_valid).drop(columns="valid")
    table.to_parquet(no_valid, index=False)
    with pytest.raises(DataError, match=r"q.parquet: column 'blood' is nan on valid row 1 \(video a frame 1;"):
        read_probs(no_valid)
    with pytest.raises(DataError, match=r"q.parquet: no column\(s\) \['valid'\]"):
        read_probs(no_valid, ["valid"])
