"""Host<->device transfers of ``--model deepseek_v4`` (the DeepSeek-V4 twin of ``hicache.py``).

* ``backup``: the window, c4 and c128 records of a prefix's logical slots -> their
  ``DeepSeekV4SingleKVPoolHost`` mirrors, token-granular, all layers (c4 records from the device
  slots the HiSparse mapping gives their entries);
* ``load``: host rows -> the records of freshly allocated logical slots, layer by layer on an IO
  thread (the window pool's load marks the layer done on the counter registered with the
  composite pool), while the caller's thread reads every layer through the composite pool
  (``get_swa_key_buffer`` / ``get_compressed_key_buffer``, which wait) and verifies it bit-exact.

Faults (``faults.py``) make a transfer fail up front or abort midway; the outcome is reported and
the caller releases what it reserved.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import torch

from mem_cache_kernels import deepseek_v4 as deepseek_v4_kernels
from tools.simulate.deepseek_v4_stack import ROLE, DeepSeekV4Stack
from tools.simulate.faults import Fault, FaultInjector, InjectedTransferError
from tools.simulate.hicache import D2H, layer_wise_load
from tools.simulate.stats import SimStats

__all__ = ["DeepSeekV4HostTransfers", "host_tokens"]


def host_tokens(rows: torch.Tensor, per_row: int) -> torch.Tensor:
    """Host token slots of host page rows ``rows`` (``per_row`` tokens each), row-major."""
    return (rows.unsqueeze(1) * per_row + torch.arange(per_row)).reshape(-1)


class DeepSeekV4HostTransfers:
    """Backups and layer-wise loads for one :class:`DeepSeekV4Stack`; counts bytes, time, faults."""

    def __init__(self, stack: DeepSeekV4Stack, stats: SimStats, faults: FaultInjector) -> None:
        self.stack = stack
        self.stats = stats
        self.faults = faults
        self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="deepseek_v4-load")

    def close(self) -> None:
        self._io.shutdown(wait=True)

    def backup(self, full: torch.Tensor, host: dict[str, torch.Tensor]) -> bool:
        """Back up every record pool of logical slots ``full``; ``False`` if a fault hit."""
        stack, stat = self.stack, self.stats.transfer(D2H)
        fault = self.faults.draw(stack.pool.layer_num)
        if fault is not None:
            self.stats.faults_injected += 1
        t0 = time.perf_counter_ns()
        moved = 0
        try:
            for i, kind in enumerate(stack.kinds):
                if fault is not None and (fault.kind == "fail" or i == len(stack.kinds) - 1):
                    raise InjectedTransferError(f"injected backup {fault.kind}")
                dev = stack.device_slots(kind, full)
                tokens = host_tokens(host[kind.name], kind.pool.page_size)
                kind.host.backup_tokens_from_device_all_layer(kind.pool, tokens, dev)
                moved += dev.numel() * len(kind.layers) * deepseek_v4_kernels.TOKEN_BYTES
        except InjectedTransferError:
            stat.record_failure(fault is not None and fault.kind == "abort")
            return False
        stat.record(time.perf_counter_ns() - t0, full.numel(), moved)
        return True

    def _produce(
        self, host: dict[str, torch.Tensor], device: dict[str, torch.Tensor], fault: Fault | None
    ) -> int:
        """IO thread: load every record pool layer by layer (the window pool's load marks the
        layer done on the counter the composite pool waits on, so it goes last)."""
        stack = self.stack
        swa_counter = stack.kinds[0].host.layer_done_counter
        t0 = time.perf_counter_ns()
        for layer_index in range(stack.pool.layer_num):
            if fault is not None and (fault.kind == "fail" or layer_index == fault.at_layer):
                swa_counter.abort(InjectedTransferError(f"injected load {fault.kind}"))
                break
            layer_id = stack.pool.start_layer + layer_index
            for kind in reversed(stack.kinds):
                if layer_id not in kind.layers:
                    continue
                local = kind.layers.index(layer_id)
                tokens = host_tokens(host[kind.name], kind.pool.page_size)
                kind.host.load_tokens_to_device_per_layer(
                    kind.pool, tokens, device[kind.name], local
                )
        return time.perf_counter_ns() - t0

    def load(self, host: dict[str, torch.Tensor], full: torch.Tensor, session: int) -> bool:
        """Load the records in host rows ``host`` (per record pool) into the records of logical
        ``full`` (whole pages, positions ``0..len(full)-1`` of ``session``), verifying each layer
        bit-exact as the composite pool reports it ready. ``False`` if the load failed or was
        aborted (the caller frees ``full``); a mismatch is recorded as integrity failure."""
        length = full.numel()
        stack = self.stack
        device = {k.name: stack.device_slots(k, full) for k in stack.kinds}
        positions = torch.arange(length, dtype=torch.int64, device=stack.device)
        h = stack.hashes(torch.full_like(positions, session), positions, stack.pool.layer_num)

        def verify(layer_index: int) -> int:
            layer_id = stack.pool.start_layer + layer_index
            rows = stack.pool.get_swa_key_buffer(layer_id)
            got = deepseek_v4_kernels.read_records(rows, device["swa"], stack.page_size)
            bad = stack.mismatches(got, h[layer_index, ROLE["swa"]], "swa")
            ratio = stack.pool.get_compress_ratio(layer_id)
            if ratio:
                kind = stack.kind(f"c{ratio}")
                rows = stack.pool.get_compressed_key_buffer(layer_id)
                got = deepseek_v4_kernels.read_records(rows, device[kind.name], kind.pool.page_size)
                m = stack.entry_mask(full, ratio)
                bad += stack.mismatches(got, h[layer_index, ROLE[kind.name]][m], kind.name)
            return bad

        return layer_wise_load(
            self.stats, self.faults, self._io, stack.pool, stack.kinds[0].host.layer_done_counter,
            produce=lambda fault: self._produce(host, device, fault), verify=verify,
            layers=stack.pool.layer_num, tokens=length, nbytes=length * stack.bytes_per_token,
            page_size=stack.page_size, what="records",
        )
