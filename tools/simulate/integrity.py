"""Invariant checks: slot conservation per step, and the leak check at the end of a run."""

from __future__ import annotations

from collections.abc import Iterable

from tools.simulate.prefix_store import PrefixStore
from tools.simulate.stack import MemoryStack
from tools.simulate.stats import SimStats

__all__ = ["check_conservation", "leak_check", "owned_slots"]


def owned_slots(seq_len: int, page_size: int) -> int:
    """Device slots a request of ``seq_len`` tokens owns: whole pages (prefixes are aligned)."""
    return -(-seq_len // page_size) * page_size


def check_conservation(
    stack: MemoryStack, store: PrefixStore, running_seq_lens: Iterable[int], stats: SimStats,
    shared_cache: int = 0,
) -> None:
    """Every slot is in exactly one place, on every pool; a violation is an integrity failure.

    device: allocator available + slots of running requests + cached device prefixes + the
    shared-prefix cache's slots (``shared_cache``) == capacity (``running_seq_lens``: the tokens
    each running request owns, its borrowed page-aligned shared prefix not counted);
    host: host pool available + cached host prefixes == capacity;
    request table: free rows + running requests == rows.
    """
    stats.conservation_checks += 1
    ps = stack.page_size
    n_running = 0
    live = 0
    for seq_len in running_seq_lens:
        live += owned_slots(seq_len, ps)
        n_running += 1
    avail = stack.allocator.available_size()
    device = avail + live + store.tokens("device") + shared_cache
    if device != stack.device_capacity:
        stats.fail(
            f"step {stats.steps}: device slots not conserved: available {avail} + running {live} "
            f"+ cached {store.tokens('device')} + shared {shared_cache} = {device} != capacity "
            f"{stack.device_capacity}"
        )
    host_avail = stack.host_pool.available_size()
    host = host_avail + store.tokens("host")
    if host != stack.host_capacity:
        stats.fail(
            f"step {stats.steps}: host slots not conserved: available {host_avail} + cached "
            f"{store.tokens('host')} = {host} != capacity {stack.host_capacity}"
        )
    rows = stack.req_pool.available_size() + n_running
    if rows != stack.req_capacity:
        stats.fail(
            f"step {stats.steps}: request rows not conserved: {rows} != {stack.req_capacity}"
        )
    stats.peak_device_tokens = max(stats.peak_device_tokens, stack.device_capacity - avail)
    stats.peak_host_tokens = max(stats.peak_host_tokens, stack.host_capacity - host_avail)


def leak_check(stack: MemoryStack, stats: SimStats) -> None:
    """Record every pool's (available, capacity) after the run is drained."""
    stats.leaks = {
        "device": (stack.allocator.available_size(), stack.device_capacity),
        "host": (stack.host_pool.available_size(), stack.host_capacity),
        "req_to_token": (stack.req_pool.available_size(), stack.req_capacity),
    }
