"""Mamba / linear-attention state slots: copy, gather and scatter whole per-request states.

A *state tensor* is ``[layers, slots, *state]`` (SGLang's ``MambaPool`` conv and temporal
buffers): slot ``s`` of layer ``l`` is the entry ``t[l, s]``, C-contiguous. A pool holds several
state tensors (one per conv shape, the temporal state) that may differ in dtype, layer count and
entry shape; every op takes them as a sequence and moves the same slots of each, every layer.

* :func:`copy_state_slots` ``(states, src_slots, dst_slots)``: within the tensors, ``t[:, dst]``
  gets the old ``t[:, src]`` (forks, radix checkpoints; overlap-safe; ``dst`` entries distinct).
* :func:`gather_state_slots` ``(states, slots, out, out_slots=None)``: ``out[i][:, out_slots[j]]
  = states[i][:, slots[j]]``; ``out_slots`` defaults to ``0..n-1`` (``out[i]`` ``[layers, n,
  *state]``). ``out`` may live on another device (the host tier; pinned for Triton on a GPU).
* :func:`scatter_state_slots` ``(states, slots, src, src_slots=None)``: ``states[i][:, slots[j]]
  = src[i][:, src_slots[j]]``, the inverse.

Bytes are copied bit-exactly; both backends (``backend="auto" | "torch" | "triton"``) move the
same bytes. A pair with a negative slot is skipped. Slot tensors: 1-D int32/int64, equal lengths,
any device. Every check runs before any byte moves (``TypeError`` for the wrong kind or dtype,
``ValueError`` for a wrong shape, device, length or, where free to read, slot value).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from mem_cache_kernels import checks as v
from mem_cache_kernels.dispatch import Backend, pick

__all__ = ["copy_state_slots", "gather_state_slots", "scatter_state_slots"]


def _entry_contiguous(name: str, t: torch.Tensor) -> None:
    expected = 1
    for size, stride in zip(reversed(t.shape[2:]), reversed(t.stride()[2:])):
        if size != 1 and stride != expected:
            raise ValueError(
                f"{name} must have C-contiguous state entries, got strides {tuple(t.stride())} "
                f"for shape {tuple(t.shape)}"
            )
        expected *= size


def _states(name: str, value: object) -> list[torch.Tensor]:
    items = v.check_tensor_list(name, value)
    for i, t in enumerate(items):
        v.check_tensor_of(f"{name}[{i}]", t, min_dim=3, shape="[layers, slots, *state]")
        _entry_contiguous(f"{name}[{i}]", t)
    v.check_same_device(items[0].device, **{f"{name}[{i}]": t for i, t in enumerate(items)})
    return items


def _pairs(a_name: str, a: list[torch.Tensor], b_name: str, b: list[torch.Tensor]) -> None:
    if len(a) != len(b):
        raise ValueError(f"{b_name} must hold {len(a)} tensors (one per {a_name}), got {len(b)}")
    for i, (x, y) in enumerate(zip(a, b)):
        if y.dtype != x.dtype:
            raise TypeError(f"{b_name}[{i}] must be {x.dtype} like {a_name}[{i}], got {y.dtype}")
        if y.shape[0] != x.shape[0] or y.shape[2:] != x.shape[2:]:
            raise ValueError(
                f"{b_name}[{i}] must be [{x.shape[0]}, slots, {', '.join(map(str, x.shape[2:]))}] "
                f"like {a_name}[{i}], got shape {tuple(y.shape)}"
            )


def _bound(idx: torch.Tensor, name: str, tensors: list[torch.Tensor], what: str) -> None:
    top = v.IndexBound(name, idx)
    for i, t in enumerate(tensors):
        top.check(t.shape[1], f"{what}[{i}] (slots)")


def copy_state_slots(
    states: Sequence[torch.Tensor],
    src_slots: torch.Tensor,
    dst_slots: torch.Tensor,
    *,
    backend: Backend = "auto",
) -> None:
    """For every state tensor: ``t[:, dst_slots] = old t[:, src_slots]`` (see the module doc).

    ``dst_slots`` must not repeat a slot (checked where free to read). Mutates slots
    ``dst_slots`` of every tensor, every layer.
    """
    s = _states("states", states)
    src = v.check_index("src_slots", src_slots)
    dst = v.check_index("dst_slots", dst_slots)
    v.check_same_length(src_slots=src, dst_slots=dst)
    _bound(src, "src_slots", s, "states")
    _bound(dst, "dst_slots", s, "states")
    v.check_distinct("dst_slots", dst[dst >= 0] if dst.is_cpu else dst)
    pick("copy_state_slots", backend, *s)(s, src, dst)


def _order(name: str, given: object, n: int, device: torch.device) -> torch.Tensor:
    if given is None:
        return torch.arange(n, dtype=torch.int64, device=device)
    return v.check_index(name, given, length=n)


def gather_state_slots(
    states: Sequence[torch.Tensor],
    slots: torch.Tensor,
    out: Sequence[torch.Tensor],
    out_slots: torch.Tensor | None = None,
    *,
    backend: Backend = "auto",
) -> None:
    """``out[i][:, out_slots[j]] = states[i][:, slots[j]]`` (see the module doc).

    ``out[i]``: the dtype, layer count and entry shape of ``states[i]``, on one device (which
    may differ from ``states``'). Mutates ``out`` only.
    """
    s = _states("states", states)
    o = _states("out", out)
    _pairs("states", s, "out", o)
    idx = v.check_index("slots", slots)
    o_idx = _order("out_slots", out_slots, idx.shape[0], idx.device)
    v.check_same_length(slots=idx, out_slots=o_idx)
    _bound(idx, "slots", s, "states")
    _bound(o_idx, "out_slots", o, "out")
    pick("gather_state_slots", backend, *s, *o)(s, o, idx, o_idx)


def scatter_state_slots(
    states: Sequence[torch.Tensor],
    slots: torch.Tensor,
    src: Sequence[torch.Tensor],
    src_slots: torch.Tensor | None = None,
    *,
    backend: Backend = "auto",
) -> None:
    """``states[i][:, slots[j]] = src[i][:, src_slots[j]]`` (see the module doc).

    ``src[i]``: the dtype, layer count and entry shape of ``states[i]``, on one device (which
    may differ from ``states``'). Mutates slots ``slots`` of ``states`` only.
    """
    s = _states("states", states)
    srcs = _states("src", src)
    _pairs("states", s, "src", srcs)
    idx = v.check_index("slots", slots)
    s_idx = _order("src_slots", src_slots, idx.shape[0], idx.device)
    v.check_same_length(slots=idx, src_slots=s_idx)
    _bound(idx, "slots", s, "states")
    _bound(s_idx, "src_slots", srcs, "src")
    pick("scatter_state_slots", backend, *s, *srcs)(srcs, s, s_idx, idx)
