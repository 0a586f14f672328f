"""The files stages hand to each other: their schemas, readers and writers.

Every file format that one stage writes and another reads is defined here once, so a change
to a format is made in one place and every reader sees it:

- frame index (`data/index/*.parquet`, `data/split/*.parquet`): video_id, frame, index,
  path, label columns, split — read with `read_index`; the test set is `all_test_frames` of the test
  index and the held-out labelled videos;
- probabilities (`data/predict/<split>.parquet`, `data/temporal/<split>.parquet`):
  `probs_schema()`, written by `write_probs`; `post.probs` picks which one later stages read
  (`probs_file`; `auto` reads data/temporal, which then holds each label's routed probabilities);
- embeddings (`data/predict/<split>_embeddings.parquet`): `embeddings_schema(dim)`.

This module needs neither torch nor torchvision: post-processing and scoring import it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from vce.core.errors import DataError
from vce.core.io import atomic_path
from vce.core.labels import LABELS

PROBS_SOURCES = ("frame", "temporal", "auto")  # which probabilities feed thresholds and events


KEYS = ("video_id", "frame")  # one row per frame of a video in every frame table


def read_index(path: str | Path, columns: list[str] | None = None) -> pd.DataFrame:
    """Read a frame table (index, split, probabilities) from Parquet without touching pixels.

    A file that is not Parquet, a requested column it lacks, or a (video_id, frame) key written
    twice is one line naming the file: later joins would otherwise fail with a pandas traceback
    or, worse, match a frame twice."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"frame table not found: {path}")
    schema = parquet_schema(path)
    missing = [c for c in (columns or []) if c not in schema.names]
    if missing:
        raise DataError(f"{path}: no column(s) {missing} (has {schema.names[:8]}…)")
    try:
        table = pd.read_parquet(path, columns=columns)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: unreadable Parquet ({_first_line(err)})") from None
    check_unique_keys(table, path)
    return table


def parquet_schema(path: str | Path) -> pa.Schema:
    """The Arrow schema of a Parquet file; a file that is not Parquet is one line naming it."""
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: not a Parquet file ({_first_line(err)})") from None


def _first_line(err: BaseException) -> str:
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def check_unique_keys(table: pd.DataFrame, path: str | Path) -> None:
    """Each (video_id, frame) at most once: a duplicate names the file and its first repeat."""
    if not all(key in table.columns for key in KEYS) or not len(table):
        return
    repeated = table.duplicated(list(KEYS)).to_numpy()
    if repeated.any():
        row = int(np.flatnonzero(repeated)[0])
        raise DataError(f"{path}: video {table['video_id'].iloc[row]} frame {table['frame'].iloc[row]} appears "
                        f"more than once (row {row}, {int(repeated.sum())} repeat(s)): one row per frame")


def read_probs(path: str | Path, columns: list[str] | None = None) -> pd.DataFrame:
    """Read a probabilities file and hold it to the contract (`check_probs`)."""
    columns = None if columns is None else list(dict.fromkeys([*KEYS, *columns]))
    probs = read_index(path, columns)
    check_probs(probs, path, None if columns is None else [c for c in columns if c in probs_schema().names])
    return probs


