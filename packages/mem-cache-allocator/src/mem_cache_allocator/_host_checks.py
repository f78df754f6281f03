"""Default-mode input checks of ``alloc_extend`` / ``alloc_decode`` that need no device->host sync.

They read only host data: the ``*_cpu`` length copies always, and the "device" tensors
(``prefix_lens``, ``seq_lens``, ``last_loc``) only when they are CPU tensors. Each failure is a
``ValueError`` naming the caller's argument, the offending requests and their values, raised
before any allocator state changes. What needs device data (GPU tensors) is left to debug mode.
"""

from __future__ import annotations

import torch

from mem_cache_allocator._debug import describe

__all__ = [
    "check_decode_inputs",
    "check_extend_num_tokens",
    "check_extend_device_inputs",
    "check_extend_lengths",
    "extend_counts_fast",
]

_SMALL = 64  # up to this many requests, Python lists beat a chain of small tensor ops


def check_extend_lengths(prefix_lens_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor) -> None:
    """``0 <= prefix_lens_cpu[i] <= seq_lens_cpu[i]`` for every request."""
    if seq_lens_cpu.shape[0] <= _SMALL:
        pre: list[int] = prefix_lens_cpu.tolist()
        seq: list[int] = seq_lens_cpu.tolist()
        if all(0 <= p <= s for p, s in zip(pre, seq, strict=True)):
            return
    elif bool(((prefix_lens_cpu >= 0) & (prefix_lens_cpu <= seq_lens_cpu)).all()):
        return
    p64, s64 = prefix_lens_cpu.to(torch.int64), seq_lens_cpu.to(torch.int64)
    bad = torch.nonzero((p64 < 0) | (p64 > s64)).reshape(-1)
    raise ValueError(
        f"prefix_lens_cpu must satisfy 0 <= prefix_lens_cpu <= seq_lens_cpu; requests "
        f"{describe(bad)} have prefix_lens_cpu={describe(p64[bad])}, "
        f"seq_lens_cpu={describe(s64[bad])}"
    )


def check_extend_num_tokens(tokens: int, extend_num_tokens: object) -> None:
    """``extend_num_tokens`` equals ``sum(seq_lens_cpu - prefix_lens_cpu)`` (``tokens``)."""
    if isinstance(extend_num_tokens, bool) or not isinstance(extend_num_tokens, int):
        raise TypeError(
            f"extend_num_tokens must be an int, got {type(extend_num_tokens).__name__}"
        )
    if tokens != extend_num_tokens:
        raise ValueError(
            f"extend_num_tokens must equal sum(seq_lens_cpu - prefix_lens_cpu) = {tokens}, "
            f"got {extend_num_tokens}"
        )


def _same(name: str, t: torch.Tensor, cpu_name: str, cpu: torch.Tensor) -> None:
    if t is cpu:
        return
    a = t if t.dtype is torch.int64 else t.to(torch.int64)
    b = cpu if cpu.dtype is torch.int64 else cpu.to(torch.int64)
    if not torch.equal(a, b):
        bad = torch.nonzero(a != b).reshape(-1)
        raise ValueError(
            f"{name} must equal {cpu_name}; requests {describe(bad)} have {name}="
            f"{describe(a[bad])}, {cpu_name}={describe(b[bad])}"
        )


