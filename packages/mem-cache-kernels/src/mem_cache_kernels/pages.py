"""Page arithmetic: how many pages and tokens a batch of requests needs (host-side lengths).

The one home of the page counts every package uses (the kernels' ``alloc_*`` ops, the slot and
page allocators, the HiSparse and paired allocators). Page sizes are powers of two; the counts are
exact for every one, including 1 (SGLang's decode formula ``sum(seq % ps == 1)`` is wrong for
``ps == 1``, where every decode token needs a new page). Lengths are host-readable (CPU) integer
tensors; nothing here reads device memory.
"""

from __future__ import annotations

import torch

from mem_cache_kernels.checks import SMALL_BATCH, _np, describe

__all__ = ["decode_counts", "extend_counts"]


def extend_counts(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    page_size: int,
    *,
    names: tuple[str, str] = ("prefix_lens", "seq_lens"),
) -> tuple[int, int]:
    """``(new pages, new tokens)`` of an extend batch from host-readable lengths.

    New pages are ``sum(ceil(seq / ps) - ceil(prefix / ps))``, new tokens ``sum(seq - prefix)``.
    ``ValueError`` (naming ``names``) unless ``0 <= prefix <= seq`` for every request. The one
    place the page arithmetic of an extend lives (kernels and allocators both call it).
    """
    pre_name, seq_name = names
    ps = page_size
    if seq_lens.shape[0] <= SMALL_BATCH:  # a few Python ints beat a chain of small torch ops
        tokens = 0
        pages = 0
        m = ps - 1
        shift = ps.bit_length() - 1
        pre: list[int] = prefix_lens.tolist()
        seq: list[int] = seq_lens.tolist()
        for p, q in zip(pre, seq, strict=True):
            if not 0 <= p <= q:
                break
            tokens += q - p
            pages += ((q + m) >> shift) - ((p + m) >> shift)
        else:
            return pages, tokens
    p64, s64 = prefix_lens.to(torch.int64), seq_lens.to(torch.int64)
    ext = s64 - p64
    if int(torch.minimum(p64, ext).min()) < 0:  # one reduction on the happy path
        bad = torch.nonzero((p64 < 0) | (ext < 0)).reshape(-1)
        raise ValueError(
            f"{pre_name} must satisfy 0 <= {pre_name} <= {seq_name}; requests {describe(bad)} "
            f"have {pre_name}={describe(p64[bad])}, {seq_name}={describe(s64[bad])}"
        )
    mask = ps - 1
    pages = int(((s64 + mask) & ~mask).sum() - ((p64 + mask) & ~mask).sum()) // ps
    return pages, int(ext.sum())


def decode_counts(seq_lens: torch.Tensor, page_size: int, *, name: str = "seq_lens") -> int:
    """New pages of a decode batch from host-readable lengths (``seq_lens`` count the new token).

    A request takes a new page when its new token starts one: ``(seq - 1) % ps == 0``, i.e.
    ``seq & (ps - 1) == 1`` for ``ps >= 2`` and every request for ``ps == 1``. ``ValueError``
    (naming ``name`` and the requests) unless every length is ``>= 1`` (0 would hand out slot 0).
    The one place of the decode page arithmetic (kernels and allocators both call it).
    """
    bs = int(seq_lens.shape[0])
    if not bs:
        return 0
    m = page_size - 1
    if bs <= SMALL_BATCH:
        values: list[int] = seq_lens.tolist()
        if min(values) >= 1:
            return bs if m == 0 else sum(1 for q in values if q & m == 1)
    elif _np is not None:
        a = seq_lens.numpy()
        if int(a.min()) >= 1:
            return bs if m == 0 else int(_np.count_nonzero((a & m) == 1))
    elif int(seq_lens.min()) >= 1:
        return bs if m == 0 else int(torch.count_nonzero((seq_lens & m) == 1))
    s64 = seq_lens.to(torch.int64)
    bad = torch.nonzero(s64 < 1).reshape(-1)
    raise ValueError(
        f"{name} must be >= 1 (they include the new token); requests {describe(bad)} have "
        f"{name}={describe(s64[bad])}"
    )