def check_probs(probs: pd.DataFrame, path: str | Path, required: list[str] | None = None) -> None:
    """The probabilities contract on a read table: the columns (`valid` may be absent: every row
    is then valid), their dtypes, and on valid rows a finite probability in [0, 1] for every
    label. NaN is never a probability: one NaN label would silently erase events downstream."""
    required = list(required if required is not None else [c for c in probs_schema().names if c != "valid"])
    missing = [c for c in required if c not in probs.columns]
    if missing:
        raise DataError(f"{path}: probabilities lack column(s) {missing}")
    kinds = {"video_id": lambda d: pd.api.types.is_string_dtype(d) or pd.api.types.is_object_dtype(d),
             "frame": pd.api.types.is_integer_dtype, "valid": pd.api.types.is_bool_dtype}
    for column in probs.columns:
        ok = kinds.get(column, pd.api.types.is_float_dtype if column in LABELS else None)
        if ok is not None and not ok(probs[column].dtype):
            raise DataError(f"{path}: column {column!r} has dtype {probs[column].dtype}, "
                            f"the contract's is {probs_schema().field(column).type}")
    valid = probs["valid"].to_numpy(bool) if "valid" in probs.columns else np.ones(len(probs), bool)
    for label in (c for c in LABELS if c in probs.columns):
        values = probs[label].to_numpy()
        bad = valid & ~((values >= 0.0) & (values <= 1.0))  # NaN fails both comparisons
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise DataError(f"{path}: column {label!r} is {values[row]} on valid row {row} (video "
                            f"{probs['video_id'].iloc[row]} frame {probs['frame'].iloc[row]}; "
                            f"{int(bad.sum())} such row(s)): a probability is finite and in [0, 1]")


def all_test_frames(test: pd.DataFrame, held_out: pd.DataFrame | None) -> pd.DataFrame:
    """The test set's frame index: the unlabelled test index (`data/index/test.parquet`) and the
    labelled videos `split.test_videos` holds out (`data/split/test.parquet`), in the test
    index's columns; a video id in both is an error."""
    if held_out is None or not len(held_out):
        return test
    both = sorted(set(test["video_id"].astype(str)) & set(held_out["video_id"].astype(str)))
    if both:
        raise DataError(f"video id(s) {both[:5]} are both a data.test_root video and a held-out labelled "
                        "video (split.test_videos): rename one of them")
    columns = [c for c in test.columns if c in held_out.columns]
    return pd.concat([test[columns], held_out[columns]], ignore_index=True)


def label_matrix(frames: pd.DataFrame) -> np.ndarray:
    """(N, 17) uint8 label matrix in LABELS order; raises naming a missing label column."""
    missing = [label for label in LABELS if label not in frames.columns]
    if missing:
        raise DataError(f"frame index has no label column(s) {missing}")
    return frames[list(LABELS)].to_numpy(dtype=np.uint8)


def probs_schema() -> pa.Schema:
    """The probabilities contract: video_id, frame, 17 float32 label columns, valid flag."""
    return pa.schema([("video_id", pa.string()), ("frame", pa.int64())]
                     + [(label, pa.float32()) for label in LABELS] + [("valid", pa.bool_())])


def embeddings_schema(dim: int) -> pa.Schema:
    """The embeddings contract: video_id, frame, a float16 vector of `dim` values."""
    return pa.schema([("video_id", pa.string()), ("frame", pa.int64()),
                      ("embedding", pa.list_(pa.float16(), dim))])


def write_probs(path: str | Path, table: pd.DataFrame) -> None:
    """Write a probabilities frame (the contract's columns) atomically."""
    with atomic_path(path) as tmp:
        pq.write_table(pa.Table.from_pandas(table, schema=probs_schema(), preserve_index=False), tmp)


def temporal_probs(source: str) -> bool:
    """Whether the probabilities `source` names (`post.probs`, or the `probs` a thresholds.json
    was tuned on) are the temporal stage's (`data/temporal`: the temporal model's refined ones, or
    for `auto` each label's routed ones, `vce.infer.route`) rather than the frame model's
    (`data/predict`); an unknown source is an error."""
    if source not in PROBS_SOURCES:
        raise DataError(f"unknown probabilities source {source!r}; allowed: {list(PROBS_SOURCES)}")
    return source in ("temporal", "auto")


def probs_file(source: str, split: str, predict_dir: str | Path, temporal_dir: str | Path) -> Path:
    """`<split>.parquet` of the probabilities `source` names: in `temporal_dir` or `predict_dir`."""
    return Path(temporal_dir if temporal_probs(source) else predict_dir) / f"{split}.parquet"