def check_extend_device_inputs(  # noqa: PLR0917 - mirrors alloc_extend
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    last_loc: torch.Tensor,
    page_size: int,
) -> None:
    """CPU "device" tensors: equal to their ``*_cpu`` copies, and ``last_loc`` consistent with
    ``prefix_lens`` (-1 exactly for an empty prefix, ``(last_loc + 1) % ps == prefix % ps``)."""
    if prefix_lens.device.type == "cpu":
        _same("prefix_lens", prefix_lens, "prefix_lens_cpu", prefix_lens_cpu)
    if seq_lens.device.type == "cpu":
        _same("seq_lens", seq_lens, "seq_lens_cpu", seq_lens_cpu)
    if last_loc.device.type != "cpu":
        return
    m = page_size - 1
    if last_loc.shape[0] <= _SMALL:
        last: list[int] = last_loc.tolist()
        pre: list[int] = prefix_lens_cpu.tolist()
        if all(
            (x == -1) if p == 0 else (x >= 0 and (x + 1) & m == p & m)
            for x, p in zip(last, pre, strict=True)
        ):
            return
    last64, pre64 = last_loc.to(torch.int64), prefix_lens_cpu.to(torch.int64)
    bad_mask = torch.where(
        pre64 == 0, last64 != -1, (last64 < 0) | (((last64 + 1) & m) != (pre64 & m))
    )
    bad = torch.nonzero(bad_mask).reshape(-1)
    if bad.numel():
        raise ValueError(
            f"misaligned alloc_extend inputs: last_loc must be -1 for an empty prefix and "
            f"the slot of position prefix_lens - 1 otherwise "
            f"((last_loc + 1) % {page_size} == prefix_lens % {page_size}); requests "
            f"{describe(bad)} have last_loc={describe(last64[bad])}, "
            f"prefix_lens={describe(pre64[bad])}"
        )


def check_decode_inputs(seq_lens: torch.Tensor, seq_lens_cpu: torch.Tensor) -> None:
    """``seq_lens_cpu >= 1`` (a decode includes its new token: 0 would hand out slot 0) and, for
    a CPU ``seq_lens``, ``seq_lens == seq_lens_cpu``. (``last_loc`` of a decode batch is checked
    by debug mode: on every step, a vectorised check costs more than the allocation itself.)"""
    if seq_lens_cpu.shape[0] and int(seq_lens_cpu.min()) < 1:
        s64 = seq_lens_cpu.to(torch.int64)
        bad = torch.nonzero(s64 < 1).reshape(-1)
        raise ValueError(
            f"seq_lens_cpu must be >= 1 (they include the new token); requests {describe(bad)} "
            f"have seq_lens_cpu={describe(s64[bad])}"
        )
    if seq_lens.device.type == "cpu":
        _same("seq_lens", seq_lens, "seq_lens_cpu", seq_lens_cpu)


def extend_counts_fast(  # noqa: PLR0917 - mirrors alloc_extend
    prefix_lens: torch.Tensor,
    prefix_lens_cpu: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    last_loc: torch.Tensor,
    page_size: int,
) -> tuple[int, int] | None:
    """Fast path of a small extend batch (at most 64 requests): every check of
    :func:`check_extend_lengths` and :func:`check_extend_device_inputs` on one list per tensor,
    plus ``(new pages, new tokens)``; ``None`` when a check fails or the batch is larger (the
    caller then runs the detailed checks, which raise naming the requests)."""
    if seq_lens_cpu.shape[0] > _SMALL:
        return None
    pre: list[int] = prefix_lens_cpu.tolist()
    seq: list[int] = seq_lens_cpu.tolist()
    cpu_pre = prefix_lens is not prefix_lens_cpu and prefix_lens.device.type == "cpu"
    if cpu_pre and prefix_lens.tolist() != pre:
        return None
    cpu_seq = seq_lens is not seq_lens_cpu and seq_lens.device.type == "cpu"
    if cpu_seq and seq_lens.tolist() != seq:
        return None
    m = page_size - 1
    shift = page_size.bit_length() - 1
    pages = 0
    tokens = 0
    if last_loc.device.type == "cpu":
        for p, q, x in zip(pre, seq, last_loc.tolist(), strict=True):
            if not (0 <= p <= q) or ((x != -1) if p == 0 else (x < 0 or (x + 1) & m != p & m)):
                return None
            tokens += q - p
            pages += ((q + m) >> shift) - ((p + m) >> shift)
        return pages, tokens
    for p, q in zip(pre, seq, strict=True):
        if not 0 <= p <= q:
            return None
        tokens += q - p
        pages += ((q + m) >> shift) - ((p + m) >> shift)
    return pages, tokens
