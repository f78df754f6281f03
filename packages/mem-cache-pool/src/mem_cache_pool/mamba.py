"""``MambaPool``: per-request conv and temporal states of linear-attention / SSM layers.

Mirrors SGLang 0.5.23's ``MambaPool`` (``sglang.srt.mem_cache.memory_pool``). For a hybrid model
(Qwen3-Next, Nemotron-H, Falcon-H1, Jamba, ...) every Mamba / GDN layer keeps, per request, a
*conv state* (the last ``conv_kernel - 1`` inputs of the causal conv, one tensor per conv shape)
and a *temporal state* (the SSM recurrent state). The pool holds them slot-major per layer:

* ``mamba_cache.conv[i]``: ``[num_mamba_layers, size + 1, *cache_params.shape.conv[i]]`` of
  ``cache_params.dtype.conv``;
* ``mamba_cache.temporal``: ``[num_mamba_layers, size + 1, *cache_params.shape.temporal]`` of
  ``cache_params.dtype.temporal``;
* with ``speculative_num_draft_tokens`` (speculative decoding), ``mamba_cache`` is a
  ``SpeculativeState`` that also holds ``intermediate_ssm`` ``[L, spec_state_size + 1, D,
  *temporal]`` and ``intermediate_conv_window[i]`` ``[L, spec_state_size + 1, D, *conv[i]]`` (the
  dense layout; SGLang deduplicates the overlapping windows only on CUDA for a linear draft
  chain, a pure memory layout choice with the same logical view).

Slot ``0`` is the dummy slot (padded requests write there); slots ``1..size`` are handed out by
the slot allocator of :class:`~mem_cache_pool.hybrid.HybridReqToTokenPool`. All buffers start
zeroed. Slot arguments are 1-D (or 0-d) int32/int64 tensors in ``[0, size]`` on any device;
values are checked where reading them is free (CPU tensors, or debug mode). Data movement goes
through :mod:`mem_cache_kernels.mamba` (bit-exact, torch or Triton).

Out of scope (each raises ``NotImplementedError`` when switched on, naming the flag): the GDN
ReplaySSM ring buffers (``enable_linear_replayssm*``) and the envelope byte layout
(``envelope_layout``). Their attributes exist with SGLang's "feature off" values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol, runtime_checkable

import torch

from mem_cache_kernels import checks
from mem_cache_kernels import mamba as state_ops
from mem_cache_kernels.dispatch import pick
from mem_cache_pool._mamba_params import (
    BaseLinearStateParams,
    Mamba2CacheParams,
    Mamba2StateDType,
    Mamba2StateShape,
    _read_params,
)
from mem_cache_pool._mamba_speculative import build_intermediate_state

__all__ = [
    "BaseLinearStateParams",
    "Mamba2CacheParams",
    "Mamba2StateDType",
    "Mamba2StateShape",
    "MambaPool",
    "SlotState",
]

_GB = 1 << 30


def _tensor_bytes(t: torch.Tensor | Sequence[torch.Tensor] | None) -> int:
    """Bytes of a tensor or of a list of tensors (``None``: 0), as SGLang's helper."""
    if t is None:
        return 0
    if isinstance(t, torch.Tensor):
        return t.numel() * t.element_size()
    return sum(_tensor_bytes(x) for x in t)


@runtime_checkable
class SlotState(Protocol):
    """A side state that rides along a Mamba slot (SGLang's ``SlotIndexedState``)."""

    def reset_slots(self, indices: torch.Tensor) -> None: ...

    def copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None: ...

    def get_cpu_slots(self, indices: torch.Tensor) -> Any: ...

    def load_cpu_slots(self, data: Any, indices: torch.Tensor) -> None: ...

    def iter_transfer_state_entries(self) -> Any: ...


def _slots(name: str, value: object, limit: int, debug: bool) -> torch.Tensor:
    """A slot tensor: 0-d or 1-D int32/int64, values in ``[0, limit)`` (read where free)."""
    if isinstance(value, torch.Tensor) and value.dim() == 0:
        value = value.reshape(1)
    t = checks.check_index(name, value)
    checks.check_index_values(name, t, limit=limit, full=debug)
    return t


