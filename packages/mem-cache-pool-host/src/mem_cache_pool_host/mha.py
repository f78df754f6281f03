"""``MHATokenToKVPoolHost``: host mirror of an MHA device pool (roles ``"k"`` and ``"v"``).

K and V live in two host tensors of the pool's layout (``k_buffer``, ``v_buffer``); their row
shapes may differ (asymmetric head dims). See :class:`~mem_cache_pool_host.base.HostKVCache`.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from mem_cache_pool_host.base import HostKVCache

__all__ = ["MHATokenToKVPoolHost"]


class MHATokenToKVPoolHost(HostKVCache):
    """Host pool for ``MHATokenToKVPool`` (``size_per_token = L * (k_row + v_row)`` bytes)."""

    expected_roles: ClassVar[tuple[str, ...] | None] = ("k", "v")

    @property
    def k_buffer(self) -> torch.Tensor:
        """Host K tensor in the pool's layout (see ``layout.py``)."""
        self._check_open()
        return self.buffers[0]

    @property
    def v_buffer(self) -> torch.Tensor:
        """Host V tensor in the pool's layout."""
        self._check_open()
        return self.buffers[1]

    @property
    def head_num(self) -> int:
        return self.row_shapes[0][0]

    @property
    def head_dim(self) -> int:
        return self.row_shapes[0][-1]
