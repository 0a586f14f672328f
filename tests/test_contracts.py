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
