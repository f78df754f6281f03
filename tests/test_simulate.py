"""The serving-workload simulator (tools.simulate) on tiny configurations.

Each end-to-end run drives all four packages (allocator, device pool, request table, host pool,
kernels) through admission, prefill, decode, eviction to the host and layer-wise loads back,
and must finish with zero integrity failures and zero leaks.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tools.simulate import SimConfig, run_simulation
from tools.simulate.cli import main
from tools.simulate.content import ContentModel
from tools.simulate.faults import FaultInjector
from tools.simulate.hicache import HostTransfers
from tools.simulate.integrity import check_conservation
from tools.simulate.prefix_store import PrefixEntry, PrefixStore
from tools.simulate.report import report_dict
from tools.simulate.shared_prefix import SharedPrefixCache
from tools.simulate.stack import MemoryStack, build_stack
from tools.simulate.stats import SimStats
from tools.simulate.workload import SessionId, generate_workload

TINY = SimConfig(
    layers=2,
    heads=2,
    head_dim=16,
    kv_lora_rank=32,
    qk_rope_head_dim=16,
    device_tokens=1024,
    host_tokens=2048,
    requests=24,
    max_running=8,
    system_prompts=2,
    prompt_mu=3.5,
    output_mu=2.5,
    max_prompt=128,
    max_output=32,
    arrival_per_step=0.5,
    think_steps=4,
)

CASES: dict[str, dict[str, Any]] = {
    "mha-ps16-kernel-page_first": {},
    "mla-ps16-kernel-layer_first": {"model": "mla", "host_layout": "layer_first"},
    "mha-ps1-direct-layer_first": {"page_size": 1, "io_backend": "direct",
                                   "host_layout": "layer_first"},
    "mla-ps1-kernel-page_first": {"model": "mla", "page_size": 1},
    "mha-ps16-direct-page_first_direct-fp8": {"io_backend": "direct",
                                              "host_layout": "page_first_direct",
                                              "dtype": "float8_e4m3fn"},
    "mla-ps16-direct-page_first_direct-faults": {"model": "mla", "io_backend": "direct",
                                                 "host_layout": "page_first_direct",
                                                 "faults": 0.3},
    "mha-ps16-kernel-page_first-faults-fp16": {"faults": 0.3, "dtype": "float16"},
    "mha-ps1-kernel-layer_first-faults": {"page_size": 1, "host_layout": "layer_first",
                                          "faults": 0.3},
}


def _assert_clean(cfg: SimConfig, stats: SimStats) -> None:
    assert stats.failures == []
    assert stats.integrity_failures == 0
    pools = {"device", "host", "req_to_token"}
    assert set(stats.leaks) == (pools | {"l3 prefetch"} if cfg.storage != "none" else pools)
    for pool, (available, capacity) in stats.leaks.items():
        assert available == capacity, pool
    assert stats.requests_done == cfg.requests
    assert stats.conservation_checks >= stats.steps


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiny_run_is_clean(name: str) -> None:
    cfg = dataclasses.replace(TINY, **CASES[name])
    stats = run_simulation(cfg)
    _assert_clean(cfg, stats)
    # the hierarchical path really ran: prefixes went to the host and came back verified
    assert stats.l3 is not None and stats.l3.prefetch_reserved_at_end == 0
    assert stats.evictions_to_host > 0
    assert stats.transfers["d2h backup"].calls > 0
    assert stats.host_hits > 0
    assert stats.pages_verified > 0
    assert stats.sequences_verified == cfg.requests
    assert stats.layer_waits >= stats.host_hits * cfg.layers
    load = stats.transfers["h2d load"]
    assert load.bytes == load.tokens * stats.bytes_per_token
    if cfg.faults:
        assert stats.faults_injected > 0
        backup = stats.transfers["d2h backup"]
        assert load.failed + load.aborted + backup.failed + backup.aborted == stats.faults_injected
        assert load.aborted + backup.aborted > 0


# the storage tier (L3): small host pool so host entries are dropped (written back) and
# returning turns have to come back from storage
L3_TINY = dataclasses.replace(TINY, host_tokens=512, requests=40, think_steps=12)

L3_CASES: dict[str, dict[str, Any]] = {
    "mha-page_first-write_back": {},
    "mla-layer_first-write_through": {"model": "mla", "host_layout": "layer_first",
                                      "storage_write": "write_through"},
    "mha-page_first_direct-storage-faults": {"host_layout": "page_first_direct",
                                             "io_backend": "direct",
                                             "storage_fault_rate": 0.25},
    "mha-ps1-restart": {"page_size": 1, "restart_at": 40},
    "mha-l3-capacity-1mb": {"storage_capacity_mb": 1},
    "mla-transfer-and-storage-faults-restart": {"model": "mla", "faults": 0.2,
                                                "storage_fault_rate": 0.2, "restart_at": 30},
}


@pytest.mark.parametrize("name", sorted(L3_CASES))
def test_l3_run_is_clean(name: str) -> None:
    cfg = dataclasses.replace(L3_TINY, **L3_CASES[name])
    stats = run_simulation(cfg)
    _assert_clean(cfg, stats)
    l3 = stats.l3
    assert l3 is not None
    # pages went to storage and returning turns that missed L1 and L2 came back from it,
    # verified bit-exact on their way to the device (an L3 hit is counted after that check)
    assert l3.pages_written > 0 and l3.bytes_written > 0
    assert l3.hits > 0 and l3.hit_tokens > 0 and l3.pages_loaded > 0
    assert stats.misses < l3.lookups
    assert stats.tokens_verified >= l3.hit_tokens
    assert l3.prefetch_reserved_at_end == 0
    if cfg.restart_at >= 0:
        assert l3.restarts == 1 and l3.hits_after_restart > 0
    if cfg.storage_capacity_mb:
        assert l3.pages_evicted > 0
    if cfg.storage_fault_rate:
        assert sum(l3.faults.values()) > 0
        assert l3.faults["corrupt"] == 0 or l3.pages_rejected > 0 or l3.pages_written > 0


def test_l3_corruption_is_caught_not_served() -> None:
    """Every stored page is corrupted after it is written: no L3 hit, no integrity failure."""
    from tools.simulate import storage_faults

    cfg = dataclasses.replace(L3_TINY, storage_fault_rate=1.0)
    original = storage_faults.STORAGE_FAULT_KINDS
    storage_faults.STORAGE_FAULT_KINDS = ("corrupt",)  # type: ignore[assignment]
    try:
        stats = run_simulation(cfg)
    finally:
        storage_faults.STORAGE_FAULT_KINDS = original
    _assert_clean(cfg, stats)
    assert stats.l3 is not None and stats.l3.faults["corrupt"] > 0
    assert stats.l3.pages_rejected > 0


def test_storage_none_and_warm_directory(tmp_path: Path) -> None:
    off = run_simulation(dataclasses.replace(L3_TINY, storage="none"))
    _assert_clean(dataclasses.replace(L3_TINY, storage="none"), off)
    assert off.l3 is None and off.misses > 0
    cfg = dataclasses.replace(L3_TINY, storage_dir=str(tmp_path))
    first = run_simulation(cfg)
    assert first.l3 is not None and first.l3.hits > 0
    assert off.recomputed_tokens > first.recomputed_tokens
    assert list(tmp_path.glob("*.kvp"))  # a given directory is kept
    second = run_simulation(cfg)  # a new engine over a warm L3: every write is already there
    _assert_clean(cfg, second)
    assert second.l3 is not None and second.l3.pages_written == 0
    assert second.l3.pages_skipped > 0


def test_runs_are_reproducible() -> None:
    cfg = dataclasses.replace(TINY, faults=0.2)
    a, b = report_dict(cfg, run_simulation(cfg)), report_dict(cfg, run_simulation(cfg))
    for key in ("steps", "tokens", "hits", "evictions"):
        assert a[key] == b[key], key
    assert a["checks"]["faults_injected"] == b["checks"]["faults_injected"]


def test_cli_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    argv = ["--layers", "2", "--heads", "2", "--head-dim", "16", "--device-tokens", "1024",
            "--host-tokens", "2048", "--requests", "12", "--max-running", "8",
            "--no-progress", "--json", str(out)]
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["ok"] is True
    assert doc["requests"] == 12
    assert doc["config"]["device_tokens"] == 1024
    assert doc["storage"]["backend"] == "file" and doc["leaks"]["l3 prefetch"]
    assert set(doc["allocator"]) >= {"alloc_extend", "alloc_decode", "free_group_end"}


def test_cli_rejects_bad_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--page-size", "12", "--no-progress"]) == 2
    assert "--page-size must be a power of two, got 12" in capsys.readouterr().err
    assert main(["--storage-fault-rate", "2", "--no-progress"]) == 2
    assert "--storage-fault-rate must be a probability" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_rejects_cuda_without_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "cuda", "--no-progress"]) == 2
    assert "--device 'cuda' requested" in capsys.readouterr().err


def test_workload_is_seeded_and_exact() -> None:
    w1, w2 = generate_workload(TINY), generate_workload(TINY)
    assert w1 == w2
    assert w1.requests == TINY.requests
    assert w1 != generate_workload(dataclasses.replace(TINY, seed=1))
    for s in w1.sessions:
        assert s.total_len <= TINY.device_tokens // 2
        assert all(1 <= t.prompt_len <= TINY.max_prompt for t in s.turns)
        assert all(1 <= t.output_len <= TINY.max_output for t in s.turns)
        assert s.history_len(1) == s.system_len + s.turns[0].prompt_len + s.turns[0].output_len


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16,
                                   torch.float8_e4m3fn, torch.float8_e5m2])
def test_content_is_finite_distinct_and_checked(dtype: torch.dtype) -> None:
    model = ContentModel([(2, 16), (1, 8)], dtype, torch.device("cpu"), seed=3)
    sessions = torch.arange(40) // 8
    positions = torch.arange(40) % 8
    h = model.hashes(sessions, positions, layers=3)
    rows = model.rows_from(h[2, 1], 1)
    assert rows.dtype == dtype and rows.shape == (40, 1, 8)
    assert torch.isfinite(rows.float()).all()
    assert model.mismatches(rows, h[2, 1], 1) == 0
    assert model.mismatches(rows, h[1, 1], 1) == 40  # another layer's content
    ints = rows.view(model.int_dtype).reshape(40, -1)
    assert len({tuple(r.tolist()) for r in ints}) == 40
    corrupted = rows.clone()
    corrupted.view(model.int_dtype)[7, 0, 3] ^= 1
    assert model.mismatches(corrupted, h[2, 1], 1) == 1


def test_verification_detects_corrupted_device_rows() -> None:
    stack = build_stack(TINY, max_context_len=64)
    try:
        slots = stack.allocator.alloc(32)
        assert slots is not None
        sessions = torch.full((32,), 5, dtype=torch.int64)
        positions = torch.arange(32)
        stack.write_kv(slots, sessions, positions)
        h = stack.hashes(sessions, positions)
        assert stack.count_mismatches(1, slots, h) == 0
        stack.kv_pool.get_value_buffer(1)[int(slots[3])].view(torch.int16)[0, 0] ^= 4
        assert stack.count_mismatches(1, slots, h) == 1
        assert stack.count_mismatches(0, slots, h) == 0
    finally:
        stack.host_pool.close()


def test_conservation_check_detects_a_lost_slot() -> None:
    stack = build_stack(TINY, max_context_len=64)
    try:
        store, stats = PrefixStore(), SimStats()
        check_conservation(stack, store, [], stats)
        assert stats.integrity_failures == 0
        lost = stack.allocator.alloc(TINY.page_size)  # handed out, owned by nobody
        assert lost is not None
        check_conservation(stack, store, [], stats)
        assert stats.integrity_failures == 1
        assert "device slots not conserved" in stats.failures[0]
        store.put(PrefixEntry(SessionId(0), TINY.page_size, "device", lost))
        check_conservation(stack, store, [], stats)
        assert stats.integrity_failures == 1
    finally:
        stack.host_pool.close()


def test_prefix_store_lru_and_accounting() -> None:
    store = PrefixStore()
    for s in range(3):
        store.put(PrefixEntry(SessionId(s), 16, "device", torch.arange(16)))
    assert store.tokens("device") == 48
    oldest = store.oldest("device")
    assert oldest is not None and oldest.session == 0
    device_slots = store.move_to_host(SessionId(0), torch.arange(100, 116))
    assert torch.equal(device_slots, torch.arange(16))
    assert (store.tokens("device"), store.tokens("host")) == (32, 16)
    oldest = store.oldest("device")
    assert oldest is not None and oldest.session == 1
    taken = store.take(SessionId(1))
    assert taken is not None and store.tokens("device") == 16
    with pytest.raises(RuntimeError, match="already has a cached prefix"):
        store.put(PrefixEntry(SessionId(2), 16, "device", torch.arange(16)))
    assert store.sessions() == [SessionId(0), SessionId(2)]


def test_fault_injector_rates() -> None:
    assert FaultInjector(0.0, 1).draw(4) is None
    inj = FaultInjector(1.0, 1)
    faults = [inj.draw(4) for _ in range(50)]
    assert all(f is not None for f in faults)
    kinds = {f.kind for f in faults if f is not None}
    assert kinds == {"fail", "abort"}
    assert all(0 <= f.at_layer < 4 for f in faults if f is not None)
    with pytest.raises(ValueError, match=r"rate must be in \[0, 1\], got 1.5"):
        FaultInjector(1.5, 0)


def _backed_up_prefix(stack: MemoryStack) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """32 tokens of session 5 written on the device and backed up; (host slots, sessions, pos)."""
    slots = stack.allocator.alloc(32)
    host_slots = stack.host_pool.alloc(32)
    assert slots is not None and host_slots is not None
    sessions = torch.full((32,), 5, dtype=torch.int64)
    positions = torch.arange(32)
    stack.write_kv(slots, sessions, positions)
    stack.host_pool.backup_from_device_all_layer(stack.kv_pool, host_slots, slots, "kernel")
    stack.allocator.free(slots)
    return host_slots, sessions, positions


def test_load_verification_catches_a_corrupted_host_byte() -> None:
    stack = build_stack(TINY, max_context_len=64)
    stats = SimStats()
    transfers = HostTransfers(stack, stats, FaultInjector(0.0, 0))
    try:
        host_slots, sessions, positions = _backed_up_prefix(stack)
        # page_first host layout: buffer[slot] holds that token's rows of every layer
        stack.host_pool.buffers[1][int(host_slots[9])].view(torch.uint8).view(-1)[5] ^= 1
        device_slots = stack.allocator.alloc(32)
        assert device_slots is not None
        assert transfers.load(host_slots, device_slots, sessions, positions) is True
        assert stats.integrity_failures == 1
        assert stats.pages_verified == 32 // TINY.page_size
    finally:
        transfers.close()
        stack.host_pool.close()


def test_aborted_load_reports_and_leaves_reads_working() -> None:
    stack = build_stack(TINY, max_context_len=64)
    stats = SimStats()
    transfers = HostTransfers(stack, stats, FaultInjector(1.0, 0))
    try:
        host_slots, sessions, positions = _backed_up_prefix(stack)
        device_slots = stack.allocator.alloc(32)
        assert device_slots is not None
        assert transfers.load(host_slots, device_slots, sessions, positions) is False
        load = stats.transfers["h2d load"]
        assert load.failed + load.aborted == 1 and load.calls == 0
        assert stats.integrity_failures == 0
        # the counter was reset and unregistered: the next forward reads without raising
        stack.kv_pool.get_key_buffer(0)
        assert stack.kv_pool.layer_transfer_counter is None
    finally:
        transfers.close()
        stack.host_pool.close()


@pytest.mark.parametrize(
    "overrides",
    [
        {"spec_draft": 3},
        {"spec_draft": 2, "page_size": 1},
        {"spec_draft": 5, "page_size": 4, "retract_after": 1},
        {"retract_after": 1, "faults": 0.2},
    ],
    ids=["spec3-ps16", "spec2-ps1", "spec5-ps4-retract", "retract-faults"],
)
def test_scheduler_shaped_frees_stay_clean(overrides: dict[str, object]) -> None:
    """Speculative decoding (rejected drafts freed as shuffled partial pages of several
    requests), partial tails freed by their slots, retraction under memory pressure: zero
    integrity failures and no leak."""
    cfg = dataclasses.replace(TINY, **overrides)  # type: ignore[arg-type]
    stats = run_simulation(cfg)
    _assert_clean(cfg, stats)
    if cfg.spec_draft:
        assert stats.rejected_draft_tokens > 0
        assert stats.draft_tokens > stats.decode_tokens
    if cfg.retract_after:
        assert stats.retractions > 0


def test_shared_prefix_content_is_session_independent() -> None:
    model = ContentModel([(2, 16)], torch.bfloat16, torch.device("cpu"), seed=3, shared_tokens=20)
    positions = torch.arange(40)
    a = model.hashes(torch.full((40,), 1), positions, layers=2)
    b = model.hashes(torch.full((40,), 2), positions, layers=2)
    assert torch.equal(a[:, :, :20], b[:, :, :20])  # the shared preamble: identical KV bytes
    assert bool((a[:, :, 20:] != b[:, :, 20:]).all())  # the sessions' own tokens differ
    with pytest.raises(ValueError, match="shared_tokens must be >= 0, got -1"):
        ContentModel([(2, 16)], torch.bfloat16, torch.device("cpu"), seed=3, shared_tokens=-1)


def test_shared_prefix_cache_refcounts_and_insertion() -> None:
    cache = SharedPrefixCache(40, page_size=16)  # page-aligned: 32 tokens cached
    assert cache.tokens == 32 and cache.tokens_held == 0
    assert cache.match(100) is None  # empty: a miss
    assert cache.insert(torch.arange(16), 16, 0) == (0, None)  # too short to adopt
    own = torch.arange(100, 164)
    assert cache.insert(own, 48, 0) == (32, None)  # adopted, one holder
    assert cache.tokens_held == 32 and cache.refs == 1
    assert torch.equal(cache.cached_slots(32), own[:32])
    other = torch.arange(200, 264)
    shared, dup = cache.insert(other, 64, 0)  # computed its own copy: duplicates to free
    assert shared == 32 and dup is not None and torch.equal(dup, other[:32])
    hit = cache.match(20)  # a short prompt matches one page (one token left to prefill)
    assert hit is not None and torch.equal(hit, own[:16]) and cache.refs == 3
    shared, dup = cache.insert(torch.cat([hit, torch.arange(300, 316)]), 32, 16)
    assert shared == 32 and dup is not None and torch.equal(dup, torch.arange(300, 316))
    assert cache.refs == 3  # the borrowed reference passed to the session entry
    assert cache.evict() is None  # held: never freed under its holders
    for _ in range(3):
        cache.release()
    evicted = cache.evict()
    assert evicted is not None and torch.equal(evicted, own[:32]) and cache.tokens_held == 0
    with pytest.raises(RuntimeError, match="release"):
        cache.release()


@pytest.mark.parametrize(
    "overrides",
    [{}, {"page_size": 4, "retract_after": 1, "spec_draft": 2}, {"model": "mla", "faults": 0.2}],
    ids=["mha-ps16", "mha-ps4-retract-spec", "mla-faults"],
)
def test_shared_prefix_insertion_frees_duplicate_pages(overrides: dict[str, object]) -> None:
    """Radix-like insertion at finish: the duplicate pages a finished request computed for the
    shared preamble are freed through the allocator's ``free``, later requests reuse the cached
    pages; every sequence still verifies bit-exact and nothing leaks."""
    cfg = dataclasses.replace(TINY, shared_prefix_tokens=40, **overrides)  # type: ignore[arg-type]
    stats = run_simulation(cfg)
    _assert_clean(cfg, stats)
    assert stats.duplicate_pages_freed > 0
    assert stats.shared_prefix_hits > 0 and stats.shared_prefix_hit_tokens > 0
    assert stats.sequences_verified == cfg.requests
    doc = report_dict(cfg, stats)["shared_prefix"]
    assert doc["duplicate_pages_freed"] == stats.duplicate_pages_freed
    off = run_simulation(dataclasses.replace(cfg, shared_prefix_tokens=0))
    assert off.duplicate_pages_freed == 0 and off.shared_prefix_hits == 0
