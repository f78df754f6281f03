"""Host<->device transfers the way SGLang's HiCacheController drives them.

* ``backup``: device rows of a prefix -> freshly allocated host slots, all layers in one call
  (``backup_from_device_all_layer``).
* ``load``: host slots -> freshly allocated device slots, one layer at a time on an IO thread
  (``load_to_device_per_layer`` advances the host pool's ``LayerDoneCounter``), while the
  scheduler thread plays attention: it reads every layer through ``get_key_buffer`` /
  ``get_value_buffer`` (which wait on the counter registered with the device pool) and verifies
  the loaded rows bit-exact against the content model as soon as the layer is ready.

``layer_wise_load`` is that load's protocol (counter, IO thread, per-layer verification, fault
and statistics bookkeeping), shared with ``deepseek_v4_hicache.py``.

Faults (``faults.py``) make a transfer fail up front or abort midway: the faulty host-pool call
gets a ``FailingDevicePool`` and fails inside the package (a load's failure aborts the layer
counter through the host pool's own error path); this module reports the outcome and leaves
releasing the reserved slots to the caller.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from mem_cache_pool import KVCache
from mem_cache_pool_host import LayerDoneCounter, LayerLoadAbortedError
from tools.simulate.faults import FailingDevicePool, Fault, FaultInjector, InjectedTransferError
from tools.simulate.stack import MemoryStack
from tools.simulate.stats import SimStats

__all__ = ["HostTransfers", "layer_wise_load"]

D2H = "d2h backup"
H2D = "h2d load"


class HostTransfers:
    """Runs backups and layer-wise loads for one ``MemoryStack``; counts bytes, time and faults."""

    def __init__(self, stack: MemoryStack, stats: SimStats, faults: FaultInjector) -> None:
        self.stack = stack
        self.stats = stats
        self.faults = faults
        self.io_backend = stack.cfg.io_backend
        self.layers = stack.kv_pool.layer_num
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hicache-load")

    def close(self) -> None:
        self._io.shutdown(wait=True)

    def backup(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> bool:
        """Copy all layers of ``device_slots`` to ``host_slots``; ``False`` if a fault hit.

        On ``False`` the host slots hold garbage (the caller frees them); the device rows are
        untouched either way.
        """
        stat = self.stats.transfer(D2H)
        fault = self.faults.draw(self.layers)
        host = self.stack.host_pool
        pool = self.stack.kv_pool
        if fault is not None:
            self.stats.faults_injected += 1
        t0 = time.perf_counter_ns()
        try:
            if fault is not None:
                if fault.kind == "abort":  # the first half of the pages made it, then it stopped
                    ps = self.stack.page_size
                    half = device_slots.numel() // ps // 2 * ps
                    if half:
                        host.backup_from_device_all_layer(
                            pool, host_slots[:half], device_slots[:half], self.io_backend
                        )
                failing = FailingDevicePool(InjectedTransferError(f"injected backup {fault.kind}"))
                host.backup_from_device_all_layer(
                    failing, host_slots, device_slots, self.io_backend
                )  # raises from inside the package
                raise RuntimeError("a host-pool backup ignored a failing device pool")
            host.backup_from_device_all_layer(pool, host_slots, device_slots, self.io_backend)
        except InjectedTransferError:
            stat.record_failure(fault is not None and fault.kind == "abort")
            return False
        n = device_slots.numel()
        stat.record(time.perf_counter_ns() - t0, n, n * self.stack.bytes_per_token)
        return True

    def _produce(
        self, host_slots: torch.Tensor, device_slots: torch.Tensor, fault: Fault | None
    ) -> int:
        """IO thread: load layer by layer; returns the nanoseconds spent copying."""
        host = self.stack.host_pool
        counter = host.layer_done_counter
        t0 = time.perf_counter_ns()
        for layer in range(self.layers):
            pool: object = self.stack.kv_pool
            if fault is not None and (fault.kind == "fail" or layer == fault.at_layer):
                pool = FailingDevicePool(
                    InjectedTransferError(f"injected load {fault.kind} at layer {layer}")
                )
            try:  # a failing call aborts the counter's batch itself (the package's error path)
                host.load_to_device_per_layer(
                    pool,  # type: ignore[arg-type]
                    host_slots,
                    device_slots,
                    layer,
                    self.io_backend,
                )
            except InjectedTransferError:
                if counter.in_flight:
                    raise RuntimeError(
                        "a failed host-pool load left its layer batch in flight"
                    ) from None
                break
        return time.perf_counter_ns() - t0

    def load(
        self,
        host_slots: torch.Tensor,
        device_slots: torch.Tensor,
        sessions: torch.Tensor,
        positions: torch.Tensor,
    ) -> bool:
        """Load ``host_slots`` into ``device_slots`` layer by layer, verifying each layer as it
        becomes ready. ``False`` if the load failed or was aborted (the caller then frees the
        device slots it reserved); a verification mismatch is recorded as integrity failure."""
        stack = self.stack
        h = stack.hashes(sessions, positions)
        n = device_slots.numel()
        return layer_wise_load(
            self.stats, self.faults, self._io, stack.kv_pool, stack.host_pool.layer_done_counter,
            produce=lambda fault: self._produce(host_slots, device_slots, fault),
            verify=lambda layer: stack.count_mismatches(layer, device_slots, h),
            layers=self.layers, tokens=n, nbytes=n * stack.bytes_per_token,
            page_size=stack.page_size, what="token rows",
        )


def layer_wise_load(
    stats: SimStats, faults: FaultInjector, io: ThreadPoolExecutor, pool: KVCache,
    counter: LayerDoneCounter, *, produce: Callable[[Fault | None], int],
    verify: Callable[[int], int], layers: int, tokens: int, nbytes: int, page_size: int,
    what: str,
) -> bool:
    """One host->device load as the HiCache controller runs it: ``produce(fault)`` copies the
    layers on the IO thread ``io`` (marking each done on ``counter``, registered with ``pool``
    meanwhile; it returns the nanoseconds it spent), while this thread waits for every layer
    (``verify(layer)``: mismatching ``what`` of that layer, read through ``pool``). A fault is
    drawn from ``faults`` first. ``False`` if the load failed or was aborted; mismatches are
    recorded as integrity failure; a completed load counts ``tokens`` (``nbytes``) transferred
    and verified."""
    stat = stats.transfer(H2D)
    fault = faults.draw(layers)
    if fault is not None:
        stats.faults_injected += 1
    pool.register_layer_transfer_counter(counter)
    counter.begin()
    job = io.submit(produce, fault)
    aborted, bad = False, 0
    try:
        for layer in range(layers):
            bad += verify(layer)
            stats.layer_waits += 1
    except LayerLoadAbortedError:
        aborted = True
    finally:
        try:
            ns = job.result()  # re-raises a real (non-injected) transfer error
        finally:
            pool.register_layer_transfer_counter(None)
            counter.reset()
    if bad:  # layers verified before an abort count too
        stats.fail(f"{bad} loaded {what} differ from their content (layers summed)")
    if aborted:
        stat.record_failure(fault is not None and fault.kind == "abort")
        return False
    if fault is not None:
        raise RuntimeError("an injected load fault did not abort the layer counter")
    stat.record(ns, tokens, nbytes)
    stats.pages_verified += tokens // page_size
    stats.tokens_verified += tokens
    return True
