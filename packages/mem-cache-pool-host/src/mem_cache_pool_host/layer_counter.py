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

On CUDA, ``complete(layer, event)`` can carry an event recorded on the load stream after the
layer's copies were queued; ``wait_until`` then makes the reader's current stream wait on it
instead of blocking the host until the copy finished.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["LayerDoneCounter", "LayerLoadAbortedError"]


class LayerLoadAbortedError(RuntimeError):
    """The load batch a reader waited on was aborted; the layer's data is not valid."""


class LayerDoneCounter:
    """Implements ``mem_cache_pool.base.LayerReadyWaiter`` (see the module docstring).

    ``num_layers``: layers per batch; ``layer_index`` arguments are local (``0..num_layers-1``).
    Thread-safe: one loader thread and any number of reader threads.
    """

    def __init__(self, num_layers: int) -> None:
        if num_layers <= 0:
            raise ValueError(f"num_layers must be > 0, got {num_layers}")
        self.num_layers = num_layers
        self._cond = threading.Condition(threading.Lock())
        self._in_flight = False
        self._done = [True] * num_layers
        self._events: list[Any] = [None] * num_layers
        self._num_done = num_layers
        self._aborted: BaseException | None = None
        self._batch = 0

    @property
    def in_flight(self) -> bool:
        """Whether a load batch is running."""
        with self._cond:
            return self._in_flight

    @property
    def batch_id(self) -> int:
        """Number of batches begun so far (the current batch's id)."""
        with self._cond:
            return self._batch

    def begin(self) -> int:
        """Start a load batch (all layers pending); returns its id.

        ``RuntimeError`` if the previous batch is still in flight (complete or abort it first).
        """
        with self._cond:
            if self._in_flight:
                raise RuntimeError(
                    f"load batch {self._batch} is still in flight ({self._num_done}/"
                    f"{self.num_layers} layers done); complete it or call abort() first"
                )
            self._batch += 1
            self._in_flight = True
            self._aborted = None
            self._done = [False] * self.num_layers
            self._events = [None] * self.num_layers
            self._num_done = 0
            return self._batch

    def complete(self, layer_index: int, event: Any = None) -> None:
        """Mark ``layer_index`` loaded (no-op when no batch is in flight).

        ``event``: an optional CUDA event readers' streams wait on. Completing a layer twice in
        one batch raises ``RuntimeError``.
        """
        self._check_layer(layer_index)
        with self._cond:
            if not self._in_flight:
                return
            if self._done[layer_index]:
                raise RuntimeError(
                    f"layer {layer_index} completed twice in load batch {self._batch}"
                )
            self._done[layer_index] = True
            self._events[layer_index] = event
            self._num_done += 1
            if self._num_done == self.num_layers:
                self._in_flight = False
            self._cond.notify_all()

    def abort(self, exc: BaseException | None = None) -> None:
        """End the batch in flight as failed: waiters (now and until the next ``begin``/``reset``)
        raise :class:`LayerLoadAbortedError` chained to ``exc``. No-op when nothing is in flight."""
        with self._cond:
            if not self._in_flight:
                return
            self._in_flight = False
            self._aborted = exc if exc is not None else RuntimeError("load aborted")
            self._cond.notify_all()

    def reset(self) -> None:
        """Forget any batch (in flight or aborted): every layer counts as ready."""
        with self._cond:
            self._in_flight = False
            self._aborted = None
            self._done = [True] * self.num_layers
            self._events = [None] * self.num_layers
            self._num_done = self.num_layers
            self._cond.notify_all()

    def is_done(self, layer_index: int) -> bool:
        self._check_layer(layer_index)
        with self._cond:
            return self._aborted is None and (not self._in_flight or self._done[layer_index])

    def wait_until(self, layer_index: int, timeout: float | None = None) -> None:
        """Block until ``layer_index`` is loaded in the batch in flight (if any).

        Raises :class:`LayerLoadAbortedError` if the batch was aborted and ``TimeoutError`` if
        ``timeout`` seconds pass first.
        """
        self._check_layer(layer_index)
        with self._cond:
            ok = self._cond.wait_for(
                lambda: self._aborted is not None or not self._in_flight or self._done[layer_index],
                timeout,
            )
            if self._aborted is not None:
                raise LayerLoadAbortedError(
                    f"load batch {self._batch} was aborted before layer {layer_index} was loaded"
                ) from self._aborted
            if not ok:
                raise TimeoutError(f"layer {layer_index} not loaded within {timeout} s")
            event = self._events[layer_index]
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
            unfinished = self._in_flight and self._batch == batch
            done = self._num_done
        if unfinished:
            err = RuntimeError(
                f"load batch {batch} ended with {done}/{self.num_layers} layers complete"
            )
            self.abort(err)
            raise err

    def _check_layer(self, layer_index: int) -> None:
        if not 0 <= layer_index < self.num_layers:
            raise ValueError(f"layer_index must be in [0, {self.num_layers}), got {layer_index}")
