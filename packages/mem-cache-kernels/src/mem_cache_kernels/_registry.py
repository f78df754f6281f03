"""The catalogue of public ops: name, family and which backends implement each."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OPS", "OpInfo", "list_ops"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OpInfo:
    """One public op of :mod:`mem_cache_kernels`."""

    name: str
    """Function name, exported from ``mem_cache_kernels``."""
    family: str
    """Op family: ``alloc``, ``req_table``, ``store``, ``move``, ``transfer`` or ``direct``."""
    triton_module: str | None
    """``mem_cache_kernels._triton.<module>`` with its Triton launcher (None: host-driven).

    ``rows`` for the ``store`` and ``transfer`` families: their bodies are shared by both
    backends and run on the row-copy launcher ``rows.run_jobs``."""
    summary: str
    """One line."""


OPS: tuple[OpInfo, ...] = (
    OpInfo(
        name="alloc_extend",
        family="alloc",
        triton_module="alloc",
        summary="slots for an extend batch (partial page, whole pages, trailing page)",
    ),
    OpInfo(
        name="alloc_decode",
        family="alloc",
        triton_module="alloc",
        summary="one slot per request for a decode step",
    ),
    OpInfo(
        name="write_req_to_token",
        family="req_table",
        triton_module="req_table",
        summary="prefix and new slots into each request's req_to_token row",
    ),
    OpInfo(
        name="get_last_loc",
        family="req_table",
        triton_module="req_table",
        summary="slot of the last prefix token per request (-1 for an empty prefix)",
    ),
    OpInfo(
        name="store_kv",
        family="store",
        triton_module="rows",
        summary="K and V rows into the caches at loc (cast to the storage dtype)",
    ),
    OpInfo(
        name="set_mla_kv_buffer",
        family="store",
        triton_module="rows",
        summary="MLA nope and rope parts into a latent row without concatenating",
    ),
    OpInfo(
        name="get_mla_kv_buffer",
        family="store",
        triton_module="rows",
        summary="gather MLA rows back as separate nope and rope tensors",
    ),
    OpInfo(
        name="copy_all_layer_kv_cache",
        family="move",
        triton_module="move",
        summary="move rows src_loc -> tgt_loc in every buffer (overlap-safe)",
    ),
    OpInfo(
        name="transfer_rows",
        family="transfer",
        triton_module="rows",
        summary="one layer, layer-first <-> layer-first rows per role",
    ),
    OpInfo(
        name="transfer_rows_all_layers",
        family="transfer",
        triton_module="rows",
        summary="every layer, layer-first <-> layer-first rows per role",
    ),
    OpInfo(
        name="load_layer_from_page_first",
        family="transfer",
        triton_module="rows",
        summary="host page-first -> one device layer",
    ),
    OpInfo(
        name="backup_all_layers_to_page_first",
        family="transfer",
        triton_module="rows",
        summary="every device layer -> host page-first",
    ),
    OpInfo(
        name="direct_transfer_rows",
        family="direct",
        triton_module=None,
        summary="host-driven layer-first copies, one per run of consecutive rows",
    ),
    OpInfo(
        name="direct_load_layer_from_page_first_direct",
        family="direct",
        triton_module=None,
        summary="host-driven page-first-direct -> one device layer, runs of pages",
    ),
    OpInfo(
        name="direct_backup_all_layers_to_page_first_direct",
        family="direct",
        triton_module=None,
        summary="host-driven every device layer -> page-first-direct, runs of pages",
    ),
)


def list_ops() -> tuple[OpInfo, ...]:
    """All public ops, in documentation order."""
    return OPS
