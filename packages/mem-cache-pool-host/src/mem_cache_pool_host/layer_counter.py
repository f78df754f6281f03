"""Layer-wise load progress: readers of layer ``i`` wait until the loader has finished layer ``i``.

A load *batch* loads every layer of a pool once, in any order (normally ascending). The loader
(an IO thread) calls :meth:`LayerDoneCounter.begin`, then :meth:`complete` once per layer
(``HostKVCache.load_to_device_per_layer`` does this), and the batch ends when every layer is
complete. Readers (the forward pass, through the device pool's ``register_layer_transfer_counter``
and ``wait_until``) block only while a batch is in flight and their layer is not done yet; with
no batch in flight everything is ready and ``wait_until`` returns at once.

Errors never deadlock readers: :meth:`abort` (called by the loader when a transfer fails) wakes
every waiter with :class:`LayerLoadAbortedError`, and readers keep getting that error until the
next :meth:`begin` or :meth:`reset`, so a forward never reads a half-loaded layer silently.

Readers follow the latest batch by default. With CUDA events the loader can finish a batch on
the host (all copies queued) and begin the next one while the forward pass of the previous batch
is still being issued; :meth:`LayerDoneCounter.set_consumer` pins readers to a batch id so they
are neither delayed nor failed by the next batch (the last ``history`` batches keep their state).

On CUDA, ``complete(layer, event)`` can carry an event recorded on the load stream after the
layer's copies were queued; ``wait_until`` then makes the reader's current stream wait on it
instead of blocking the host until the copy finished.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from mem_cache_kernels.checks import check_int, check_optional_int

__all__ = ["LayerDoneCounter", "LayerLoadAbortedError"]


class LayerLoadAbortedError(RuntimeError):
    """The load batch a reader waited on was aborted; the layer's data is not valid."""


@dataclass(slots=True)
class _Batch:
    """State of one load batch."""

    batch_id: int
    done: list[bool]
    events: list[Any]
    num_done: int = 0
    aborted: BaseException | None = None

    @property
    def running(self) -> bool:
        return self.aborted is None and self.num_done < len(self.done)


