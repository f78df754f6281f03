"""Child process of ``test_deepseek_v4_pool.py``: SGLang 0.5.23's DeepSeek-V4 store and cleanup
Triton kernels run under the Triton interpreter (``TRITON_INTERPRET=1``, set by the parent before
this process imports Triton) next to our pool's members on the same inputs.

Prints one JSON object: per check, the number of compared bytes / values and of mismatches. A
quantising store's fp8 bytes are compared with the exact scaled value: the interpreter's float ->
fp8 cast is not the GPU's (PTX ``cvt.rn``, round to nearest even): it rounds ties away from zero
and drops the carry of a value that rounds up into the next power of two (125.8 -> 64, not 128).
So where the bytes differ, ours must be the nearer to the exact value; scales, rope bytes,
placement and untouched slots must be equal.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mem_cache_kernels.deepseek_v4 import quantize_nope, read_records
from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool
from tools.sglang_ref import load

FP8 = torch.float8_e4m3fn


def _pool(**kw: object) -> DeepSeekV4TokenToKVPool:
    args: dict[str, object] = dict(
        max_num_reqs=4, swa_size=32, c4_size=64, c128_size=2, c4_state_pool_size=4,
        c128_state_pool_size=4, page_size=128, swa_page_size=4, dtype=FP8,
        c4_state_dtype=torch.float32, c128_state_dtype=torch.float32, qk_nope_head_dim=448,
        qk_rope_head_dim=64, indexer_head_dim=128, layer_num=3, device="cpu",
        enable_memory_saver=False, compression_ratios=[0, 4, 128],
    )  # fmt: skip
    args.update(kw)
    return DeepSeekV4TokenToKVPool(**args)  # type: ignore[arg-type]


def _fp8_match(ours: torch.Tensor, theirs: torch.Tensor, exact: torch.Tensor) -> dict[str, int]:
    """Compare fp8 bytes: where they differ, ours must be at least as close to the exact scaled
    value as the interpreter's (``ours_farther`` counts the bytes where it is not)."""
    a, b = ours.view(torch.uint8), theirs.view(torch.uint8)
    diff = a != b
    farther = (ours.float() - exact).abs() > (theirs.float() - exact).abs()
    return {
        "compared": a.numel(),
        "differ": int(diff.sum()),
        "ours_farther": int((diff & farther).sum()),
    }


