"""SGLang 0.5.23's own ``DeepSeekV4TokenToKVPool``, built on the CPU from its wheel, next to ours.

SGLang's pool is constructed with the same arguments under a runtime context published from a
default ``ServerArgs`` (no speculative decoding, no unified KV, the V4 layout, offline c128), and
every member of its 0.5.23 surface that answers without a GPU kernel is asked of both pools: the
layout getters, registries, compress-state structure, request-state transfer indices, buffer-info
geometry and the feature-off answers must agree, and SGLang's own ``clear_request_scoped_state``
body must leave its c128 state rings bit-for-bit equal to ours.

SGLang's writes (``set_swa_key_buffer`` / ``set_extra_key_buffer`` through ``SetKAndS``, the
fused flashmla and indexer stores) and ``clear_unaccepted_c128_draft_states`` are Triton kernels:
they run in a child process under the Triton interpreter (``_deepseek_v4_kernel_child.py``) next
to our members on the same inputs, bit-for-bit, except the interpreter's float -> fp8 cast,
which is not the GPU's round-to-nearest-even (there ours must be the nearer value; see the child).
``set_swa_key_buffer_radix_fused_norm_rope`` calls a CUDA-only kernel; it is compared with its
steps composed from SGLang's Triton RoPE and fused store (the child says how).
SGLang's c4 state rows hold an overlap window (twice our width), so only the c128 rings are
compared by content. SGLang derives the c4 indexer size from ``c128_size * 32``, which is 0 in a
model without ratio-128 layers; ours covers the logical c4 space (``size // 4``) in every model,
so ``c4_logical_size`` is compared where ratio-128 layers exist.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool

ROOT = Path(__file__).resolve().parents[2]
POOL_TESTS = ROOT / "packages" / "mem-cache-pool" / "tests"

Load = Callable[..., list[types.ModuleType]]
CONFIGS = {
    "c4+c128": dict(compression_ratios=[0, 4, 128, 4], layer_num=4, page_size=128, c128_size=2),
    "c128 first": dict(compression_ratios=[128, 0, 4], layer_num=3, page_size=256, c128_size=3),
    "c4 only": dict(compression_ratios=[4, 0, 4], layer_num=3, page_size=64, c128_size=0),
}


def _args(config: dict[str, Any]) -> dict[str, Any]:
    """The arguments both pools are built with: mem-cache-pool's test builder
    (``deepseek_v4_args`` of its ``tests/conftest.py``) with a wider SWA and indexer, then
    ``config``."""
    deepseek_v4_args = runpy.run_path(str(POOL_TESTS / "conftest.py"))["deepseek_v4_args"]
    return dict(deepseek_v4_args(swa_size=32, indexer_head_dim=128, **config))


@pytest.fixture(scope="module")
def sglang_v4(sglang_load: Load) -> tuple[types.ModuleType, Callable[[], Any]]:
    """SGLang's pool module and ``enter()``, a context manager activating a runtime context
    published from ``ServerArgs(model_path="dummy")`` (SGLang's dummy-model short circuit: the
    defaults, no model files read)."""
    pool_mod, rc, sa = sglang_load(
        "sglang.srt.mem_cache.deepseek_v4_memory_pool",
        "sglang.srt.runtime_context",
        "sglang.srt.server_args",
    )
    assert pool_mod.ONLINE_C128 is False  # the default: offline c128 rings, as ours
    context = rc.create_context(sa.ServerArgs(model_path="dummy"), role="scheduler")
    return pool_mod, lambda: rc.use_context(context)


@pytest.fixture(params=sorted(CONFIGS))
def pair(
    request: pytest.FixtureRequest, sglang_v4: tuple[types.ModuleType, Callable[[], Any]]
) -> Iterator[tuple[Any, DeepSeekV4TokenToKVPool]]:
    """(SGLang's pool, ours) built with the same arguments; the test body runs in the context."""
    pool_mod, enter = sglang_v4
    args = _args(CONFIGS[request.param])
    with enter():
        yield pool_mod.DeepSeekV4TokenToKVPool(**args), DeepSeekV4TokenToKVPool(**args)


def _compressed_layers(pool: DeepSeekV4TokenToKVPool) -> list[int]:
    return [i for i, r in enumerate(pool.compression_ratios) if r]


def test_surface_answers_match_sglangs(pair: tuple[Any, Any]) -> None:
    theirs, ours = pair
    compressed = _compressed_layers(ours)
    c4 = [i for i, r in enumerate(ours.compression_ratios) if r == 4]
    ratios = sorted(set(ours.compression_ratios) - {0})
    questions: dict[str, Callable[[Any], object]] = {
        "c4_logical_size": lambda p: p.c4_logical_size if 128 in ratios else None,
        "present_ratios": lambda p: tuple(p.present_ratios),
        "sources_by_ratio": lambda p: dict(p.sources_by_ratio),
        "pd_kv_layout": lambda p: p.pd_kv_layout(),
        "kv_layout": lambda p: p.kv_layout == "v4",
        "compressed_kv_layout": lambda p: [p.compressed_kv_layout(r) == "v4" for r in ratios],
        "get_swa_key_layout": lambda p: p.get_swa_key_layout() == "v4",
        "get_swa_key_bytes_per_token": lambda p: p.get_swa_key_bytes_per_token(),
        "get_swa_key_page_size": lambda p: p.get_swa_key_page_size(),
        "get_extra_key_page_size": lambda p: [p.get_extra_key_page_size(i) for i in compressed],
        "get_extra_key_layout": lambda p: [p.get_extra_key_layout(i) == "v4" for i in compressed],
        "get_extra_key_bytes_per_token": lambda p: [
            p.get_extra_key_bytes_per_token(i) for i in compressed
        ],
        "get_index_k_page_size": lambda p: p.get_index_k_page_size(4) if c4 else None,
        "source_layer_of": lambda p: [p.source_layer_of(i) for i in compressed],
        "get_ring_size": lambda p: [p.get_ring_size(r) for r in (4, 128)],
        "needs_paged_swa_allocator": lambda p: p.needs_paged_swa_allocator,
        "uniform_fp8": lambda p: p.uniform_fp8,
        "swa_valid_from": lambda p: p.swa_valid_from,
        "unified_kv_pool": lambda p: p.unified_kv_pool,
        "online_c128_mtp_pending_seq_lens": lambda p: p.online_c128_mtp_pending_seq_lens,
        "get_online_c128_mtp_state_slot_offset": lambda p: (
            p.get_online_c128_mtp_state_slot_offset()
        ),
        "get_online_c128_mtp_max_draft_tokens": lambda p: p.get_online_c128_mtp_max_draft_tokens(),
        "low_ratio_index_k_page8_ratios": lambda p: p.low_ratio_index_k_page8_ratios(),
        "low_ratio_index_k_is_split": lambda p: [p.low_ratio_index_k_is_split(i) for i in c4],
        "low_ratio_index_k_page8": lambda p: [p.low_ratio_index_k_page8(i) for i in c4],
        "get_swa_valid_from_buf_infos": lambda p: p.get_swa_valid_from_buf_infos(),
        "get_unified_swa_ring_buf_infos": lambda p: p.get_unified_swa_ring_buf_infos(),
        "unified_rope_region_buffers": lambda p: p.unified_rope_region_buffers(4),
        "clear_c4_req_states": lambda p: p.clear_c4_req_states([1, 2]),
        "num_req_slots": lambda p: p.num_req_slots,
        "buffer views": lambda p: [
            (b.dtype, tuple(b.shape[1:]))
            for i in compressed
            for b in (
                p.get_extra_key_buffer(i),
                p.get_swa_key_buffer_radix(i),
                p.get_swa_raw_buffer(i),
                *([p.get_index_k_with_scale_buffer(i)] if i in c4 else []),
            )
        ],
        "kv_pools": lambda p: sorted(p.kv_pools),
        "index_pools": lambda p: sorted(p.index_pools),
        "compressed_pool_configs": lambda p: {
            r: (c.kv_size, c.state_dtype, c.indexer_size if 128 in ratios else None)
            for r, c in p.compressed_pool_configs.items()
        },
        "compress_state_pools": lambda p: [
            None if s is None else (s.ratio, s.request_scoped, s.online, s.ring_size)
            for s in p.compress_state_pools
        ],
        "indexer_compress_state_pools": lambda p: [
            None if s is None else (s.ratio, s.request_scoped, s.ring_size)
            for s in p.indexer_compress_state_pools
        ],
    }
    for name, ask in questions.items():
        assert ask(ours) == ask(theirs), name


def test_request_state_transfer_indices_match_sglangs(pair: tuple[Any, Any]) -> None:
    theirs, ours = pair
    if 128 not in ours.compression_ratios:
        for pool in pair:  # both refuse: no request-scoped state
            with pytest.raises((AssertionError, ValueError)):
                pool.request_state_transfer_indices(1, 3)
        return
    for req in range(ours.num_req_slots):
        for seq_len in (0, 1, 127, 128, 129, 255, 256, 300, 1000):
            want = theirs.request_state_transfer_indices(req, seq_len)
            got = ours.request_state_transfer_indices(req, seq_len)
            assert got.dtype == want.dtype == np.int32
            assert got.tolist() == want.tolist(), (req, seq_len)


def test_buffer_info_geometry_matches_sglangs(pair: tuple[Any, Any]) -> None:
    theirs, ours = pair
    _, their_lens, their_items = theirs.get_contiguous_buf_infos()
    ptrs, lens, items = ours.get_contiguous_buf_infos()
    assert items == their_items  # one page row each: KV of every ratio, then its indexer
    assert len(set(ptrs)) == len(ptrs) == len(their_lens)
    # whole page rows; SGLang pads each pool by a logical (full) page, ours by one own page
    assert all(n % item == 0 and n >= 2 * item for n, item in zip(lens, items))
    _, _, their_req_items = theirs.get_request_state_buf_infos()
    _, req_lens, req_items = ours.get_request_state_buf_infos()
    # SGLang keeps kv | score in one row per layer; ours in two buffers of half the width
    assert [2 * i for i in req_items[::2]] == their_req_items
    assert req_items[::2] == req_items[1::2] and len(req_lens) == 2 * len(their_req_items)


def test_clear_request_scoped_state_leaves_sglangs_rings_bit_equal(pair: tuple[Any, Any]) -> None:
    theirs, ours = pair
    layers = [i for i, r in enumerate(ours.compression_ratios) if r == 128]
    g = torch.Generator().manual_seed(24)
    for lid in layers:
        mine, sgl = ours.compress_state_pools[lid], theirs.compress_state_pools[lid]
        rows, width = mine.kv_state.shape
        kv, score = torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)
        mine.kv_state.copy_(kv)
        mine.score_state.copy_(score)
        sgl.kv_score_buffer.kv_score[:rows].copy_(torch.cat([kv, score], dim=1))
    for req in (2, 0, ours.num_req_slots - 1):
        ours.clear_request_scoped_state(req)
        theirs.clear_request_scoped_state(req)
        for lid in layers:
            mine, sgl = ours.compress_state_pools[lid], theirs.compress_state_pools[lid]
            rows, width = mine.kv_state.shape
            both = sgl.kv_score_buffer.kv_score[:rows]
            assert torch.equal(mine.kv_state, both[:, :width]), (req, lid)
            assert torch.equal(mine.score_state, both[:, width:]), (req, lid)


def test_sglang_triton_kernels_write_what_ours_writes() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("_deepseek_v4_kernel_child.py"))],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    exact = [
        "set_swa_key_buffer",
        "set_extra_key_buffer",
        "set_swa_key_buffer_radix_fused.rest",
        "set_swa_key_buffer_radix_fused.other_slots",
        "set_index_k_fused.scales",
        "set_index_k_fused.other_keys",
        "clear_unaccepted_c128_draft_states",
        "norm_rope.rest",
        "norm_rope.other_slots",
        "norm_rope.q",
    ]
    for name in exact:
        assert report[name]["compared"] > 0 and report[name]["differ"] == 0, (name, report[name])
    assert report["norm_rope.q"]["rotated"] > 1000  # 6 tokens x 4 heads x 64 rope dims
    for name in ("set_swa_key_buffer_radix_fused.nope", "set_index_k_fused.keys", "norm_rope.nope"):
        check = report[name]
        assert check["ours_farther"] == 0, (name, check)
        assert check["differ"] * 10 < check["compared"], (name, check)  # the cast's edge cases
    assert report["clear_unaccepted_c128_draft_states"]["cleared_rows"] == 9
