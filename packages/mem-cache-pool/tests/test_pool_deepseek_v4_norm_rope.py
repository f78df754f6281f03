"""``DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused_norm_rope``: SGLang 0.5.23's fused
K store (``fused_k_norm_rope_flashmla``, V4 layout) against a plain composition of RMS-norm, RoPE
and :meth:`set_swa_key_buffer_radix_fused`, bit-exact; the query rope; skipped rows; failed
calls change nothing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from mem_cache_pool.deepseek_v4 import DeepSeekV4TokenToKVPool

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16


def _pool() -> DeepSeekV4TokenToKVPool:
    return DeepSeekV4TokenToKVPool(
        max_num_reqs=4, swa_size=32, c4_size=64, c128_size=2, c4_state_pool_size=4,
        c128_state_pool_size=4, page_size=128, swa_page_size=4, dtype=FP8,
        c4_state_dtype=torch.float32, c128_state_dtype=torch.float32, qk_nope_head_dim=448,
        qk_rope_head_dim=64, indexer_head_dim=16, layer_num=3, device="cpu",
        enable_memory_saver=False, compression_ratios=[0, 4, 128],
    )  # fmt: skip


def _inputs(n: int, seed: int, dtype: torch.dtype = BF16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(40, 32, generator=g) * 7
    return {
        "kv": (torch.randn(n, 512, generator=g) * 3).to(dtype),
        "kv_weight": (torch.rand(512, generator=g) + 0.5).to(dtype),
        "freqs_cis": torch.polar(torch.ones_like(angles), angles),
        "positions": torch.randint(0, 40, (n,), generator=g),
    }


def _reference_rows(x: dict[str, torch.Tensor], eps: float) -> torch.Tensor:
    """RMS-norm then RoPE, written out plainly in float32 (no rounding in between)."""
    kv, w = x["kv"].float(), x["kv_weight"].float()
    n = kv.shape[0]
    normed = kv * torch.rsqrt(kv.pow(2).sum(-1, keepdim=True) / 512 + eps) * w
    out = normed.clone()
    f = x["freqs_cis"][x["positions"]]
    for j in range(32):
        re, im = normed[:, 448 + 2 * j], normed[:, 449 + 2 * j]
        c, s = f[:, j].real, f[:, j].imag
        out[:, 448 + 2 * j] = re * c - im * s
        out[:, 449 + 2 * j] = re * s + im * c
    assert out.shape == (n, 512)
    return out


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
def test_equals_norm_then_rope_then_the_fused_store(dtype: torch.dtype) -> None:
    x = _inputs(6, seed=1, dtype=dtype)
    loc = torch.tensor([5, -1, 2, 31, 16, -7], dtype=torch.int32)
    kv_before = x["kv"].clone()
    pool, ref = _pool(), _pool()
    pool.set_swa_key_buffer_radix_fused_norm_rope(2, loc, eps=1e-6, **x)
    keep = loc >= 0
    ref.set_swa_key_buffer_radix_fused(2, loc[keep], _reference_rows(x, 1e-6)[keep])
    for layer in range(3):  # placement, untouched slots and layers, skipped rows: whole buffers
        assert torch.equal(pool.get_swa_raw_buffer(layer), ref.get_swa_raw_buffer(layer))
    assert int(pool.get_swa_raw_buffer(2).count_nonzero()) > 0
    assert torch.equal(x["kv"], kv_before)  # kv is read only


def test_nope_is_quantised_from_fp32_not_from_bf16_rounded_rows() -> None:
    x = _inputs(32, seed=2)
    loc = torch.arange(32)
    pool, bf16_path = _pool(), _pool()
    pool.set_swa_key_buffer_radix_fused_norm_rope(1, loc, eps=1e-6, **x)
    rows = _reference_rows(x, 1e-6)
    bf16_path.set_swa_key_buffer_radix_fused(1, loc, rows.to(BF16))
    mine, other = pool.get_swa_raw_buffer(1), bf16_path.get_swa_raw_buffer(1)
    assert not torch.equal(mine, other)  # SGLang's fused kernel quantises the fp32 registers


def test_query_heads_are_rotated_in_place_even_without_a_slot() -> None:
    x = _inputs(4, seed=3)
    loc = torch.tensor([3, -1, 8, 9])
    g = torch.Generator().manual_seed(4)
    q = (torch.randn(4, 3, 512, generator=g) * 2).to(BF16)
    q_before = q.clone()
    pool, no_q = _pool(), _pool()
    pool.set_swa_key_buffer_radix_fused_norm_rope(0, loc, eps=1e-5, q=q, **x)
    no_q.set_swa_key_buffer_radix_fused_norm_rope(0, loc, eps=1e-5, **x)
    assert torch.equal(pool.get_swa_raw_buffer(0), no_q.get_swa_raw_buffer(0))
    assert torch.equal(q[..., :448], q_before[..., :448])  # nope dims untouched, no norm
    f = x["freqs_cis"][x["positions"]][:, None, :]  # [n, 1, 32]
    tail = q_before[..., 448:].float()
    want = torch.view_as_real(torch.view_as_complex(tail.reshape(4, 3, 32, 2).contiguous()) * f)
    assert torch.equal(q[..., 448:], want.reshape(4, 3, 64).to(BF16))
    assert not torch.equal(q[1], q_before[1])  # the row with swa_loc -1 is rotated too


def test_no_rows_and_all_rows_skipped_write_nothing() -> None:
    pool = _pool()
    x = _inputs(0, seed=5)
    pool.set_swa_key_buffer_radix_fused_norm_rope(
        1, torch.tensor([], dtype=torch.int64), eps=1e-6, **x
    )
    x = _inputs(3, seed=5)
    pool.set_swa_key_buffer_radix_fused_norm_rope(1, torch.tensor([-1, -1, -3]), eps=1e-6, **x)
    assert int(pool.get_swa_raw_buffer(1).count_nonzero()) == 0


def _bad(x: dict[str, object], **change: object) -> dict[str, object]:
    return {**x, **change}


@pytest.mark.parametrize(
    ("change", "error", "name"),
    [
        (lambda x: {"swa_loc": torch.tensor([1, 10**6, 2])}, ValueError, "swa_loc"),
        (lambda x: {"positions": torch.tensor([0, 40, 1])}, ValueError, "positions"),
        (lambda x: {"positions": torch.tensor([0, 1])}, ValueError, "positions"),
        (lambda x: {"freqs_cis": torch.view_as_real(x["freqs_cis"])}, TypeError, "freqs_cis"),
        (lambda x: {"freqs_cis": x["freqs_cis"][:, :16]}, ValueError, "freqs_cis"),
        (lambda x: {"kv": x["kv"][:, :448]}, ValueError, "kv"),
        (lambda x: {"kv": x["kv"].to(torch.int32)}, TypeError, "kv"),
        (lambda x: {"kv_weight": x["kv_weight"][:64]}, ValueError, "kv_weight"),
        (lambda x: {"eps": "1e-6"}, TypeError, "eps"),
        (lambda x: {"q": torch.zeros(3, 2, 64, dtype=BF16)}, ValueError, "q"),
        (lambda x: {"layer_id": 7}, ValueError, "layer_id"),
    ],
)
def test_a_failed_call_changes_nothing(
    change: Callable[[dict[str, object]], dict[str, object]], error: type, name: str
) -> None:
    pool = _pool()
    q = torch.ones(3, 2, 512, dtype=BF16)
    args: dict[str, object] = {
        "layer_id": 1, "swa_loc": torch.tensor([1, 2, 3]), "eps": 1e-6, "q": q, **_inputs(3, 6)
    }  # fmt: skip
    args = _bad(args, **change(args))
    with pytest.raises(error, match=name):
        pool.set_swa_key_buffer_radix_fused_norm_rope(**args)  # type: ignore[arg-type]
    assert int(pool.get_swa_raw_buffer(1).count_nonzero()) == 0
    assert torch.equal(q, torch.ones(3, 2, 512, dtype=BF16))