def _norm_rope(
    pool: DeepSeekV4TokenToKVPool, store: Any, rope_ops: Any, g: torch.Generator
) -> dict[str, dict[str, int]]:
    """set_swa_key_buffer_radix_fused_norm_rope against SGLang's pieces of its fused kernel.

    ``fused_k_norm_rope_flashmla`` is a CUDA JIT kernel (no Triton, no CPU path), so SGLang's side
    is its kernel's steps from SGLang's Triton code: the fp32 RMS-norm (written here, as the CUDA
    kernel does it: ``x * rsqrt(sum(x * x) / 512 + eps) * w``, no bf16 rounding), SGLang's DSv4
    RoPE kernel (``apply_rotary_emb_triton``, batched as DeepseekV4 sets it; the query rope of
    the ROCm launch is documented bitwise equal to it) on the fp32 rope dims and on ``q``, then
    SGLang's flashmla fused store of the fp32 rows at the slots ``>= 0`` (the CUDA kernel skips
    ``swa_loc < 0``; the Triton store has no such check). The bf16 roundings of the rope dims
    and of ``q`` are done by torch (round to nearest even, as the GPU kernels' casts), since the
    interpreter's float -> bf16 store does not round so."""
    n, layer = 6, 0
    kv = (torch.randn(n, 512, generator=g) * 3).to(torch.bfloat16)
    weight = (torch.rand(512, generator=g) + 0.5).to(torch.bfloat16)
    angles = torch.rand(64, 32, generator=g) * 7
    freqs = torch.polar(torch.ones_like(angles), angles)
    positions = torch.randint(0, 64, (n,), generator=g)
    loc = torch.tensor([7, -1, 30, 0, 13, 22], dtype=torch.int32)
    q = (torch.randn(n, 4, 512, generator=g) * 2).to(torch.bfloat16)
    q_theirs, q_before = q.clone(), q.clone()
    pool.set_swa_key_buffer_radix_fused_norm_rope(
        layer, loc, kv, weight, 1e-6, freqs, positions, q=q
    )
    rope_ops.set_batched_rope(True)
    x = kv.float()
    rows = x * torch.rsqrt((x * x).sum(-1, keepdim=True) / 512 + 1e-6) * weight.float()
    keep = loc >= 0
    rows, pos, slots = rows[keep].contiguous(), positions[keep], loc[keep]
    tail = rows[:, 448:].contiguous()
    rope_ops.apply_rotary_emb_triton(tail, freqs, positions=pos)
    # bf16 casts by torch (round to nearest even, the GPU's cvt.rn), not by the interpreter
    rows[:, 448:] = tail.to(torch.bfloat16).float()
    theirs = torch.zeros_like(pool.get_swa_raw_buffer(layer))
    store.triton_fused_store_cache(
        rows, theirs, slots, page_size=pool.swa_page_size, type="flashmla"
    )
    q_tail = q_theirs[..., 448:].float()
    rope_ops.apply_rotary_emb_triton(q_tail, freqs, positions=positions)
    q_theirs[..., 448:] = q_tail.to(torch.bfloat16)
    mine_buf = pool.get_swa_raw_buffer(layer)
    a = read_records(mine_buf, slots, pool.swa_page_size)
    b = read_records(theirs, slots, pool.swa_page_size)
    tiles = rows[:, :448].view(-1, 7, 64)
    exp = torch.ceil(torch.log2(tiles.abs().amax(-1).clamp_min(1e-8) / 448.0))
    exact = (tiles * torch.exp2(-exp)[..., None]).reshape(-1, 448)
    untouched = torch.ones(theirs.shape[0] * pool.swa_page_size, dtype=torch.bool)
    untouched[slots.long()] = False
    other = untouched.nonzero().flatten()
    return {
        "norm_rope.nope": _fp8_match(a[:, :448].view(FP8), b[:, :448].view(FP8), exact),
        "norm_rope.rest": {
            "compared": a[:, 448:].numel(),
            "differ": int((a[:, 448:] != b[:, 448:]).sum()),
        },
        "norm_rope.other_slots": {
            "compared": other.numel(),
            "differ": int(
                (read_records(mine_buf, other, pool.swa_page_size) != 0).sum()
                + (read_records(theirs, other, pool.swa_page_size) != 0).sum()
            ),
        },
        "norm_rope.q": {
            "compared": q.numel(),
            "differ": int((q.view(torch.int16) != q_theirs.view(torch.int16)).sum()),
            "rotated": int((q.view(torch.int16) != q_before.view(torch.int16)).sum()),
        },
    }


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run by the parent test only"
    kv_store, store, cleanup, rope_ops = load(
        "sglang.kernels.ops.kvcache.dsv4_main_kv_store",
        "sglang.kernels.ops.kvcache.triton_store_cache",
        "sglang.kernels.ops.kvcache.dsv4_c128_cleanup",
        "sglang.kernels.ops.attention.dsv4.rope",
    )
    g = torch.Generator().manual_seed(24)
    out: dict[str, dict[str, int]] = {}

    # set_swa_key_buffer / set_extra_key_buffer with SGLang's NopeFp8RopeBf16Pack (SetKAndS)
    pool = _pool()
    n = 5
    nope, scales = quantize_nope(torch.randn(n, 448, generator=g) * 3)
    rope = torch.randn(n, 64, generator=g).to(torch.bfloat16)
    pack = kv_store.NopeFp8RopeBf16Pack(
        k_nope_fp8=nope.contiguous(), k_rope_bf16=rope, scale_k_nope_ue8m0=scales.contiguous()
    )
    swa_loc = torch.tensor([5, 9, 2, 31, 16])
    pool.set_swa_key_buffer(1, swa_loc, pack)
    theirs = torch.zeros_like(pool.get_swa_raw_buffer(1))
    kv_store._set_k_and_s_triton(theirs, swa_loc, pack, pool.swa_page_size)
    mine = pool.get_swa_raw_buffer(1)
    out["set_swa_key_buffer"] = {"compared": mine.numel(), "differ": int((mine != theirs).sum())}
    c4_loc = torch.tensor([33, 40, 63, 1, 0])
    pool.set_extra_key_buffer(1, c4_loc, pack)
    theirs = torch.zeros_like(pool.get_extra_key_buffer(1).view(torch.uint8))
    kv_store._set_k_and_s_triton(theirs, c4_loc, pack, pool.get_extra_key_page_size(1))
    mine = pool.get_extra_key_buffer(1).view(torch.uint8)
    out["set_extra_key_buffer"] = {"compared": mine.numel(), "differ": int((mine != theirs).sum())}

    # set_swa_key_buffer_radix_fused: SGLang's flashmla fused quantise + store
    x = (torch.randn(n, 512, generator=g) * 5).to(torch.bfloat16)
    pool.set_swa_key_buffer_radix_fused(2, swa_loc, x)
    theirs = torch.zeros_like(pool.get_swa_raw_buffer(2))
    store.triton_fused_store_cache(
        x, theirs, swa_loc, page_size=pool.swa_page_size, type="flashmla"
    )
    a = read_records(pool.get_swa_raw_buffer(2), swa_loc, pool.swa_page_size)
    b = read_records(theirs, swa_loc, pool.swa_page_size)
    tiles = x.float()[:, :448].view(n, 7, 64)
    exp = torch.ceil(torch.log2(tiles.abs().amax(-1).clamp_min(1e-8) / 448.0))
    exact = (tiles * torch.exp2(-exp)[..., None]).reshape(n, 448)
    out["set_swa_key_buffer_radix_fused.nope"] = _fp8_match(
        a[:, :448].view(FP8), b[:, :448].view(FP8), exact
    )
    out["set_swa_key_buffer_radix_fused.rest"] = {
        "compared": a[:, 448:].numel(),
        "differ": int((a[:, 448:] != b[:, 448:]).sum()),
    }
    untouched = torch.ones(theirs.shape[0] * pool.swa_page_size, dtype=torch.bool)
    untouched[swa_loc] = False
    other = untouched.nonzero().flatten()
    out["set_swa_key_buffer_radix_fused.other_slots"] = {
        "compared": other.numel(),
        "differ": int(
            (read_records(pool.get_swa_raw_buffer(2), other, pool.swa_page_size) != 0).sum()
            + (read_records(theirs, other, pool.swa_page_size) != 0).sum()
        ),
    }

    out.update(_norm_rope(pool, store, rope_ops, g))

    # set_index_k_fused: SGLang's indexer fused quantise + store (keys then fp32 scales)
    keys = (torch.randn(n, 128, generator=g) * 2).to(torch.bfloat16)
    pool.set_index_k_fused(1, c4_loc, keys)
    theirs = torch.zeros_like(pool.get_index_k_with_scale_buffer(1))
    index_ps = pool.get_index_k_page_size(4)
    store.triton_fused_store_cache(keys, theirs, c4_loc, page_size=index_ps, type="indexer")
    mine = pool.get_index_k_with_scale_buffer(1)
    split = index_ps * 128
    scale = keys.float().abs().amax(1).clamp_min(1e-8) / 448.0
    page, off = c4_loc // index_ps, c4_loc % index_ps
    k_mine = mine[:, :split].view(-1, index_ps, 128)[page, off]
    k_theirs = theirs[:, :split].view(-1, index_ps, 128)[page, off]
    exact = keys.float() * (1.0 / scale)[:, None]
    out["set_index_k_fused.keys"] = _fp8_match(k_mine.view(FP8), k_theirs.view(FP8), exact)
    out["set_index_k_fused.scales"] = {
        "compared": mine[:, split:].numel(),
        "differ": int((mine[:, split:] != theirs[:, split:]).sum()),
    }
    out["set_index_k_fused.other_keys"] = {
        "compared": mine[:, :split].numel(),
        "differ": int((mine[:, :split] != theirs[:, :split]).sum())
        - out["set_index_k_fused.keys"]["differ"],
    }

    # clear_unaccepted_c128_draft_states: SGLang's cleanup kernel on its fused kv | score rows
    spec = _pool(online_mtp_max_draft_tokens=3)  # c128 ring 256, as SGLang's speculative ring
    state = spec.compress_state_pools[2]
    assert state is not None and state.ring_size == 256
    state.kv_state.copy_(torch.randn(state.kv_state.shape, generator=g))
    state.score_state.copy_(torch.randn(state.score_state.shape, generator=g))
    fused = torch.cat([state.kv_state, state.score_state], dim=1).contiguous()
    req = torch.tensor([1, 3, 4, 2])
    seq = torch.tensor([254, 10, 512, 0])
    acc = torch.tensor([1, 4, 0, 2])
    spec.clear_unaccepted_c128_draft_states(req, seq, acc, 4)
    cleanup.clear_unaccepted_c128_draft_states(
        fused, req, seq, acc, ring_size=state.ring_size, num_draft_tokens=4
    )
    mine = torch.cat([state.kv_state, state.score_state], dim=1)
    out["clear_unaccepted_c128_draft_states"] = {
        "compared": mine.numel(),
        "differ": int((mine.view(torch.int32) != fused.view(torch.int32)).sum()),
        "cleared_rows": int((state.score_state == float("-inf")).all(dim=1).sum()),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
