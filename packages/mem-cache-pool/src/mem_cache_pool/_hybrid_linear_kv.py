"""``HybridLinearKVPool``: the full-attention KV of a hybrid linear-attention model, addressed
by global layer id, with the Mamba states riding along; the public path is
:mod:`mem_cache_pool.hybrid`."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from mem_cache_kernels import checks
from mem_cache_pool._checks import layer_id_of
from mem_cache_pool.base import CpuKVCopy, KVBufferDesc, KVCache, KVWriteLoc, LayerReadyWaiter
from mem_cache_pool.mamba import MambaPool
from mem_cache_pool.mha import MHATokenToKVPool
from mem_cache_pool.mla import MLATokenToKVPool

__all__ = ["HybridLinearKVPool"]


class _LayerProxy:
    """``layer`` with ``layer_id`` replaced (no mutation of the caller's object)."""

    def __init__(self, layer: Any, layer_id: int) -> None:
        self._layer = layer
        self.layer_id = layer_id

    def __getattr__(self, name: str) -> Any:
        return getattr(self._layer, name)


class HybridLinearKVPool(KVCache):
    """KV of the full-attention layers of a hybrid model; Mamba states in ``mamba_pool``.

    ``full_kv_pool`` is an :class:`MHATokenToKVPool` (or :class:`MLATokenToKVPool` with
    ``use_mla``, or the given ``full_kv_pool`` / ``full_kv_pool_class``) of
    ``len(full_attention_layer_ids)`` layers; ``full_attention_layer_id_mapping`` maps a global
    layer id to its index there. Every layer-addressed method takes global ids (``ValueError``
    for a linear-attention layer id, naming the full-attention ones) and waits once for the layer
    when a layer-transfer counter is registered. ``get_cpu_copy(indices, mamba_indices)``
    returns ``(kv_cpu, mamba_cpu)``. Not supported: ``use_dsa`` and ``quant_method``
    (``NotImplementedError``).
    """

    cpu_copy_carries_mamba = True

    def __init__(  # noqa: PLR0917 (SGLang-compatible positional signature)
        self,
        size: int,
        dtype: torch.dtype,
        page_size: int,
        head_num: int,
        head_dim: int,
        full_attention_layer_ids: Sequence[int],
        device: str | torch.device,
        mamba_pool: MambaPool,
        enable_memory_saver: bool = False,
        enable_kv_cache_copy: bool = False,
        use_mla: bool = False,
        kv_lora_rank: int | None = None,
        qk_rope_head_dim: int | None = None,
        use_dsa: bool = False,
        index_head_dim: int | None = None,
        kv_cache_dim: int | None = None,
        index_kpool: int = 1,
        index_kpool_compress: bool = False,
        tail_extra_slots: int = 0,
        max_running_requests: int | None = None,
        skip_topk_layers: list[bool] | None = None,
        start_layer: int | None = None,
        full_kv_pool_class: type | None = None,
        quant_method: Any = None,
        full_kv_pool: KVCache | None = None,
        post_capture_active: bool = False,
    ) -> None:
        if use_dsa or quant_method is not None or post_capture_active:
            raise NotImplementedError(
                "HybridLinearKVPool: use_dsa, quant_method and post_capture_active are not "
                "supported by mem_cache_pool"
            )
        if isinstance(full_attention_layer_ids, (str, bytes)) or not isinstance(
            full_attention_layer_ids, Sequence
        ):
            raise TypeError(
                "full_attention_layer_ids must be a sequence of ints, got "
                f"{type(full_attention_layer_ids).__name__}"
            )
        ids = [
            checks.check_int(f"full_attention_layer_ids[{i}]", x, minimum=0)
            for i, x in enumerate(full_attention_layer_ids)
        ]
        if not ids or len(set(ids)) != len(ids):
            raise ValueError(f"full_attention_layer_ids must be non-empty and distinct, got {ids}")
        if not isinstance(mamba_pool, MambaPool):
            raise TypeError(f"mamba_pool must be a MambaPool, got {type(mamba_pool).__name__}")
        super().__init__(size, page_size, dtype, len(ids), device, enable_memory_saver)
        self.full_layer_nums = len(ids)
        self.head_num = head_num
        self.head_dim = head_dim
        self.mamba_pool = mamba_pool
        self.use_mla = checks.check_bool("use_mla", use_mla)
        self.use_dsa = False
        self.start_layer = checks.check_int(
            "start_layer", 0 if start_layer is None else start_layer, minimum=0
        )
        self.full_kv_pool: Any
        if full_kv_pool is not None:
            if not isinstance(full_kv_pool, KVCache):
                raise TypeError(f"full_kv_pool must be a KVCache, got {type(full_kv_pool)}")
            self.full_kv_pool = full_kv_pool
        elif not self.use_mla:
            cls = full_kv_pool_class if full_kv_pool_class is not None else MHATokenToKVPool
            self.full_kv_pool = cls(
                size, page_size, dtype, head_num, head_dim, len(ids), device, enable_memory_saver
            )
        else:
            if kv_lora_rank is None or qk_rope_head_dim is None:
                raise ValueError("use_mla needs kv_lora_rank and qk_rope_head_dim, got None")
            cls = full_kv_pool_class if full_kv_pool_class is not None else MLATokenToKVPool
            self.full_kv_pool = cls(
                size,
                page_size,
                dtype,
                kv_lora_rank,
                qk_rope_head_dim,
                len(ids),
                device,
                enable_memory_saver,
            )
        self.full_kv_pool.model_layer_ids = tuple(ids)
        self.full_attention_layer_id_mapping = {layer: i for i, layer in enumerate(ids)}
        if self.use_mla:
            self.mem_usage = self.get_kv_size_bytes() / (1 << 30)
        else:
            k, v = self.get_kv_size_bytes()
            self.mem_usage = (k + v) / (1 << 30)

    # ------------------------------------------------------------------ KVCache hooks
    def _role_buffers(self) -> tuple[tuple[str, Sequence[torch.Tensor]], ...]:
        return self.full_kv_pool._role_buffers()  # type: ignore[no-any-return]

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.full_kv_pool._get_key_buffer(  # type: ignore[no-any-return]
            self._transfer_full_attention_id(layer_id)
        )

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.full_kv_pool._get_value_buffer(  # type: ignore[no-any-return]
            self._transfer_full_attention_id(layer_id)
        )

    def get_buffer_desc(self) -> KVBufferDesc:
        """The full-attention pool's buffer descriptor (its layers are dense indices)."""
        return self.full_kv_pool.get_buffer_desc()  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ layer ids
    def _transfer_full_attention_id(self, layer_id: object, name: str = "layer_id") -> int:
        return self._full_attention_layer(layer_id, name)[1]

    def _full_attention_layer(self, layer_id: object, name: str = "layer_id") -> tuple[int, int]:
        """``(global id, dense index)`` of full-attention layer ``layer_id`` (an int or a layer
        object): an int id of a full-attention layer is accepted inline, anything else is
        checked by ``layer_id_of`` (which raises naming ``name``)."""
        layer = getattr(layer_id, "layer_id", layer_id)
        if type(layer) is not int:
            layer = layer_id_of(name, layer_id)
        index = self.full_attention_layer_id_mapping.get(layer)
        if index is None:
            raise ValueError(
                f"{name}={layer} not in full attention layers: "
                f"{list(self.full_attention_layer_id_mapping)}"
            )
        return layer, index

    def layer_index(self, layer_id: object, name: str = "layer_id") -> int:
        """Dense index of global full-attention layer ``layer_id`` (an int or a layer object)."""
        return self._full_attention_layer(layer_id, name)[1]

    def _wait_for_layer(self, layer_id: int) -> None:
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)

    def _wait_layer(self, layer_id: object, name: str = "layer_id") -> int:
        layer, index = self._full_attention_layer(layer_id, name)
        self._wait_for_layer(layer)
        return index

    def register_layer_transfer_counter(
        self, layer_transfer_counter: LayerReadyWaiter | None
    ) -> None:
        """Install the waiter here; the inner pool waits for nothing (SGLang's split)."""
        super().register_layer_transfer_counter(layer_transfer_counter)
        self.full_kv_pool.register_layer_transfer_counter(None)

    def get_key_buffer(self, layer_id: int, scale: float | None = None) -> torch.Tensor:
        """Keys of global full-attention layer ``layer_id`` (waits for it)."""
        index = self._wait_layer(layer_id)
        return self.full_kv_pool._get_key_buffer(index)  # type: ignore[no-any-return]

    def get_value_buffer(self, layer_id: int, scale: float | None = None) -> torch.Tensor:
        """Values of global full-attention layer ``layer_id`` (waits for it)."""
        index = self._wait_layer(layer_id)
        return self.full_kv_pool._get_value_buffer(index)  # type: ignore[no-any-return]

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(keys, values)`` of global full-attention layer ``layer_id``; waits once."""
        index = self._wait_layer(layer_id)
        return self.full_kv_pool._get_key_buffer(index), self.full_kv_pool._get_value_buffer(index)

    def get_v_head_dim(self) -> int:
        """Head dim of the values."""
        return int(self.full_kv_pool._get_value_buffer(self.full_kv_pool.start_layer).shape[-1])

    # ------------------------------------------------------------------ writes
    def set_kv_buffer(  # noqa: PLR0917
        self,
        layer: Any,
        loc_info: torch.Tensor | KVWriteLoc,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        dcp_kv_mask: torch.Tensor | None = None,
    ) -> None:
        """Write K/V at ``loc_info`` for ``layer`` (a RadixAttention-like object with
        ``.layer_id``, or a global layer id) of a full-attention layer (MHA)."""
        if dcp_kv_mask is not None:
            raise NotImplementedError("HybridLinearKVPool: decode context parallel (dcp_kv_mask)")
        layer_id = layer if isinstance(layer, int) else getattr(layer, "layer_id", None)
        if layer_id is None:
            raise TypeError(
                f"layer must be a layer id or have a layer_id attribute, got {type(layer).__name__}"
            )
        index = self._transfer_full_attention_id(layer_id, "layer")
        if self.use_mla:
            self.full_kv_pool.set_kv_buffer(index, loc_info, cache_k, cache_v)
        else:
            self.full_kv_pool.set_kv_buffer(index, loc_info, cache_k, cache_v, k_scale, v_scale)

    @contextmanager
    def _transfer_id_context(self, layer: Any) -> Iterator[Any]:
        yield _LayerProxy(layer, self._transfer_full_attention_id(layer.layer_id))

    def set_mla_kv_buffer(
        self, layer: Any, loc_info: Any, cache_k_nope: torch.Tensor, cache_k_rope: torch.Tensor
    ) -> None:
        """MLA write of the latent parts (``use_mla`` only: ``NotImplementedError`` otherwise)."""
        if not self.use_mla:
            raise NotImplementedError("HybridLinearKVPool does not support set_mla_kv_buffer (MHA)")
        index = self._transfer_full_attention_id(getattr(layer, "layer_id", layer))
        self.full_kv_pool.set_mla_kv_buffer(index, loc_info, cache_k_nope, cache_k_rope)

    def get_mla_kv_buffer(
        self, layer: Any, loc: torch.Tensor, dst_dtype: torch.dtype | None = None
    ) -> Any:
        """MLA read of the latent parts (``use_mla`` only: ``NotImplementedError`` otherwise)."""
        if not self.use_mla:
            raise NotImplementedError("HybridLinearKVPool does not support get_mla_kv_buffer (MHA)")
        layer_id = getattr(layer, "layer_id", layer)
        self._wait_for_layer(layer_id)
        index = self._transfer_full_attention_id(layer_id)
        return self.full_kv_pool.get_mla_kv_buffer(index, loc, dst_dtype)

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor) -> None:
        """See :meth:`KVCache.move_kv_cache` (full-attention layers only)."""
        self.full_kv_pool.move_kv_cache(tgt_loc, src_loc)

    # ------------------------------------------------------------------ sizes and descriptors
    def get_kv_size_bytes(self) -> Any:
        """The full-attention pool's (MHA: ``(k_bytes, v_bytes)``)."""
        return self.full_kv_pool.get_kv_size_bytes()

    def get_total_bytes(self) -> int:
        """Bytes of the full-attention pool's buffers (the states are ``mamba_pool``'s)."""
        return int(self.full_kv_pool.get_total_bytes())

    def get_kv_layer_ids(self) -> list[int]:
        """Global layer ids aligned with the full-attention KV buffers (K then V for MHA)."""
        ids = list(self.full_attention_layer_id_mapping)
        return ids if self.use_mla else ids * 2

    def get_state_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """See :meth:`MambaPool.get_contiguous_buf_infos`."""
        return self.mamba_pool.get_contiguous_buf_infos()

    def get_state_dim_per_tensor(self) -> list[int]:
        """See :meth:`MambaPool.get_state_dim_per_tensor`."""
        return self.mamba_pool.get_state_dim_per_tensor()

    def get_state_layer_ids(self) -> list[int]:
        """See :meth:`MambaPool.get_state_layer_ids`."""
        return self.mamba_pool.get_state_layer_ids()

    def get_state_slice_outer_counts(self) -> list[int]:
        """See :meth:`MambaPool.get_state_slice_outer_counts`."""
        return self.mamba_pool.get_state_slice_outer_counts()

    def get_state_conv_shard_groups(self) -> list[list[int] | None]:
        """See :meth:`MambaPool.get_state_conv_shard_groups`."""
        return self.mamba_pool.get_state_conv_shard_groups()

    def maybe_get_custom_mem_pool(self) -> None:
        """``None``: no custom memory pool (SGLang's answer when the feature is off)."""
        return None

    # ------------------------------------------------------------------ retraction
    def get_cpu_copy(  # type: ignore[override]
        self,
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> tuple[CpuKVCopy, Any]:
        """``(kv_cpu, mamba_cpu)``: the KV rows ``indices`` and, when ``mamba_indices`` is given,
        the states of those slots (``MambaPool.get_cpu_copy``; else ``None``)."""
        if mamba_indices is not None:
            self.mamba_pool._check_slots("mamba_indices", mamba_indices)
        kv_cpu = self.full_kv_pool.get_cpu_copy(indices)
        mamba_cpu = (
            self.mamba_pool.get_cpu_copy(mamba_indices) if mamba_indices is not None else None
        )
        return kv_cpu, mamba_cpu

    def load_cpu_copy(  # type: ignore[override]
        self,
        cache_cpu: tuple[CpuKVCopy, Any],
        indices: torch.Tensor,
        mamba_indices: torch.Tensor | None = None,
        req_pool_index: int | None = None,
    ) -> None:
        """Write a :meth:`get_cpu_copy` result back at ``indices`` (and ``mamba_indices``).
        Both parts are checked before anything is written."""
        if not isinstance(cache_cpu, tuple):
            raise TypeError(
                "cache_cpu must be the (kv_cpu, mamba_cpu) pair of get_cpu_copy, got "
                f"{type(cache_cpu).__name__}"
            )
        if len(cache_cpu) != 2:
            raise ValueError(f"cache_cpu must be a (kv_cpu, mamba_cpu) pair, got {len(cache_cpu)}")
        kv_cpu, mamba_cpu = cache_cpu
        states = mamba_indices if mamba_cpu is not None else None
        if states is not None:  # the states are checked before the KV is written
            self.mamba_pool._check_cpu_copy(mamba_cpu, states, "cache_cpu[1]", "mamba_indices")
        self.full_kv_pool.load_cpu_copy(kv_cpu, indices)
        if states is not None:
            self.mamba_pool.load_cpu_copy(mamba_cpu, states)

    # ------------------------------------------------------------------ features that are off
    # SGLang's HybridLinearKVPool forwards these to a DSA / quantised / post-capture full pool;
    # none of those exist here, so each answers what SGLang answers with the feature off.
    @property
    def post_capture_backed_bytes(self) -> int:
        """``0``: no CUDA-graph post-capture backing."""
        return 0

    def finalize_backing(self, config: Any) -> None:
        """Post-capture resize: not supported (the pool is sized at construction)."""
        raise NotImplementedError("HybridLinearKVPool.finalize_backing: no post-capture backing")

    @property
    def dsa_kv_cache_store_fp8(self) -> bool:
        """``False``: no DSA full pool."""
        return False

    @property
    def kv_cache_dim(self) -> int | None:
        """``None``: no DSA full pool."""
        return getattr(self.full_kv_pool, "kv_cache_dim", None)

    @property
    def index_head_dim(self) -> int | None:
        """``None``: no DSA index cache."""
        return None

    @property
    def quant_block_size(self) -> int | None:
        """``None``: no quantised full pool."""
        return None

    @property
    def index_kpool(self) -> int:
        """``1``: no DSA index k-pool."""
        return 1

    @property
    def index_kpool_compress(self) -> bool:
        """``False``: no DSA index k-pool."""
        return False

    @property
    def tail_extra_slots(self) -> int:
        """``0``: no DSA compress tails."""
        return 0

    @property
    def index_page_size(self) -> int:
        """The page size (no separate DSA index paging)."""
        return self.page_size

    def host_pool_decls(self) -> Any:
        """The full-attention pool's host-pool declarations (the states are the host tier's
        :class:`mem_cache_pool_host.MambaPoolHost`'s), ``()`` when it declares none."""
        decls = getattr(self.full_kv_pool, "host_pool_decls", None)
        return decls() if callable(decls) else ()

    def get_kv_buffer_shape(self) -> tuple[torch.Size, torch.Size]:
        """Shapes of one layer's K and V buffers (of the dense full-attention pool)."""
        index = self.full_kv_pool.start_layer
        k = self.full_kv_pool._get_key_buffer(index)
        v = self.full_kv_pool._get_value_buffer(index)
        return k.shape, v.shape

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` of the full-attention KV buffers."""
        inner = getattr(self.full_kv_pool, "get_contiguous_buf_infos", None)
        if callable(inner):
            return inner()  # type: ignore[no-any-return]
        bufs = self.full_kv_pool._all_buffers()
        return (
            [t.data_ptr() for t in bufs],
            [t.numel() * t.element_size() for t in bufs],
            [t[0].numel() * t.element_size() * self.page_size for t in bufs],
        )

    def get_raw_kv_buffer(
        self, layer_id: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Quantised raw buffers: not supported (no quantised full pool)."""
        raise NotImplementedError("HybridLinearKVPool: no quantised (FP4/MXFP8) full pool")

    def get_dequant_workspace(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Quantised workspace: not supported (no quantised full pool)."""
        raise NotImplementedError("HybridLinearKVPool: no quantised (FP4/MXFP8) full pool")

    def get_flashinfer_dequant_workspace_kv_buffer(
        self, layer: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """Quantised workspace: not supported (no quantised full pool)."""
        raise NotImplementedError("HybridLinearKVPool: no quantised (FP4/MXFP8) full pool")

    def get_flashinfer_decode_dequant_workspace_kv_buffer(
        self, layer: Any, *args: Any, **kwargs: Any
    ) -> Any:
        """Quantised workspace: not supported (no quantised full pool)."""
        raise NotImplementedError("HybridLinearKVPool: no quantised (FP4/MXFP8) full pool")

    def get_kv_scale_buffer(self, layer_id: int) -> Any:
        """MXFP8 scales: not supported (no quantised full pool)."""
        raise NotImplementedError("HybridLinearKVPool: no quantised (FP4/MXFP8) full pool")

    def _no_dsa(self, name: str) -> NotImplementedError:
        return NotImplementedError(f"HybridLinearKVPool does not support {name} (no DSA pool)")

    def set_index_k_scale_buffer(
        self, layer_id: int, loc: torch.Tensor, index_k: torch.Tensor, index_k_scale: torch.Tensor
    ) -> None:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("set_index_k_scale_buffer")

    def get_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("get_index_k_with_scale_buffer")

    def get_broadcastable_index_k_with_scale_buffer(self, layer_id: int) -> torch.Tensor:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("get_broadcastable_index_k_with_scale_buffer")

    def invalidate_index_buffer_for_layer(self, layer_id: int) -> None:
        """No-op without DSA (SGLang returns early)."""
        checks.check_int("layer_id", layer_id)

    def get_index_k_scale_buffer(
        self,
        layer_id: int,
        seq_len_tensor: torch.Tensor,
        page_indices: torch.Tensor,
        seq_len_sum: int,
        max_seq_len: int,
    ) -> Any:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("get_index_k_scale_buffer")

    def get_compress_tail_buffers(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("get_compress_tail_buffers")

    def kpool_decode_update_index_cache(self, layer_id: int, *args: Any, **kwargs: Any) -> None:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("kpool_decode_update_index_cache")

    def set_compress_tail_for_request(  # noqa: PLR0917
        self,
        layer_id: int,
        req_pool_idx: torch.Tensor,
        key_tail: torch.Tensor,
        score_tail: torch.Tensor,
        n_remain: int,
        dst_logical_start: int,
    ) -> None:
        """DSA only: ``NotImplementedError`` (SGLang asserts ``use_dsa``)."""
        raise self._no_dsa("set_compress_tail_for_request")