class MambaPool:
    """Conv and temporal states of ``mamba_layer_ids`` for ``size`` slots (see the module doc).

    Args (keyword-only, SGLang's):
        size: state slots (``>= 0``); buffers have ``size + 1`` slots (slot 0 is the dummy).
        spec_state_size: slots of the speculative intermediate buffers (``+ 1``).
        cache_params: ``.shape.conv`` / ``.shape.temporal`` and ``.dtype.conv`` /
            ``.dtype.temporal`` (our :class:`Mamba2CacheParams` or SGLang's).
        mamba_layer_ids: global ids of the Mamba layers (their order is the pool's layer axis).
        device: where every buffer lives.
        speculative_num_draft_tokens: draft tokens per request; allocates the intermediate
            buffers (``mamba_cache`` becomes a ``SpeculativeState``).
        speculative_eagle_topk: EAGLE tree width (a tree, ``> 1``, keeps dense conv windows).
        dedup_conv_window: (ours) the deduplicated conv-window layout; ``None``: SGLang's rule
            (on for a CUDA device with a linear draft chain, off elsewhere).
        enable_memory_saver: accepted; no effect here.
        debug: check slot values on every device (syncs); also ``MEM_CACHE_DEBUG=1``.
    """

    host_capacity_tokens: int | None = None
    conv_window_axis = -1
    _slot_siblings: tuple[Any, ...] = ()

    @dataclass(frozen=True, kw_only=True)
    class State:
        """All layers' states; ``at_layer_idx(i)`` is one layer's view (SGLang's ``State``)."""

        conv: list[torch.Tensor]
        temporal: torch.Tensor
        replayssm_d: torch.Tensor | None = None
        replayssm_k: torch.Tensor | None = None
        replayssm_g: torch.Tensor | None = None
        replayssm_rawv: torch.Tensor | None = None
        replayssm_rawk: torch.Tensor | None = None
        replayssm_beta: torch.Tensor | None = None

        def at_layer_idx(self, layer: int) -> Any:
            """The same state restricted to pool layer ``layer`` (views, no copy)."""
            kwargs: dict[str, Any] = {}
            for f in fields(self):
                value = getattr(self, f.name)
                if value is None:
                    kwargs[f.name] = None
                elif f.name in ("conv", "intermediate_conv_window"):
                    kwargs[f.name] = [t[layer] for t in value]
                else:
                    kwargs[f.name] = value[layer]
            return type(self)(**kwargs)

        def mem_usage_bytes(self) -> int:
            """Bytes of every buffer held."""
            return sum(
                _tensor_bytes(getattr(self, f.name))
                for f in dataclasses.fields(self)
                if getattr(self, f.name) is not None
            )

    @dataclass(frozen=True, kw_only=True)
    class SpeculativeState(State):
        """``State`` plus the per-draft-token intermediate states of target verification."""

        intermediate_ssm: torch.Tensor | None
        intermediate_conv_window: list[torch.Tensor]

    def __init__(
        self,
        *,
        size: int,
        spec_state_size: int,
        cache_params: BaseLinearStateParams | Any,
        mamba_layer_ids: Sequence[int],
        device: str | torch.device,
        enable_memory_saver: bool = False,
        speculative_num_draft_tokens: int | None = None,
        speculative_eagle_topk: int | None = None,
        enable_linear_replayssm: bool = False,
        linear_replayssm_cache_len: int = 16,
        envelope_layout: bool = False,
        enable_linear_replayssm_spec: bool = False,
        dedup_conv_window: bool | None = None,
        debug: bool = False,
    ) -> None:
        self.size = checks.check_int("size", size, minimum=0)
        spec = checks.check_int("spec_state_size", spec_state_size, minimum=0)
        self.device = checks.check_device_arg("device", device)
        if isinstance(mamba_layer_ids, (str, bytes)) or not isinstance(mamba_layer_ids, Sequence):
            raise TypeError(
                f"mamba_layer_ids must be a sequence of ints, got {type(mamba_layer_ids).__name__}"
            )
        layer_ids = [
            checks.check_int(f"mamba_layer_ids[{i}]", x, minimum=0)
            for i, x in enumerate(mamba_layer_ids)
        ]
        if len(set(layer_ids)) != len(layer_ids):
            raise ValueError(f"mamba_layer_ids must not repeat a layer, got {layer_ids}")
        for flag, value in (
            ("enable_linear_replayssm", enable_linear_replayssm),
            ("enable_linear_replayssm_spec", enable_linear_replayssm_spec),
            ("envelope_layout", envelope_layout),
        ):
            if checks.check_bool(flag, value):
                raise NotImplementedError(
                    f"MambaPool: {flag}=True (SGLang's GDN ReplaySSM rings / envelope layout) "
                    "is not supported by mem_cache_pool"
                )
        draft = checks.check_optional_int(
            "speculative_num_draft_tokens", speculative_num_draft_tokens
        )
        if draft is not None:
            checks.check_int("speculative_num_draft_tokens", draft, minimum=1)
        conv_shapes, temporal_shape, conv_dtype, ssm_dtype = _read_params(cache_params)
        self.mamba_layer_ids = layer_ids
        self.num_mamba_layers = n_layers = len(layer_ids)
        self.enable_memory_saver = enable_memory_saver
        self.memory_saver_adapter = None
        self.debug_memory_pool = self.debug = checks.debug_enabled(debug)
        self.enable_linear_replayssm = False
        self.linear_replayssm_cache_len = linear_replayssm_cache_len
        self.enable_linear_replayssm_spec = False
        self.replayssm_spec_fold = False
        self.replayssm_is_kda = False
        self.replayssm_write_pos: torch.Tensor | None = None
        self.replayssm_spec_write_pos: torch.Tensor | None = None
        self.replayssm_cache_base: torch.Tensor | None = None
        self.replayssm_is_flush: torch.Tensor | None = None
        self.enable_custom_mem_pool = False
        self.custom_mem_pool = None
        self.speculative_num_draft_tokens = draft
        self.spec_state_size = spec
        conv = [
            torch.zeros((n_layers, self.size + 1, *s), dtype=conv_dtype, device=self.device)
            for s in conv_shapes
        ]
        temporal = torch.zeros(
            (n_layers, self.size + 1, *temporal_shape), dtype=ssm_dtype, device=self.device
        )
        self.mamba_cache: MambaPool.State
        if draft is not None:
            ssm, windows, self._intermediate_conv_window_phys = build_intermediate_state(
                conv_shapes,
                temporal_shape,
                (conv_dtype, ssm_dtype),
                (n_layers, spec, draft),
                self.device,
                cache_params,
                dedup_conv_window,
                speculative_eagle_topk,
            )
            self.mamba_cache = self.SpeculativeState(
                conv=conv, temporal=temporal, intermediate_ssm=ssm, intermediate_conv_window=windows
            )
        else:
            self._intermediate_conv_window_phys = []
            self.mamba_cache = self.State(conv=conv, temporal=temporal)
        used = self.mamba_cache.mem_usage_bytes()
        if isinstance(self.mamba_cache, self.SpeculativeState):  # charge the physical windows
            used += _tensor_bytes(self._intermediate_conv_window_phys) - (
                _tensor_bytes(self.mamba_cache.intermediate_conv_window)
            )
        self.mem_usage = used / _GB
        shape = cache_params.shape
        self.conv_shard_groups = getattr(shape, "conv_shard_groups", None)
        self.conv_slice_axis = getattr(shape, "conv_slice_axis", 0)

    # ------------------------------------------------------------------ side states
    def register_slot_state(self, state: SlotState) -> None:
        """Attach a state that rides along on clear / copy / host round trip."""
        if not isinstance(state, SlotState):
            raise TypeError(
                "state must implement reset_slots, copy_slots, get_cpu_slots, load_cpu_slots and "
                f"iter_transfer_state_entries, got {type(state).__name__}"
            )
        self._slot_siblings = (*self._slot_siblings, state)

    # ------------------------------------------------------------------ views
    def get_speculative_mamba2_params_all_layers(self) -> MambaPool.SpeculativeState:
        """The speculative state of every layer (``RuntimeError`` without speculative buffers)."""
        if not isinstance(self.mamba_cache, self.SpeculativeState):
            raise RuntimeError(
                "MambaPool has no speculative buffers: construct it with "
                "speculative_num_draft_tokens"
            )
        return self.mamba_cache

    def mamba2_layer_cache(self, layer_id: int) -> Any:
        """The state of pool layer ``layer_id`` (an index into ``mamba_layer_ids``; views)."""
        index = checks.check_int("layer_id", layer_id)
        if not 0 <= index < self.num_mamba_layers:
            raise ValueError(f"layer_id must lie in [0, {self.num_mamba_layers}), got {index}")
        return self.mamba_cache.at_layer_idx(index)

    def _state_tensors(self) -> list[torch.Tensor]:
        """The slot-indexed checkpoint tensors (conv..., temporal when not empty)."""
        out = list(self.mamba_cache.conv)
        if self.mamba_cache.temporal.numel() > 0:
            out.append(self.mamba_cache.temporal)
        return [t for t in out if t.numel() > 0]

    def _check_slots(self, name: str, value: object) -> torch.Tensor:
        return _slots(name, value, self.size + 1, self.debug)

    # ------------------------------------------------------------------ slot operations
    def clear_slots(self, indices: torch.Tensor) -> None:
        """Zero every layer's conv and temporal state at slots ``indices`` (and the siblings')."""
        idx = self._check_slots("indices", indices).to(device=self.device, dtype=torch.int64)
        for sibling in self._slot_siblings:
            sibling.reset_slots(idx)
        if idx.numel():
            for t in self._state_tensors():
                t.index_fill_(1, idx, 0)

    def copy_from(self, src_indices: torch.Tensor, dst_indices: torch.Tensor) -> None:
        """Clone the states of slots ``src_indices`` into ``dst_indices`` (equal lengths; the
        destinations distinct; overlap-safe). Forks and radix checkpoints. Mutates ``dst``."""
        self._copy_slots(*self._check_copy("src_indices", src_indices, "dst_indices", dst_indices))

    def _check_copy(
        self, src_name: str, src_indices: object, dst_name: str, dst_indices: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The checks of :meth:`copy_from`, naming the caller's arguments: ``(src, dst)``."""
        src = self._check_slots(src_name, src_indices)
        dst = self._check_slots(dst_name, dst_indices)
        checks.check_same_length(**{src_name: src, dst_name: dst})
        checks.check_distinct(dst_name, dst, full=self.debug)
        return src, dst

    def _copy_slots(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """:meth:`copy_from` on checked slots (trusted: no checks)."""
        if src.numel():
            states = self._state_tensors()
            copy = pick("copy_state_slots", "auto", *states)
            copy(states, src.to(self.device), dst.to(self.device))
        for sibling in self._slot_siblings:
            sibling.copy_slots(src, dst)

    def get_cpu_copy(self, indices: torch.Tensor) -> tuple[Any, ...]:
        """``(conv_cpu, temporal_cpu)`` (plus the siblings' data when any are registered):
        ``conv_cpu[i]`` ``[L, n, *conv[i]]`` and ``temporal_cpu`` ``[L, n, *temporal]`` on the
        CPU, the states of slots ``indices`` (request retraction). The pool is not mutated."""
        idx = self._check_slots("indices", indices).to(self.device)
        n = idx.numel()
        conv_cpu = [self._gather_cpu(t, idx, n) for t in self.mamba_cache.conv]
        temporal_cpu = self._gather_cpu(self.mamba_cache.temporal, idx, n)
        if self._slot_siblings:
            siblings = [s.get_cpu_slots(idx) for s in self._slot_siblings]
            return conv_cpu, temporal_cpu, siblings
        return conv_cpu, temporal_cpu

    def _gather_cpu(self, t: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
        out = torch.empty((t.shape[0], n, *t.shape[2:]), dtype=t.dtype, device=t.device)
        if n and t.numel():
            state_ops.gather_state_slots([t], idx, [out])
        return out.cpu()

    def load_cpu_copy(self, mamba_cache_cpu: Sequence[Any], indices: torch.Tensor) -> None:
        """Write a :meth:`get_cpu_copy` result back at (new) slots ``indices``.

        Shapes and dtypes are checked against the pool and ``indices`` before any write
        (``TypeError`` / ``ValueError``); mutates slots ``indices``.
        """
        idx, pairs, siblings = self._check_cpu_copy(mamba_cache_cpu, indices)
        if idx.numel():
            for dev, host in pairs:
                if dev.numel():
                    state_ops.scatter_state_slots([dev], idx, [host.to(dev.device)])
        if siblings is not None:
            for sibling, data in zip(self._slot_siblings, siblings):
                sibling.load_cpu_slots(data, idx)

    def _check_cpu_copy(
        self,
        mamba_cache_cpu: Sequence[Any],
        indices: torch.Tensor,
        copy_name: str = "mamba_cache_cpu",
        index_name: str = "indices",
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]], Any]:
        """The checks of :meth:`load_cpu_copy` (nothing written): ``(slots, (device, cpu)
        tensor pairs, siblings' data)``. Messages name ``copy_name`` / ``index_name``."""
        idx = self._check_slots(index_name, indices).to(self.device)
        checks.check_distinct(index_name, idx, full=self.debug)
        if isinstance(mamba_cache_cpu, (str, bytes)) or not isinstance(mamba_cache_cpu, Sequence):
            raise TypeError(
                f"{copy_name} must be the tuple get_cpu_copy returned, got "
                f"{type(mamba_cache_cpu).__name__}"
            )
        parts = list(mamba_cache_cpu)
        siblings = None
        if self._slot_siblings:
            if not parts:
                raise ValueError(f"{copy_name} must end with the registered siblings' data")
            siblings = parts.pop()
        if len(parts) == 3:
            parts = parts[:2]  # SGLang's historical 3-tuples: the replay scratch is dropped
        if len(parts) != 2:
            raise ValueError(
                f"{copy_name} must be (conv_cpu, temporal_cpu), got {len(parts)} parts"
            )
        conv_cpu, temporal_cpu = parts
        if isinstance(conv_cpu, torch.Tensor) or not isinstance(conv_cpu, Sequence):
            raise TypeError(f"{copy_name}[0] must be a list of tensors, got {type(conv_cpu)}")
        if len(conv_cpu) != len(self.mamba_cache.conv):
            raise ValueError(
                f"{copy_name}[0] must hold {len(self.mamba_cache.conv)} conv tensors, got "
                f"{len(conv_cpu)}"
            )
        pairs = [*zip(self.mamba_cache.conv, conv_cpu), (self.mamba_cache.temporal, temporal_cpu)]
        names = [f"{copy_name}[0][{i}]" for i in range(len(conv_cpu))] + [f"{copy_name}[1]"]
        n = idx.numel()
        for name, (dev, host) in zip(names, pairs):
            checks.check_tensor(name, host)
            if host.dtype != dev.dtype:
                raise TypeError(f"{name} must be {dev.dtype}, got {host.dtype}")
            want = (dev.shape[0], n, *dev.shape[2:])
            if tuple(host.shape) != want:
                raise ValueError(
                    f"{name} must have shape {want} ({n} slots of {index_name}), got "
                    f"{tuple(host.shape)}"
                )
        return idx, pairs, siblings

    # ------------------------------------------------------------------ transfer descriptors
    def _iter_transfer_state_entries(self) -> Any:
        """``(field, per-layer tensor [slots, ...], slice_axis, layer_id)`` of every checkpoint
        buffer (speculative scratch excluded), then the siblings' entries."""
        for name, value in (
            ("conv", self.mamba_cache.conv),
            ("temporal", self.mamba_cache.temporal),
        ):
            tensors = value if isinstance(value, list) else [value]
            axis = self.conv_slice_axis if name == "conv" else 0
            for t in tensors:
                if t.numel() == 0:
                    continue
                for index, layer_id in enumerate(self.mamba_layer_ids):
                    yield name, t[index], axis, layer_id
        for sibling in self._slot_siblings:
            yield from sibling.iter_transfer_state_entries()

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` per state tensor and layer (RDMA registration)."""
        ptrs, lens, items = [], [], []
        for _, t, _, _ in self._iter_transfer_state_entries():
            ptrs.append(t.data_ptr())
            lens.append(t.numel() * t.element_size())
            items.append(t[0].numel() * t.element_size())
        return ptrs, lens, items

    def get_state_dim_per_tensor(self) -> list[int]:
        """The tensor-parallel slice dimension of each entry of :meth:`get_contiguous_buf_infos`."""
        return [
            0 if axis is None else t.shape[1 + axis]
            for _, t, axis, _ in self._iter_transfer_state_entries()
        ]

    def get_state_layer_ids(self) -> list[int]:
        """Global layer id of each entry of :meth:`get_contiguous_buf_infos`."""
        return [layer_id for _, _, _, layer_id in self._iter_transfer_state_entries()]

    def get_state_slice_outer_counts(self) -> list[int]:
        """Rows preceding each entry's slice axis."""
        return [
            1 if axis is None else math.prod(t.shape[1 : 1 + axis])
            for _, t, axis, _ in self._iter_transfer_state_entries()
        ]

    def get_state_conv_shard_groups(self) -> list[list[int] | None]:
        """Per entry: the conv sub-block dims (GDN q/k/v) for conv entries, else ``None``."""
        groups = self.conv_shard_groups
        return [
            list(groups) if name == "conv" and groups is not None else None
            for name, _, _, _ in self._iter_transfer_state_entries()
        ]

    def get_kv_size_bytes(self) -> int:
        """Bytes of every buffer of the pool (speculative ones included)."""
        return self.mamba_cache.mem_usage_bytes()

    def get_device_pool_infos(self) -> tuple[Any, ...]:
        """SGLang's HiCache v2 pool descriptors; not provided here (``NotImplementedError``):
        the host tier of this repository is :class:`mem_cache_pool_host.MambaPoolHost`."""
        raise NotImplementedError(
            "MambaPool.get_device_pool_infos: SGLang's DevicePoolInfo descriptors are not "
            "provided; use mem_cache_pool_host.MambaPoolHost"
        )
