"""The catalogue of public ops, and the table that dispatch reads.

Every public op has one :class:`OpInfo` in :data:`OPS`. It names where the op is published
(``module``, ``name``) and which function implements it on each backend (``torch``, ``triton``:
``"package.module:function"`` targets). A public op validates its arguments, then calls
:func:`mem_cache_kernels._dispatch.implementation` with its ``OpInfo``, which resolves the
backend and returns the function the entry names (Triton targets are imported only then, through
``_dispatch``): one hop from the public function to the code that moves bytes.

Target forms:

* ``"pkg.module:function"``: the function is the implementation; it takes the validated
  arguments of the op (minus ``backend``).
* ``"pkg.module:body(pkg.module:executor)"``: a backend-independent body (the data-movement
  bodies of :mod:`mem_cache_kernels._row_ops`) called with the backend's row-job executor as its
  first argument, so both backends move exactly the same bytes.
* ``None``: no such implementation. An op with ``torch=None`` has a single implementation, its
  public function itself, the same on every backend (the host-driven ``direct_*`` copies, the
  DeepSeek-V4 quantisation arithmetic); ``backend``, where it takes one, is only validated.

This module holds data only (strings; it imports nothing but the standard library): the
catalogue costs nothing to import and never imports an implementation, let alone triton.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["OPS", "OpInfo", "list_ops", "op", "split_target"]

_PACKAGE = "mem_cache_kernels"
_FUNCTION = r"[A-Za-z_][\w.]*:[A-Za-z_]\w*"
_TARGET = re.compile(rf"(?P<function>{_FUNCTION})(?:\((?P<executor>{_FUNCTION})\))?")


@dataclass(frozen=True, slots=True, kw_only=True)
class OpInfo:
    """One public op of :mod:`mem_cache_kernels` and the implementations dispatch calls."""

    name: str
    """Function name in ``module``."""
    family: str
    """Op family: ``alloc``, ``req_table``, ``store``, ``move``, ``transfer``, ``direct``,
    ``deepseek_v4`` or ``mamba``."""
    torch: str | None
    """Torch implementation (a target, see the module doc); ``None``: the public function is the
    only implementation."""
    triton: str | None
    """Triton implementation under ``mem_cache_kernels._triton`` (imported on first use, through
    ``_dispatch`` only); ``None``: none (host-driven or plain torch arithmetic)."""
    summary: str
    """One line."""
    module: str = _PACKAGE
    """Public module that exports the op (``mem_cache_kernels`` or a public submodule)."""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"OpInfo.name must be an identifier, got {self.name!r}")
        if self.module != _PACKAGE and not self.module.startswith(_PACKAGE + "."):
            raise ValueError(f"OpInfo.module must be {_PACKAGE} or under it, got {self.module!r}")
        for field, target in (("torch", self.torch), ("triton", self.triton)):
            if target is not None and _TARGET.fullmatch(target) is None:
                raise ValueError(
                    f"OpInfo.{field} of {self.name} must be 'module:function' or "
                    f"'module:body(module:executor)', got {target!r}"
                )
        if self.triton is not None:
            if self.torch is None:
                raise ValueError(f"OpInfo.torch of {self.name} must be set when triton is")
            module, _, executor = split_target(self.triton)
            code = module if executor is None else executor.partition(":")[0]
            if not code.startswith(f"{_PACKAGE}._triton."):
                raise ValueError(
                    f"OpInfo.triton of {self.name} must run code under {_PACKAGE}._triton "
                    f"(its function, or its executor), got {self.triton!r}"
                )

    @property
    def qualname(self) -> str:
        """``name`` for an op of the package itself, ``submodule.name`` for one of a public
        submodule (e.g. ``deepseek_v4.pack_records``)."""
        if self.module == _PACKAGE:
            return self.name
        return f"{self.module.removeprefix(_PACKAGE + '.')}.{self.name}"


def split_target(target: str) -> tuple[str, str, str | None]:
    """``(module, function, executor)`` of a target (``executor``: ``None`` or
    ``"module:function"``)."""
    match = _TARGET.fullmatch(target)
    if match is None:
        raise ValueError(f"target must be 'module:function[(module:executor)]', got {target!r}")
    module, _, function = match["function"].partition(":")
    return module, function, match["executor"]


_TORCH_ROWS = "mem_cache_kernels._torch.jobs:run_jobs"
_TRITON_ROWS = "mem_cache_kernels._triton.rows:run_jobs"


def _torch(module: str, function: str) -> str:
    return f"{_PACKAGE}._torch.{module}:{function}"


def _triton(module: str, function: str) -> str:
    return f"{_PACKAGE}._triton.{module}:{function}"


def _rows(body: str, executor: str) -> str:
    """The shared data-movement body ``_row_ops.<body>`` on ``executor``."""
    return f"{_PACKAGE}._row_ops:{body}({executor})"


def _row_op(name: str, family: str, summary: str) -> OpInfo:
    """An op whose body is shared by both backends and runs on their row-job executor."""
    return OpInfo(
        name=name,
        family=family,
        torch=_rows(name, _TORCH_ROWS),
        triton=_rows(name, _TRITON_ROWS),
        summary=summary,
    )


_DEEPSEEK_V4 = f"{_PACKAGE}.deepseek_v4"


OPS: tuple[OpInfo, ...] = (
    OpInfo(
        name="alloc_extend",
        family="alloc",
        torch=_torch("alloc", "alloc_extend"),
        triton=_triton("alloc", "alloc_extend"),
        summary="slots for an extend batch (partial page, whole pages, trailing page)",
    ),
    OpInfo(
        name="alloc_decode",
        family="alloc",
        torch=_torch("alloc", "alloc_decode"),
        triton=_triton("alloc", "alloc_decode"),
        summary="one slot per request for a decode step",
    ),
    OpInfo(
        name="write_req_to_token",
        family="req_table",
        torch=_torch("req_table", "write_req_to_token"),
        triton=_triton("req_table", "write_req_to_token"),
        summary="prefix and new slots into each request's req_to_token row",
    ),
    OpInfo(
        name="get_last_loc",
        family="req_table",
        torch=_torch("req_table", "get_last_loc"),
        triton=_triton("req_table", "get_last_loc"),
        summary="slot of the last prefix token per request (-1 for an empty prefix)",
    ),
    _row_op("store_kv", "store", "K and V rows into the caches at loc (cast to the storage dtype)"),
    _row_op(
        "set_mla_kv_buffer",
        "store",
        "MLA nope and rope parts into a latent row without concatenating",
    ),
    _row_op("get_mla_kv_buffer", "store", "gather MLA rows back as separate nope and rope tensors"),
    OpInfo(
        name="copy_all_layer_kv_cache",
        family="move",
        torch=_rows("copy_all_layer_kv_cache", _TORCH_ROWS),
        # two launches (gather, then scatter): overlap-safe for any number of rows
        triton=_triton("move", "copy_all_layer_kv_cache"),
        summary="move rows src_loc -> tgt_loc in every buffer (overlap-safe)",
    ),
    _row_op("transfer_rows", "transfer", "one layer, layer-first <-> layer-first rows per role"),
    _row_op(
        "transfer_rows_all_layers",
        "transfer",
        "every layer, layer-first <-> layer-first rows per role",
    ),
    _row_op("load_layer_from_page_first", "transfer", "host page-first -> one device layer"),
    _row_op("backup_all_layers_to_page_first", "transfer", "every device layer -> host page-first"),
    OpInfo(
        name="direct_transfer_rows",
        family="direct",
        torch=None,
        triton=None,
        summary="host-driven layer-first copies, one per run of consecutive rows",
    ),
    OpInfo(
        name="direct_load_layer_from_page_first_direct",
        family="direct",
        torch=None,
        triton=None,
        summary="host-driven page-first-direct -> one device layer, runs of pages",
    ),
    OpInfo(
        name="direct_backup_all_layers_to_page_first_direct",
        family="direct",
        torch=None,
        triton=None,
        summary="host-driven every device layer -> page-first-direct, runs of pages",
    ),
    OpInfo(
        name="quantize_nope",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        torch=None,
        triton=None,
        summary="DeepSeek-V4 nope to fp8 e4m3 with per-64 ue8m0 scales (torch arithmetic)",
    ),
    OpInfo(
        name="dequantize_nope",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        torch=None,
        triton=None,
        summary="DeepSeek-V4 fp8 nope and ue8m0 scales back to float32 (torch arithmetic)",
    ),
    OpInfo(
        name="pack_records",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        torch=_torch("deepseek_v4", "pack_records"),
        triton=_triton("deepseek_v4", "pack_records"),
        summary="quantised nope, scales and rope into 584-byte DeepSeek-V4 records",
    ),
    OpInfo(
        name="unpack_records",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        torch=_torch("deepseek_v4", "unpack_records"),
        triton=_triton("deepseek_v4", "unpack_records"),
        summary="DeepSeek-V4 records back into nope, scales and rope",
    ),
    OpInfo(
        name="write_records",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        torch=_torch("deepseek_v4", "write_records"),
        triton=_triton("deepseek_v4", "write_records"),
        summary="records into token slots of page rows (split value / scale layout)",
    ),
    OpInfo(
        name="read_records",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        torch=_torch("deepseek_v4", "read_records"),
        triton=_triton("deepseek_v4", "read_records"),
        summary="records of token slots gathered from page rows",
    ),
)

_MAMBA = f"{_PACKAGE}.mamba"

OPS += (
    OpInfo(
        name="copy_state_slots",
        family="mamba",
        module=_MAMBA,
        torch=_torch("mamba", "copy_state_slots"),
        triton=_triton("mamba", "copy_state_slots"),
        summary="Mamba state entries of every layer: slots src -> dst (overlap-safe)",
    ),
    OpInfo(
        name="gather_state_slots",
        family="mamba",
        module=_MAMBA,
        torch=_torch("mamba", "transfer_state_slots"),
        triton=_triton("mamba", "transfer_state_slots"),
        summary="Mamba state entries of slots into another state buffer (e.g. the host)",
    ),
    OpInfo(
        name="scatter_state_slots",
        family="mamba",
        module=_MAMBA,
        torch=_torch("mamba", "transfer_state_slots"),
        triton=_triton("mamba", "transfer_state_slots"),
        summary="Mamba state entries from another state buffer into slots",
    ),
)

_BY_NAME = {info.name: info for info in OPS}
if len(_BY_NAME) != len(OPS):  # dispatch caches implementations by op name
    raise RuntimeError(f"OPS repeats an op name: {sorted(info.name for info in OPS)}")


def list_ops() -> tuple[OpInfo, ...]:
    """All public ops, in documentation order."""
    return OPS


def op(name: str) -> OpInfo:
    """The catalogue entry of the op called ``name`` (``KeyError`` if there is none)."""
    return _BY_NAME[name]
