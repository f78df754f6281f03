"""Byte layout of the DSA page-major indexer-key buffer (private).

Per layer the buffer is uint8 ``[num_pages, page_size * (head_dim + scale_bytes)]``. Page ``p``
holds, for its ``page_size`` tokens, first all fp8 keys (``head_dim`` bytes each), then all fp32
scales (``scale_bytes`` each). Token ``t`` lives in page ``t // ps`` at offset ``o = t % ps``: its
key at byte ``o * head_dim`` and its scale at byte ``ps * head_dim + o * scale_bytes`` of the page.

Kernels move whole rows, so the buffer is viewed as rows of ``g`` bytes for keys (``g`` divides
both the page size in bytes and ``head_dim``: a key is ``head_dim // g`` consecutive rows) and as
rows of ``scale_bytes`` for scales. For ``page_size = 64`` a key is one 128-byte row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["IndexPageLayout"]


@dataclass(frozen=True, slots=True)
class IndexPageLayout:
    """Row arithmetic for one page size (see the module docstring)."""

    page_size: int
    head_dim: int = 128
    scale_bytes: int = 4

    @property
    def page_bytes(self) -> int:
        """Bytes of one page: ``page_size * (head_dim + scale_bytes)`` (8448 for 64 x 128)."""
        return self.page_size * (self.head_dim + self.scale_bytes)

    @property
    def key_row_bytes(self) -> int:
        """``g``: the key-view row size in bytes."""
        return math.gcd(self.page_bytes, self.head_dim)

    @property
    def key_rows_per_token(self) -> int:
        return self.head_dim // self.key_row_bytes

    def num_pages(self, slots: int) -> int:
        """Pages needed for slots ``[0, slots + page_size)`` (the padding page included)."""
        return -(-(slots + self.page_size) // self.page_size)

    def key_view(self, buf: torch.Tensor) -> torch.Tensor:
        """``buf`` as rows of ``key_row_bytes`` bytes (a view)."""
        return buf.view(-1, self.key_row_bytes)

    def scale_view(self, buf: torch.Tensor) -> torch.Tensor:
        """``buf`` as rows of ``scale_bytes`` bytes (a view)."""
        return buf.view(-1, self.scale_bytes)

    def key_rows(self, loc: torch.Tensor) -> torch.Tensor:
        """int64 ``[n * key_rows_per_token]``: key-view rows of tokens ``loc`` (token-major);
        every row of a negative ``loc`` is -1 (skipped by the kernels)."""
        loc = loc.to(torch.int64)
        ps, r = self.page_size, self.key_rows_per_token
        base = (loc // ps) * (self.page_bytes // self.key_row_bytes) + (loc % ps) * r
        rows = base[:, None] + torch.arange(r, device=loc.device)
        rows = torch.where(loc[:, None] < 0, torch.full_like(rows, -1), rows)
        return rows.reshape(-1)

    def scale_rows(self, loc: torch.Tensor) -> torch.Tensor:
        """int64 ``[n]``: scale-view rows of tokens ``loc`` (-1 for a negative ``loc``)."""
        loc = loc.to(torch.int64)
        ps, sb = self.page_size, self.scale_bytes
        rows = (loc // ps) * (self.page_bytes // sb) + (ps * self.head_dim) // sb + loc % ps
        return torch.where(loc < 0, torch.full_like(rows, -1), rows)
