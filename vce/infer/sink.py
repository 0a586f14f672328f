"""The writer thread of streaming inference: batches of probabilities (and embeddings) into
Parquet while the next batches are decoded and predicted; and the per-stage clock of
`predict_frames(profile=...)`."""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from contextlib import contextmanager

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from vce.core.contracts import embeddings_schema, probs_schema
from vce.core.errors import DataError
from vce.core.labels import LABELS


def probs_table(frames: pd.DataFrame, probs: np.ndarray, valid: np.ndarray) -> pa.Table:
    columns = {"video_id": frames["video_id"].astype(str).to_numpy(), "frame": frames["frame"].to_numpy(np.int64)}
    columns.update({label: probs[:, i] for i, label in enumerate(LABELS)})
    columns["valid"] = valid
    return pa.Table.from_pydict(columns, schema=probs_schema())


def embedding_table(frames: pd.DataFrame, embeddings: np.ndarray) -> pa.Table:
    flat = pa.array(embeddings.astype(np.float16).reshape(-1), type=pa.float16())
    values = pa.FixedSizeListArray.from_arrays(flat, embeddings.shape[1])
    return pa.Table.from_arrays([pa.array(frames["video_id"].astype(str).to_numpy()),
                                 pa.array(frames["frame"].to_numpy(np.int64)), values],
                                schema=embeddings_schema(embeddings.shape[1]))


class StageClock:
    """Seconds per stage, for `predict_frames(profile=...)`: host stages by the wall clock, device
    stages by CUDA events read at the end (no synchronisation while running; the wall clock on
    CPU). Every call is a no-op when no profile is asked for."""

    def __init__(self, device, on: bool):
        self.on, self.cuda = on, device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)  # each thread adds to its own stages
        self.events: dict[str, list] = defaultdict(list)

    def add(self, name: str, seconds: float) -> None:
        if self.on:
            self.seconds[name] += seconds

    @contextmanager
    def host(self, name: str):
        began = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - began)

    @contextmanager
    def device(self, name: str):
        """Time the work enqueued inside on the current stream."""
        if not (self.on and self.cuda):
            with self.host(name):
                yield
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self.events[name].append((start, end))

    def summary(self) -> dict:
        for name, pairs in self.events.items():
            for start, end in pairs:
                end.synchronize()
                self.seconds[name] += start.elapsed_time(end) / 1e3
        return {name: round(seconds, 4) for name, seconds in sorted(self.seconds.items())}


_DONE = object()


class NonFiniteOutput(DataError):
    """The model produced NaN/inf for a decoded frame; the caller names the checkpoint."""


class ParquetSink:
    """The writer thread: each batch's probabilities (and embeddings) into the Parquet files.

    Batches come through a bounded queue, so the main thread runs at most `depth` batches ahead
    of the files; this thread waits for each batch's device→host copy, so the main thread never
    does. An error here ends the thread and is raised in the main thread by the next `put` or by
    `close` (never a hang on a full queue). Row groups hold whole batches, `row_group_frames` or
    more, as before the thread.
    """

    def __init__(self, frames, tmp_probs, tmp_emb, row_group_frames: int, embed_dim: int, clock: StageClock,
                 depth: int = 8):
        self.frames, self.tmp_emb, self.row_group_frames, self.embed_dim = frames, tmp_emb, row_group_frames, embed_dim
        self.clock = clock
        self.writer = pq.ParquetWriter(tmp_probs, probs_schema())
        self.emb_writer = None
        self.rows_seen = 0  # rows taken from the queue so far: names the frame of a bad output
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="predict-writer", daemon=True)
        self.thread.start()

    def put(self, batch) -> None:
        """Queue (probs, embedding or None, copy-done event or None, valid) of one batch."""
        while True:
            if self.error is not None:
                raise self.error
            try:
                self.queue.put(batch, timeout=0.1)
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Write what is pending and close the files; the writer's error, if any, is raised here."""
        self.put(_DONE)
        self.thread.join()
        if self.error is not None:
            raise self.error

    def abort(self) -> None:
        """Stop without finishing (the main thread failed: the outputs stay temporary)."""
        self.stopping.set()
        self.thread.join()

    def _run(self) -> None:
        pending, start = [], 0
        try:
            while not self.stopping.is_set():
                try:
                    item = self.queue.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is _DONE:
                    if pending or start == 0:
                        self._flush(pending, start)
                    self._finish()
                    return
                pending.append(self._host_arrays(*item))
                if sum(len(p[0]) for p in pending) >= self.row_group_frames:
                    start = self._flush(pending, start)
                    pending = []
        except BaseException as err:  # raised in the main thread
            self.error = err
        for writer in (self.writer, self.emb_writer):  # aborted or failed: release the files
            if writer is not None:
                try:
                    writer.close()
                except Exception:
                    pass

    def _host_arrays(self, probs, embedding, copied, valid):
        with self.clock.host("writer_wait_device"):
            if copied is not None:
                copied.synchronize()
        probs = np.array(probs.numpy())  # a copy: the pinned buffer goes back to its pool
        embedding = None if embedding is None else embedding.numpy()
        self._check_finite(probs, embedding, valid)
        probs[~valid] = np.nan
        embedding = None if embedding is None else embedding.astype(np.float16)  # as stored
        self.rows_seen += len(probs)
        return probs, valid, embedding

    def _check_finite(self, probs: np.ndarray, embedding: np.ndarray | None, valid: np.ndarray) -> None:
        """NaN is never a probability: a model that outputs NaN/inf on a decoded frame (diverged or
        corrupt weights) stops here, naming the first such frame, instead of writing rows that
        say valid=true and erase events downstream."""
        finite = np.isfinite(probs).all(axis=1)
        if embedding is not None:
            finite &= np.isfinite(embedding).all(axis=1)
        bad = valid & ~finite
        if bad.any():
            row = self.frames.iloc[self.rows_seen + int(np.flatnonzero(bad)[0])]
            raise NonFiniteOutput(f"the model output NaN/inf on {int(bad.sum())} decoded frame(s) of a batch, "
                                  f"first video {row['video_id']} frame {row['frame']}: its weights are not usable")

    def _flush(self, pending, start: int) -> int:
        with self.clock.host("writer_parquet"):
            if not pending:
                self.writer.write_table(probs_schema().empty_table())
                return start
            probs = np.concatenate([p[0] for p in pending])
            block = self.frames.iloc[start:start + len(probs)]
            self.writer.write_table(probs_table(block, probs, np.concatenate([p[1] for p in pending])))
            if self.tmp_emb is not None:
                embeddings = np.concatenate([p[2] for p in pending])
                if self.emb_writer is None:
                    self.emb_writer = pq.ParquetWriter(self.tmp_emb, embeddings_schema(embeddings.shape[1]))
                self.emb_writer.write_table(embedding_table(block, embeddings))
            return start + len(probs)

    def _finish(self) -> None:
        self.writer.close()
        self.writer = None
        if self.emb_writer is not None:
            self.emb_writer.close()
            self.emb_writer = None
        elif self.tmp_emb is not None:  # no frames: an empty embeddings table of the model's width
            pq.write_table(embeddings_schema(self.embed_dim).empty_table(), self.tmp_emb)
