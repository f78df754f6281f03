"""The catalogue of public ops: documentation metadata (name, family, summary, module, backends).

Every public op has one :class:`OpInfo` in :data:`OPS`, returned by
:func:`mem_cache_kernels.list_ops`. The catalogue only *describes* the ops; it dispatches nothing:
the functions that run are the rows of :data:`mem_cache_kernels.dispatch.TABLE` (a test checks
that the two agree). This module imports nothing but the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OPS", "OpInfo", "list_ops"]

_PACKAGE = "mem_cache_kernels"
_BOTH = ("torch", "triton")


@dataclass(frozen=True, slots=True, kw_only=True)
class OpInfo:
    """One public op of :mod:`mem_cache_kernels` (documentation metadata)."""

    name: str
    """Function name in ``module``."""
    family: str
    """Op family: ``alloc``, ``req_table``, ``store``, ``move``, ``transfer``, ``direct``,
    ``deepseek_v4`` or ``mamba``."""
    summary: str
    """One line."""
    module: str = _PACKAGE
    """Public module that exports the op (``mem_cache_kernels`` or a public submodule)."""
    backends: tuple[str, ...] = ()
    """The backends with an implementation of their own: ``("torch", "triton")`` for an op of
    :data:`mem_cache_kernels.dispatch.TABLE`; ``()`` for an op whose public function is its only
    implementation, the same on every backend (the host-driven ``direct_*`` copies, the
    DeepSeek-V4 quantisation arithmetic; ``backend``, where it takes one, is only validated)."""

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"OpInfo.name must be an identifier, got {self.name!r}")
        if self.module != _PACKAGE and not self.module.startswith(_PACKAGE + "."):
            raise ValueError(f"OpInfo.module must be {_PACKAGE} or under it, got {self.module!r}")
        if self.backends not in ((), _BOTH):
            raise ValueError(
                f"OpInfo.backends of {self.name} must be () or {_BOTH}, got {self.backends!r}"
            )

    @property
    def qualname(self) -> str:
        """``name`` for an op of the package itself, ``submodule.name`` for one of a public
        submodule (e.g. ``deepseek_v4.pack_records``)."""
        if self.module == _PACKAGE:
            return self.name
        return f"{self.module.removeprefix(_PACKAGE + '.')}.{self.name}"


def _two(name: str, family: str, summary: str) -> OpInfo:
    """An op of the package with a torch and a Triton implementation."""
    return OpInfo(name=name, family=family, summary=summary, backends=_BOTH)


_DEEPSEEK_V4 = f"{_PACKAGE}.deepseek_v4"
_MAMBA = f"{_PACKAGE}.mamba"

OPS: tuple[OpInfo, ...] = (
    OpInfo(
        name="alloc_extend",
        family="alloc",
        backends=_BOTH,
        summary="slots for an extend batch (partial page, whole pages, trailing page)",
    ),
    OpInfo(
        name="alloc_decode",
        family="alloc",
        backends=_BOTH,
        summary="one slot per request for a decode step",
    ),
    OpInfo(
        name="write_req_to_token",
        family="req_table",
        backends=_BOTH,
        summary="prefix and new slots into each request's req_to_token row",
    ),
    OpInfo(
        name="get_last_loc",
        family="req_table",
        backends=_BOTH,
        summary="slot of the last prefix token per request (-1 for an empty prefix)",
    ),
    _two("store_kv", "store", "K and V rows into the caches at loc (cast to the storage dtype)"),
    _two(
        "set_mla_kv_buffer",
        "store",
        "MLA nope and rope parts into a latent row without concatenating",
    ),
    _two("get_mla_kv_buffer", "store", "gather MLA rows back as separate nope and rope tensors"),
    OpInfo(
        name="copy_all_layer_kv_cache",
        family="move",
        backends=_BOTH,
        summary="move rows src_loc -> tgt_loc in every buffer (overlap-safe)",
    ),
    _two("transfer_rows", "transfer", "one layer, layer-first <-> layer-first rows per role"),
    _two(
        "transfer_rows_all_layers",
        "transfer",
        "every layer, layer-first <-> layer-first rows per role",
    ),
    _two("load_layer_from_page_first", "transfer", "host page-first -> one device layer"),
    _two("backup_all_layers_to_page_first", "transfer", "every device layer -> host page-first"),
    OpInfo(
        name="direct_transfer_rows",
        family="direct",
        summary="host-driven layer-first copies, one per run of consecutive rows",
    ),
    OpInfo(
        name="direct_load_layer_from_page_first_direct",
        family="direct",
        summary="host-driven page-first-direct -> one device layer, runs of pages",
    ),
    OpInfo(
        name="direct_backup_all_layers_to_page_first_direct",
        family="direct",
        summary="host-driven every device layer -> page-first-direct, runs of pages",
    ),
    OpInfo(
        name="quantize_nope",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        summary="DeepSeek-V4 nope to fp8 e4m3 with per-64 ue8m0 scales (torch arithmetic)",
    ),
    OpInfo(
        name="dequantize_nope",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        summary="DeepSeek-V4 fp8 nope and ue8m0 scales back to float32 (torch arithmetic)",
    ),
    OpInfo(
        name="pack_records",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        backends=_BOTH,
        summary="quantised nope, scales and rope into 584-byte DeepSeek-V4 records",
    ),
    OpInfo(
        name="unpack_records",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        backends=_BOTH,
        summary="DeepSeek-V4 records back into nope, scales and rope",
    ),
    OpInfo(
        name="write_records",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        backends=_BOTH,
        summary="records into token slots of page rows (split value / scale layout)",
    ),
    OpInfo(
        name="read_records",
        family="deepseek_v4",
        module=_DEEPSEEK_V4,
        backends=_BOTH,
        summary="records of token slots gathered from page rows",
    ),
)

OPS += (
    OpInfo(
        name="copy_state_slots",
        family="mamba",
        module=_MAMBA,
        backends=_BOTH,
        summary="Mamba state entries of every layer: slots src -> dst (overlap-safe)",
    ),
    OpInfo(
        name="gather_state_slots",
        family="mamba",
        module=_MAMBA,
        backends=_BOTH,
        summary="Mamba state entries of slots into another state buffer (e.g. the host)",
    ),
    OpInfo(
        name="scatter_state_slots",
        family="mamba",
        module=_MAMBA,
        backends=_BOTH,
        summary="Mamba state entries from another state buffer into slots",
    ),
)

_BY_NAME = {info.name: info for info in OPS}
if len(_BY_NAME) != len(OPS):
    raise RuntimeError(f"OPS repeats an op name: {sorted(info.name for info in OPS)}")


def list_ops() -> tuple[OpInfo, ...]:
    """All public ops, in documentation order."""
    return OPS
