"""Scheduler-facing capacity arithmetic shared by the allocators (private).

SGLang 0.5.23's scheduler asks the allocator, not its own type switches, how much to hold back
per request, how far to clip generation and what to evict. The functions here are pure host-side
arithmetic; :class:`EvictParams` is the eviction request a prefix cache's ``evict`` /
``evict_for_alloc`` reads (the same fields, by name, as SGLang's ``base_prefix_cache.EvictParams``:
SGLang's caches read the attributes, they never check the type).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mem_cache_kernels.checks import check_int

__all__ = [
    "EvictParams",
    "check_config",
    "check_event",
    "check_tree_cache",
    "capacity_pair",
    "evict_shortfall",
    "max_new_tokens_for_memory",
    "supports_prefix_sharing",
]


@dataclass
class EvictParams:
    """Tokens to evict per component: full-attention KV, sliding-window KV, Mamba states."""

    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


def _non_negative(name: str, value: object) -> int:
    return check_int(name, value, minimum=0)


def check_tree_cache(tree_cache: object, *methods: str, optional: bool = False) -> None:
    """``TypeError`` naming ``tree_cache`` unless it has every one of ``methods`` (callable);
    ``None`` passes when ``optional`` (no cache: nothing to evict)."""
    if tree_cache is None and optional:
        return
    missing = [m for m in methods if not callable(getattr(tree_cache, m, None))]
    if missing:
        raise TypeError(
            f"tree_cache must be a prefix cache (with {', '.join(methods)}), got "
            f"{type(tree_cache).__name__} without {', '.join(missing)}"
        )


def check_config(config: object, *fields: str) -> dict[str, int]:
    """The int ``fields`` of a resize ``config`` (``TypeError`` naming ``config`` when one is
    missing; ``TypeError``/``ValueError`` for a non-int / negative value)."""
    out: dict[str, int] = {}
    for name in fields:
        if not hasattr(config, name):
            raise TypeError(
                f"config must have {', '.join(fields)}, got {type(config).__name__} without {name}"
            )
        out[name] = check_int(f"config.{name}", getattr(config, name), minimum=0)
    return out


def check_event(event: object) -> None:
    """``TypeError`` naming ``event`` unless it is an event (``query`` / ``synchronize``)."""
    query, sync = getattr(event, "query", None), getattr(event, "synchronize", None)
    if not (callable(query) or callable(sync)):
        raise TypeError(
            f"event must be a completion event (with query() or synchronize()), got "
            f"{type(event).__name__}"
        )


def supports_prefix_sharing(tree_cache: Any) -> bool:
    """Whether ``tree_cache`` is a prefix cache that can evict (SGLang's test: not ``None`` and
    ``tree_cache.supports_prefix_sharing()``)."""
    return tree_cache is not None and bool(tree_cache.supports_prefix_sharing())


def evict_shortfall(tree_cache: Any, params: EvictParams) -> None:
    """``tree_cache.evict_for_alloc(params)`` (SGLang 0.5.23's allocation-driven eviction), or
    ``tree_cache.evict(params)`` for a cache of an older interface without it."""
    evict = getattr(tree_cache, "evict_for_alloc", None)
    if evict is None:
        evict = tree_cache.evict
    evict(params)


def max_new_tokens_for_memory(
    input_tokens: int, max_new_tokens: int, token_capacity: int, page_size: int
) -> int:
    """Generation clipped to an empty pool of ``token_capacity`` tokens: what is left after the
    prompt rounded up to whole pages, one page of decode headroom and the padding slot, at
    least 0 (SGLang's base formula)."""
    paged_input = -(-input_tokens // page_size) * page_size
    return max(0, min(max_new_tokens, token_capacity - paged_input - page_size - 1))


def capacity_pair(
    full: tuple[int, int], swa: tuple[int, int], full_capacity: int | None, swa_capacity: int | None
) -> tuple[tuple[int, int], tuple[int, int]]:
    """``((full capacity, full available), (swa capacity, swa available))``.

    The capacities are the scheduler's (its configured token capacity of each side); the
    available sizes are the allocator's own. A ``None`` capacity falls back to the allocator's
    capacity in ``full`` / ``swa``.
    """
    for name, hint in (("full_capacity", full_capacity), ("swa_capacity", swa_capacity)):
        if hint is not None:
            _non_negative(name, hint)
    return (
        (full[0] if full_capacity is None else full_capacity, full[1]),
        (swa[0] if swa_capacity is None else swa_capacity, swa[1]),
    )
