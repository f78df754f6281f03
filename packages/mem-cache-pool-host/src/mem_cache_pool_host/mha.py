"""``MHATokenToKVPoolHost``: host mirror of an MHA device pool (roles ``"k"`` and ``"v"``).

K and V live in the pool's layout (``k_buffer``, ``v_buffer``); with equal row shapes they are the
two halves of one allocation, SGLang's ``kv_buffer`` ``[2, *layout shape]``; their row shapes may
differ (asymmetric head dims: one allocation each). See
:class:`~mem_cache_pool_host.base.HostKVCache`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from mem_cache_kernels.checks import check_index, check_int
from mem_cache_pool.base import KVBufferDesc
from mem_cache_pool_host.base import DevicePoolLike, HostKVCache
from mem_cache_pool_host.capacity import DEFAULT_HOST_TO_DEVICE_RATIO
from mem_cache_pool_host.memory import HostBytesAllocator, HostTensorAllocator

__all__ = ["MHATokenToKVPoolHost"]


class MHATokenToKVPoolHost(HostKVCache):
    """Host pool for ``MHATokenToKVPool`` (``size_per_token = L * (k_row + v_row)`` bytes)."""

    expected_roles: ClassVar[tuple[str, ...] | None] = ("k", "v")
    staging_k_buffer: None = None
    """SGLang's device staging of its JIT write-back kernel (not used: ``None``)."""
    staging_v_buffer: None = None

    def __init__(  # noqa: PLR0917 (SGLang's signature)
        self,
        buffer_info: DevicePoolLike | KVBufferDesc,
        host_to_device_ratio: float = DEFAULT_HOST_TO_DEVICE_RATIO,
        host_size: float = 0,
        page_size: int | None = None,
        layout: str = "page_first",
        pin_memory: bool = True,
        device: str | torch.device = "cpu",
        allocator_type: str = "default",
        *,
        device_capacity_tokens: int | None = None,
        start_layer: int | None = None,
        end_layer: int | None = None,
        draft_buffer_infos: Sequence[Any] = (),
        write_back_staging: tuple[torch.Tensor, torch.Tensor] | None = None,
        pool_label: str = "kv",
        head_group_num: int = 1,
        host_token_capacity: int | None = None,
        host_size_bytes: int | None = None,
        io_backend: str | None = None,
        allocator: HostTensorAllocator | HostBytesAllocator | None = None,
        reserve_bytes: int | None = None,
    ) -> None:
        """See :class:`HostKVCache`. SGLang's MHA keywords: ``draft_buffer_infos`` (packed MTP
        draft layers) must be empty (else ``NotImplementedError``); ``write_back_staging`` (the
        device staging of SGLang's JIT write-back kernel, which is not used here:
        ``can_use_write_back_jit`` is False) is accepted and unused, as SGLang does on
        platforms without that kernel; ``head_group_num`` (``page_unified`` layout only) is
        recorded."""
        self.head_group_num = check_int("head_group_num", head_group_num, minimum=1)
        super().__init__(
            buffer_info,
            host_to_device_ratio,
            host_size,
            page_size,
            layout,
            pin_memory,
            device,
            allocator_type,
            device_capacity_tokens=device_capacity_tokens,
            start_layer=start_layer,
            end_layer=end_layer,
            pool_label=pool_label,
            host_token_capacity=host_token_capacity,
            host_size_bytes=host_size_bytes,
            io_backend=io_backend,
            allocator=allocator,
            reserve_bytes=reserve_bytes,
            draft_buffer_infos=draft_buffer_infos,
        )

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
        """KV heads per layer of this rank's host rows."""
        return self.row_shapes[0][0]

    @property
    def head_dim(self) -> int:
        """K head dimension (elements)."""
        return self.row_shapes[0][-1]

    @property
    def v_head_dim(self) -> int:
        """V head dimension (elements; may differ from ``head_dim``)."""
        return self.row_shapes[1][-1]

    @property
    def element_dim(self) -> int:
        """Elements of one K row (``head_num * head_dim``)."""
        return self.head_num * self.head_dim

    def get_hybrid_pool_buffer(self) -> list[torch.Tensor]:
        """``[k_buffer, v_buffer]``: the host tensors a zero-copy backend registers."""
        return [self.k_buffer, self.v_buffer]

    def get_split_heads_page_buffer_meta(
        self, indices: torch.Tensor, split_factor: int
    ) -> tuple[list[int], list[int]]:
        """SGLang's zero-copy ranges per head shard: defined for its ``page_head`` layout only
        (SGLang asserts on any other), which this package does not support:
        ``NotImplementedError`` (after the argument checks: ``indices`` an index tensor,
        ``split_factor`` a positive int)."""
        check_index("indices", indices)
        check_int("split_factor", split_factor, minimum=1)
        raise NotImplementedError(
            f"split-heads page ranges need SGLang's page_head layout; this pool is {self.layout}"
        )

    # SGLang's per-layer host views and kernel pointer tables, and the device pool's
    @property
    def k_data_refs(self) -> list[torch.Tensor]:
        """Per-layer views of the host K tensor (``[slots, H, D]`` or per-page for direct)."""
        return self._role_layer_refs(0)

    @property
    def v_data_refs(self) -> list[torch.Tensor]:
        """Per-layer host V tensors (views of the host buffer, one per layer)."""
        return self._role_layer_refs(1)

    @property
    def host_kv_data_refs(self) -> list[torch.Tensor]:
        """``k_data_refs + v_data_refs``."""
        return self.k_data_refs + self.v_data_refs

    @property
    def k_data_ptrs(self) -> torch.Tensor:
        """uint64 ``[layer_num]`` data pointers of ``k_data_refs`` on the device pool's device."""
        return self._role_layer_ptrs(0)

    @property
    def v_data_ptrs(self) -> torch.Tensor:
        """uint64 ``[layer_num]`` data pointers of ``v_data_refs`` on the device pool's device."""
        return self._role_layer_ptrs(1)

    @property
    def device_k_buffers(self) -> tuple[torch.Tensor, ...]:
        """The device pool's per-layer K buffers."""
        return self.device_desc.buffers[0]

    @property
    def device_v_buffers(self) -> tuple[torch.Tensor, ...]:
        """The device pool's per-layer V buffers."""
        return self.device_desc.buffers[1]

    @property
    def device_k_data_ptrs(self) -> torch.Tensor:
        """The device pool's uint64 K pointer table (on its device)."""
        return self._device_role_ptrs(0)

    @property
    def device_v_data_ptrs(self) -> torch.Tensor:
        """The device pool's uint64 V pointer table (on its device)."""
        return self._device_role_ptrs(1)
