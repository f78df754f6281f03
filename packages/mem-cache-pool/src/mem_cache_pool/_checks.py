"""The pools' own argument checks (private), built on :mod:`mem_cache_kernels.checks`.

The generic checks (ints that are not bools, devices, index tensors, value ranges, the debug
switch) live in :mod:`mem_cache_kernels.checks`; this module holds only what is specific to a
pool: a slot tensor checked against the pool's row count, a row tensor of an exact shape, a slot
mapping ending in the ``-1`` sentinel, a layer id in a half-open range, the shape of a CPU copy.

Each public pool method checks its arguments once, at its entry, and then calls trusted code
(the kernel bodies through :func:`mem_cache_kernels.dispatch.pick`). The hot methods (the
``set_kv_buffer`` family, layer reads, ``ReqToTokenPool.write``) accept the common argument
forms inline, in their own module, and call these checks only for the other forms: a check here
then raises naming the argument, or accepts an unusual valid form (an ``int`` subclass, a device
without an index). So a hot call on good arguments runs through the method's module,
:mod:`mem_cache_kernels.checks` and the kernel, never through this module.

The exception rule is the one of :mod:`mem_cache_kernels.checks`: ``TypeError`` for the wrong kind
of object or a tensor of the wrong dtype, ``ValueError`` for a wrong value, shape, length or
device; every message names the argument, the expected and the actual value. Checks that read
tensor values run when the tensor is on the CPU (free) or when ``full`` is true (the pool is in
debug mode), so the hot path never synchronises with the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from mem_cache_kernels import checks

__all__ = [
    "batch_page_tokens",
    "check_copy_layers",
    "check_copy_roles",
    "check_layer",
    "check_mapping",
    "check_rows",
    "check_scale",
    "check_slots",
    "layer_id_of",
]


def check_slots(
    name: str,
    loc: object,
    device: torch.device,
    limit: int,
    *,
    full: bool,
    length: int | None = None,
) -> torch.Tensor:
    """A pool's slot tensor: :func:`~mem_cache_kernels.checks.check_index` (int32/int64, 1-D,
    ``length`` elements when given, on ``device``) plus values in ``[0, limit)``
    (:func:`~mem_cache_kernels.checks.check_index_values`: read on the CPU or when ``full``)."""
    t = checks.check_index(name, loc, length=length, device=device)
    checks.check_index_values(name, t, limit=limit, full=full)
    return t


def batch_page_tokens(
    page_indices: object,
    seq_len_tensor: object,
    seq_len_sum: object,
    max_seq_len: object,
    *,
    page_size: int,
    device: torch.device,
    limit: int,
) -> torch.Tensor:
    """The token slots (int64, 1-D, sequences concatenated in order) of a batch gather
    (SGLang's ``GetKAndS``): sequence ``b``'s first ``seq_len_tensor[b]`` tokens, token ``t`` in
    page ``page_indices[b, t // page_size]``. Checks every argument (``page_indices``
    ``[B, max_pages]`` int32/int64, ``seq_len_tensor`` ``[B]``, ``seq_len_sum`` / ``max_seq_len``
    their sum / max, no sequence longer than its row of pages, slots in ``[0, limit)``)."""
    pages = checks.check_tensor("page_indices", page_indices)
    if pages.dtype not in checks.INDEX_DTYPES:
        raise TypeError(f"page_indices must be int32 or int64, got {pages.dtype}")
    if pages.dim() != 2:
        raise ValueError(f"page_indices must be 2-D [B, max_pages], got {tuple(pages.shape)}")
    checks.check_on_device("page_indices", pages, device)
    lens = checks.check_index("seq_len_tensor", seq_len_tensor, device=device)
    total = checks.check_int("seq_len_sum", seq_len_sum, minimum=0)
    longest = checks.check_int("max_seq_len", max_seq_len, minimum=0)
    if lens.numel() != pages.shape[0]:
        raise ValueError(
            f"seq_len_tensor must hold one length per row of page_indices "
            f"({pages.shape[0]}), got {lens.numel()}"
        )
    lens64 = lens.to(torch.int64)
    if int(lens64.sum()) != total or (lens64.numel() and int(lens64.max()) > longest):
        raise ValueError(
            f"seq_len_sum / max_seq_len must be the sum / max of seq_len_tensor, got "
            f"{total} / {longest} for {lens64.tolist()}"
        )
    if longest > pages.shape[1] * page_size:
        raise ValueError(
            f"max_seq_len must be <= page_indices.shape[1] * page_size = "
            f"{pages.shape[1] * page_size}, got {longest}"
        )
    pos = torch.arange(longest, device=device)
    keep = pos[None, :] < lens64[:, None]
    page = pages.to(torch.int64).gather(1, (pos // page_size).expand(pages.shape[0], -1))
    tokens = (page * page_size + pos % page_size)[keep]
    return check_slots("page_indices (tokens)", tokens, device, limit, full=True)


def layer_id_of(name: str, value: object) -> int:
    """The int layer id of ``value``: an int (not a bool) or a layer object with an int
    ``layer_id`` attribute (SGLang's ``RadixAttention``, which its attention backends hand the
    pools). ``TypeError`` otherwise, naming the argument."""
    if isinstance(value, int) or not hasattr(value, "layer_id"):
        if not isinstance(value, int):
            raise TypeError(
                f"{name} must be an int layer id or a layer with an int layer_id attribute, "
                f"got {type(value).__name__}"
            )
        return checks.check_int(name, value)
    return checks.check_int(f"{name}.layer_id", value.layer_id)


def check_layer(name: str, value: object, start: int, stop: int) -> int:
    """``value`` (an int or a layer object, :func:`layer_id_of`) as an int layer id in
    ``[start, stop)`` (``TypeError`` for a non-int or a bool, ``ValueError`` outside the range,
    which the message names)."""
    layer = layer_id_of(name, value)
    if not start <= layer < stop:
        raise ValueError(f"{name} must lie in [{start}, {stop}), got {layer}")
    return layer


def check_scale(name: str, value: object) -> float | torch.Tensor | None:
    """A quantisation scale: a float, an int (not a bool), a tensor or ``None``."""
    if value is None or isinstance(value, (float, torch.Tensor)):
        return value
    try:
        return checks.check_int(name, value)
    except TypeError:
        raise TypeError(
            f"{name} must be a number, a tensor or None, got {type(value).__name__}"
        ) from None


def check_rows(
    name: str,
    value: object,
    shape: Sequence[int],
    device: torch.device,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
) -> torch.Tensor:
    """A tensor of exactly ``shape`` on ``device`` (rows to write into a pool).

    ``dtypes``: the accepted dtypes; ``None`` accepts any floating-point dtype (the pool casts).
    """
    t = checks.check_tensor(name, value)
    if dtypes is None:
        if not t.dtype.is_floating_point:
            raise TypeError(f"{name} must have a floating-point dtype, got {t.dtype}")
    elif t.dtype not in dtypes:
        expected = " or ".join(str(d) for d in dtypes)
        raise TypeError(f"{name} must have dtype {expected}, got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(t.shape)}")
    checks.check_on_device(name, t, device)
    return t


def check_mapping(
    name: str,
    mapping: object,
    device: torch.device,
    length: int,
    *,
    full: bool,
    targets: int | None = None,
) -> torch.Tensor:
    """A slot mapping: int64 ``[length]`` on ``device`` with ``mapping[-1] == -1`` and, when
    ``targets`` is given, every other value in ``[0, targets)`` (0 = unmapped).

    The values (a device read) are checked when ``full`` or on the CPU.
    """
    t = checks.check_index(name, mapping, dtypes=(torch.int64,), length=length, device=device)
    if full or t.device.type == "cpu":
        last = int(t[-1])
        if last != -1:
            raise ValueError(f"{name}[-1] must be the sentinel -1, got {last}")
        if targets is not None:
            checks.check_index_values(f"{name}[:-1]", t[:-1], limit=targets, full=True)
    return t


def check_copy_roles(
    kv_cache_cpu: object, roles: Sequence[str], name: str = "kv_cache_cpu"
) -> Mapping[str, object]:
    """A CPU copy (``get_cpu_copy`` result) called ``name``: a dict whose keys are ``roles``."""
    if not isinstance(kv_cache_cpu, dict):
        raise TypeError(
            f"{name} must be a dict of roles {sorted(roles)}, got {type(kv_cache_cpu).__name__}"
        )
    if sorted(kv_cache_cpu) != sorted(roles):
        raise ValueError(f"{name} must have roles {sorted(roles)}, got {sorted(kv_cache_cpu)}")
    return kv_cache_cpu


def check_copy_layers(
    name: str, layers: object, count: int, dtype: torch.dtype, shape: Sequence[int]
) -> list[torch.Tensor]:
    """One role of a CPU copy: ``count`` tensors of ``dtype`` and ``shape``."""
    if isinstance(layers, torch.Tensor) or not isinstance(layers, Sequence):
        raise TypeError(f"{name} must be a list of tensors, got {type(layers).__name__}")
    if len(layers) != count:
        raise ValueError(f"{name} must hold {count} layers, got {len(layers)}")
    want = tuple(shape)
    expected = f"{_dtype_name(dtype)} {want}"
    for t in layers:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must hold tensors, got {type(t).__name__}")
        got = f"{_dtype_name(t.dtype)} {tuple(t.shape)}"
        if t.dtype != dtype:
            raise TypeError(f"{name} tensors must be {expected}, got {got}")
        if tuple(t.shape) != want:
            raise ValueError(f"{name} tensors must be {expected}, got {got}")
    return list(layers)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
