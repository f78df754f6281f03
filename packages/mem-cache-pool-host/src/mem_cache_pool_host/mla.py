"""``MLATokenToKVPoolHost``: host mirror of an MLA device pool (one latent row per token, role
``"kv"``), with the HiSparse per-request host rows of :class:`HiSparseHostPoolMixin`."""

from __future__ import annotations

from typing import ClassVar

import torch

from mem_cache_pool_host.base import HostKVCache
from mem_cache_pool_host.hisparse import HiSparseHostPoolMixin

__all__ = ["MLATokenToKVPoolHost"]


class MLATokenToKVPoolHost(HiSparseHostPoolMixin, HostKVCache):
    """Host pool for ``MLATokenToKVPool`` (``size_per_token = L * kv_cache_dim * itemsize``)."""

    expected_roles: ClassVar[tuple[str, ...] | None] = ("kv",)

    @property
    def kv_buffer(self) -> torch.Tensor:
        """Host latent tensor in the pool's layout (see ``layout.py``)."""
        self._check_open()
        return self.buffers[0]

    @property
    def kv_cache_dim(self) -> int:
        return self.row_shapes[0][-1]
