"""``MLATokenToKVPoolHost``: host mirror of an MLA device pool (one latent row per token, role
``"kv"``), with the HiSparse per-request host rows of :class:`HiSparseHostPoolMixin`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from mem_cache_kernels.checks import check_bool, check_optional_int
from mem_cache_pool.base import KVBufferDesc
from mem_cache_pool_host.base import DevicePoolLike, HostKVCache
from mem_cache_pool_host.capacity import DEFAULT_HOST_TO_DEVICE_RATIO
from mem_cache_pool_host.hisparse import HiSparseHostPoolMixin
from mem_cache_pool_host.memory import HostBytesAllocator, HostTensorAllocator

__all__ = ["MLATokenToKVPoolHost"]


class MLATokenToKVPoolHost(HiSparseHostPoolMixin, HostKVCache):
    """Host pool for ``MLATokenToKVPool`` (``size_per_token = L * kv_cache_dim * itemsize``)."""

    expected_roles: ClassVar[tuple[str, ...] | None] = ("kv",)
    # SGLang's split-buffer members (its ``page_first_kv_split`` layout for DSA pools, separate
    # K / V / indexer host tensors) and its fp8 DSA rows: not supported, so ``None`` / False.
    k_buffer: None = None
    v_buffer: None = None
    index_k_buffer: None = None
    index_k_scale_buffer: None = None
    dsa_kv_cache_store_fp8: bool = False
    staging_buffer: None = None
    """SGLang's device staging of its JIT write-back kernel (not used: ``None``)."""

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
        override_kv_cache_dim: int | None = None,
        draft_buffer_infos: Sequence[Any] = (),
        dcp_size: int = 1,
        dcp_rank: int = 0,
        *,
        device_capacity_tokens: int | None = None,
        start_layer: int | None = None,
        end_layer: int | None = None,
        target_layer_num: int | None = None,
        layer_shard_enabled: bool = False,
        pool_label: str = "kv",
        host_token_capacity: int | None = None,
        host_size_bytes: int | None = None,
        io_backend: str | None = None,
        allocator: HostTensorAllocator | HostBytesAllocator | None = None,
        reserve_bytes: int | None = None,
    ) -> None:
        """See :class:`HostKVCache`. SGLang's MLA arguments: ``override_kv_cache_dim`` (a packed
        row width) and ``target_layer_num``, when given, must equal the device pool's row width
        and layer count (``ValueError``); packed MTP draft layers (``draft_buffer_infos``),
        decode context parallelism (``dcp_size > 1``) and layer-sharded device pools
        (``layer_shard_enabled``) are not supported (``NotImplementedError``)."""
        check_bool("layer_shard_enabled", layer_shard_enabled)
        if layer_shard_enabled:
            raise NotImplementedError("layer-sharded device pools are not supported")
        check_optional_int("override_kv_cache_dim", override_kv_cache_dim)
        check_optional_int("target_layer_num", target_layer_num)
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
            dcp_size=dcp_size,
            dcp_rank=dcp_rank,
            pool_label=pool_label,
            host_token_capacity=host_token_capacity,
            host_size_bytes=host_size_bytes,
            io_backend=io_backend,
            allocator=allocator,
            reserve_bytes=reserve_bytes,
            draft_buffer_infos=draft_buffer_infos,
        )
        for name, value, have in (
            ("override_kv_cache_dim", override_kv_cache_dim, self.kv_cache_dim),
            ("target_layer_num", target_layer_num, self.layer_num),
        ):
            if value is not None and value != have:
                self.close()
                raise ValueError(f"{name} must be the device pool's {have}, got {value}")
        self.override_kv_cache_dim = override_kv_cache_dim
        source = self._device_source
        rank = getattr(source, "kv_lora_rank", None)
        rope = getattr(source, "qk_rope_head_dim", None)
        self.kv_lora_rank: int | None = rank if isinstance(rank, int) else None
        """The device pool's ``kv_lora_rank`` (``None`` when built from a bare descriptor)."""
        self.qk_rope_head_dim: int | None = rope if isinstance(rope, int) else None

    @property
    def kv_cache_dim(self) -> int:
        """Elements per token row of the latent cache (``kv_lora_rank + qk_rope_head_dim``)."""
        return self.row_shapes[0][-1]

    @property
    def data_refs(self) -> list[torch.Tensor]:
        """Per-layer views of the host latent tensor (SGLang's ``data_refs``)."""
        return self._role_layer_refs(0)

    @property
    def data_ptrs(self) -> torch.Tensor:
        """uint64 ``[layer_num]`` data pointers of ``data_refs`` on the device pool's device."""
        return self._role_layer_ptrs(0)

    @property
    def device_kv_buffers(self) -> tuple[torch.Tensor, ...]:
        """The device pool's per-layer latent buffers."""
        return self.device_desc.buffers[0]

    @property
    def device_data_ptrs(self) -> torch.Tensor:
        """The device pool's uint64 pointer table (on its device)."""
        return self._device_role_ptrs(0)

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """SGLang's ``(data_ptrs, data_lens, item_lens)`` for registering host memory with a
        disaggregation transfer engine: per layer the ``data_refs`` pointer, the byte size of
        ``kv_buffer[layer]`` (SGLang's choice, whatever the layout) and
        ``token_stride_size * page_size``."""
        kv = self.kv_buffer
        if not isinstance(kv, torch.Tensor):
            raise RuntimeError(f"{type(self).__name__} is closed")
        ptrs = [t.data_ptr() for t in self.data_refs]
        lens = [kv[i].nbytes for i in range(self.layer_num)]
        return ptrs, lens, [self.token_stride_size * self.page_size] * self.layer_num