class LayerDoneCounter:
    """Implements ``mem_cache_pool.base.LayerReadyWaiter`` (see the module docstring).

    ``num_layers``: layers per batch; ``layer_index`` arguments are local (``0..num_layers-1``).
    ``history``: how many recent batches keep their state, so readers of batch *k* (see
    :meth:`set_consumer`) are unaffected when the loader already began batch *k + 1* (with CUDA
    events the loader finishes a batch on the host long before the copies ran).
    Thread-safe: one loader thread and any number of reader threads.
    """

    def __init__(self, num_layers: int, history: int = 3) -> None:
        check_int("num_layers", num_layers, minimum=1)
        check_int("history", history, minimum=1)
        self.num_layers = num_layers
        self._cond = threading.Condition(threading.Lock())
        self._batches: deque[_Batch] = deque(maxlen=history)
        self._last_id = 0
        self._consumer: int | None = None

    @property
    def in_flight(self) -> bool:
        """Whether a load batch is running (begun, not complete, not aborted)."""
        with self._cond:
            return bool(self._batches) and self._batches[-1].running

    @property
    def batch_id(self) -> int:
        """Id of the most recently begun batch (0 before the first)."""
        with self._cond:
            return self._last_id

    def begin(self) -> int:
        """Start a load batch (all layers pending); returns its id (1, 2, ...).

        ``RuntimeError`` if the previous batch is still in flight (complete or abort it first).
        """
        with self._cond:
            if self._batches and self._batches[-1].running:
                last = self._batches[-1]
                raise RuntimeError(
                    f"load batch {last.batch_id} is still in flight ({last.num_done}/"
                    f"{self.num_layers} layers done); complete it or call abort() first"
                )
            self._last_id += 1
            n = self.num_layers
            self._batches.append(_Batch(self._last_id, [False] * n, [None] * n))
            self._cond.notify_all()
            return self._last_id

    def complete(self, layer_index: int, event: Any = None) -> None:
        """Mark ``layer_index`` loaded in the batch in flight (no-op when none is).

        ``event``: an optional CUDA event readers' streams wait on. Completing a layer twice in
        one batch raises ``RuntimeError``.
        """
        self._check_layer(layer_index)
        with self._cond:
            if not (self._batches and self._batches[-1].running):
                return
            batch = self._batches[-1]
            if batch.done[layer_index]:
                raise RuntimeError(
                    f"layer {layer_index} completed twice in load batch {batch.batch_id}"
                )
            batch.done[layer_index] = True
            batch.events[layer_index] = event
            batch.num_done += 1
            self._cond.notify_all()

    def abort(self, exc: BaseException | None = None) -> None:
        """End the batch in flight as failed: its readers (now and later) raise
        :class:`LayerLoadAbortedError` chained to ``exc``. No-op when nothing is in flight."""
        if exc is not None and not isinstance(exc, BaseException):
            raise TypeError(f"exc must be an exception or None, got {type(exc).__name__}")
        with self._cond:
            if not (self._batches and self._batches[-1].running):
                return
            self._batches[-1].aborted = exc if exc is not None else RuntimeError("load aborted")
            self._cond.notify_all()

    def reset(self) -> None:
        """Forget every batch (in flight or aborted) and the consumer: every layer is ready."""
        with self._cond:
            self._batches.clear()
            self._consumer = None
            self._cond.notify_all()

    def set_consumer(self, batch_id: int | None) -> None:
        """Make readers wait on batch ``batch_id`` (``None``: the latest begun batch).

        A batch not begun yet is waited for; one older than ``history`` counts as loaded.
        """
        check_optional_int("batch_id", batch_id, minimum=1)
        with self._cond:
            self._consumer = batch_id
            self._cond.notify_all()

    def _target(self) -> tuple[bool, _Batch | None]:
        """(begun, batch) of the batch readers wait on; batch None means "all ready"."""
        if self._consumer is None:
            return True, (self._batches[-1] if self._batches else None)
        if self._consumer > self._last_id:
            return False, None
        for batch in self._batches:
            if batch.batch_id == self._consumer:
                return True, batch
        return True, None

    def is_done(self, layer_index: int) -> bool:
        self._check_layer(layer_index)
        with self._cond:
            begun, batch = self._target()
            if not begun:
                return False
            return batch is None or (batch.aborted is None and batch.done[layer_index])

    def wait_until(self, layer_index: int, timeout: float | None = None) -> None:
        """Block until ``layer_index`` is loaded in the consumer batch (if one is running).

        Raises :class:`LayerLoadAbortedError` if that batch was aborted and ``TimeoutError`` if
        ``timeout`` seconds pass first.
        """
        self._check_layer(layer_index)

        def ready() -> bool:
            begun, batch = self._target()
            return begun and (batch is None or batch.aborted is not None or batch.done[layer_index])

        with self._cond:
            ok = self._cond.wait_for(ready, timeout)
            _, batch = self._target()
            if batch is not None and batch.aborted is not None:
                raise LayerLoadAbortedError(
                    f"load batch {batch.batch_id} was aborted before layer {layer_index} was loaded"
                ) from batch.aborted
            if not ok:
                raise TimeoutError(f"layer {layer_index} not loaded within {timeout} s")
            event = batch.events[layer_index] if batch is not None else None
        if event is not None and torch.cuda.is_available():
            torch.cuda.current_stream().wait_event(event)

    @contextmanager
    def load_batch(self) -> Iterator[int]:
        """``with counter.load_batch():`` begins a batch and aborts it if the body raises or
        leaves layers incomplete (``RuntimeError`` in the latter case)."""
        batch = self.begin()
        try:
            yield batch
        except BaseException as exc:
            self.abort(exc)
            raise
        with self._cond:
            last = self._batches[-1] if self._batches else None
            unfinished = last is not None and last.batch_id == batch and last.running
            done = last.num_done if last is not None else 0
        if unfinished:
            err = RuntimeError(
                f"load batch {batch} ended with {done}/{self.num_layers} layers complete"
            )
            self.abort(err)
            raise err

    def _check_layer(self, layer_index: int) -> None:
        check_int("layer_index", layer_index, minimum=0, maximum=self.num_layers - 1)
