"""The RMS-norm + RoPE of SGLang 0.5.23's ``fused_k_norm_rope_flashmla`` (V4 layout), in torch.

SGLang's CUDA kernel (``main_norm_rope.cuh``), which
:meth:`~mem_cache_pool.deepseek_v4.DeepSeekV4TokenToKVPool.set_swa_key_buffer_radix_fused_norm_rope`
follows, does per row ``b`` of ``kv`` ``[B, 512]``, all in float32 registers:

- RMS-norm over all 512 dims: ``f = rsqrt(sum(x * x) / 512 + eps)``, ``y = (x * f) * w`` with
  ``w = kv_weight`` (no bf16 rounding of ``y``: the fp8 nope part is quantised from these fp32
  values, which is what SGLang's model notes against its bf16 fallback path);
- RoPE of dims 448..511 as 32 interleaved (real, imag) pairs ``(y[448 + 2j], y[449 + 2j])`` times
  ``freqs_cis[positions[b], j]`` (complex64 ``[max_pos, 32]``): ``re = yr * c - yi * s``,
  ``im = yr * s + yi * c``, rounded to bf16 only by the store;
- ``kv`` is read only;
- with ``q`` ``[B, H, 512]`` (SGLang's ROCm launch; its CUDA launch asserts ``q is None``), the
  last 64 dims of every head are rotated in place with the same frequencies, not normed, rounding
  as that kernel: ``re = fma(qr, c, -(qi * s))``, ``im = fma(qi, c, qr * s)`` with each cross
  product rounded to fp32 first, the result cast to ``q``'s dtype. Rows without a KV slot
  (``swa_loc < 0``) still rotate their query heads.

The sums are added in torch's order, not the GPU's reduction tree, and the GPU may contract the
kv rotation into fma: the fp32 values can differ from a GPU's in the last bit.
"""

from __future__ import annotations

import torch

from mem_cache_kernels import checks

__all__ = ["check_norm_rope_args", "norm_rope_rows", "rope_query_"]

_HEAD_DIM = 512
_ROPE_DIM = 64
_NOPE_DIM = _HEAD_DIM - _ROPE_DIM
_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


def check_norm_rope_args(  # noqa: PLR0917 (SGLang's arguments)
    n: int,
    device: torch.device,
    kv: object,
    kv_weight: object,
    eps: object,
    freqs_cis: object,
    positions: object,
    q: object,
) -> tuple[torch.Tensor, torch.Tensor, float, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Check the arguments for ``n`` rows on ``device``; return them typed
    (``TypeError`` wrong kind, ``ValueError`` wrong shape, value or device)."""
    kv_t = checks.check_tensor_of("kv", kv, dtypes=_FLOATS, dim=2, shape="[n, 512]")
    if tuple(kv_t.shape) != (n, _HEAD_DIM):
        raise ValueError(f"kv must have shape ({n}, {_HEAD_DIM}), got {tuple(kv_t.shape)}")
    w = checks.check_tensor_of("kv_weight", kv_weight, dtypes=_FLOATS, dim=1, shape="[512]")
    if w.shape[0] != _HEAD_DIM:
        raise ValueError(f"kv_weight must have shape ({_HEAD_DIM},), got {tuple(w.shape)}")
    eps_f = checks.check_number("eps", eps)
    freqs = checks.check_tensor_of(
        "freqs_cis", freqs_cis, dtypes=(torch.complex64,), dim=2, shape="[max_pos, 32]"
    )
    if freqs.shape[1] != _ROPE_DIM // 2:
        raise ValueError(
            f"freqs_cis must have {_ROPE_DIM // 2} columns (complex pairs of the 64 rope dims), "
            f"got shape {tuple(freqs.shape)}"
        )
    pos = checks.check_index("positions", positions, length=n)
    checks.check_index_values("positions", pos, limit=freqs.shape[0])
    q_t = None
    if q is not None:
        q_t = checks.check_tensor_of("q", q, dtypes=_FLOATS, dim=3, shape="[n, heads, 512]")
        if q_t.shape[0] != n or q_t.shape[2] != _HEAD_DIM:
            raise ValueError(f"q must have shape ({n}, heads, {_HEAD_DIM}), got {tuple(q_t.shape)}")
    for name, t in (("kv", kv_t), ("kv_weight", w), ("freqs_cis", freqs), ("positions", pos)):
        checks.check_on_device(name, t, device)
    if q_t is not None:
        checks.check_on_device("q", q_t, device)
    return kv_t, w, eps_f, freqs, pos, q_t


def _cos_sin(freqs_cis: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(cos, sin)`` ``[n, 32]`` of each row's position."""
    f = torch.view_as_real(freqs_cis[positions.long()])
    return f[..., 0], f[..., 1]


def norm_rope_rows(
    kv: torch.Tensor,
    kv_weight: torch.Tensor,
    eps: float,
    freqs_cis: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """The normed, rotated rows, float32 ``[n, 512]`` (a new tensor; ``kv`` is not changed)."""
    x = kv.float()
    factor = torch.rsqrt((x * x).sum(dim=-1, keepdim=True) / _HEAD_DIM + eps)
    y = x * factor * kv_weight.float()
    cos, sin = _cos_sin(freqs_cis, positions)
    yr, yi = y[:, _NOPE_DIM::2], y[:, _NOPE_DIM + 1 :: 2]
    rope = torch.stack((yr * cos - yi * sin, yr * sin + yi * cos), dim=-1)
    return torch.cat((y[:, :_NOPE_DIM], rope.reshape(-1, _ROPE_DIM)), dim=1)


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 ``a * b + c`` with the product unrounded (the float64 product of two fp32 values is
    exact; the sum is rounded to float64, then to fp32)."""
    return (a.double() * b.double() + c.double()).float()


def rope_query_(q: torch.Tensor, freqs_cis: torch.Tensor, positions: torch.Tensor) -> None:
    """Rotate the last 64 dims of every head of ``q`` ``[n, H, 512]`` in place (module docstring:
    SGLang's ROCm query rope)."""
    cos, sin = _cos_sin(freqs_cis, positions)
    cos, sin = cos[:, None, :], sin[:, None, :]
    tail = q[..., _NOPE_DIM:]
    qr, qi = tail[..., 0::2].float(), tail[..., 1::2].float()
    re = _fma(qr, cos, -(qi * sin))
    im = _fma(qi, cos, qr * sin)
    tail[..., 0::2] = re.to(q.dtype)
    tail[..., 1::2] = im.to(q.dtype)
