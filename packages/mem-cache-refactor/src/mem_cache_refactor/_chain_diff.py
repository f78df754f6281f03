"""New and existing import-time chains: which chains of the new tree a change added, and which
the base tree already had (a hop is old when the base tree ran it, through moved definitions
too)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from mem_cache_refactor._eager import (
    EagerChain,
    EagerIndex,
    Hop,
    drop_tails,
    path_to,
    reached_targets,
    shortest_tree,
)
from mem_cache_refactor._locate import within

__all__ = ["classify_chains"]


def _origins(index_a: EagerIndex, moved_from: dict[str, set[str]], module: str) -> set[str]:
    """The modules of the base tree that ``module`` stands for: itself when it exists there
    (an external module always does) and the modules its moved definitions came from."""
    found = set(moved_from.get(module, ()))
    loc = index_a.locator
    if not loc.is_internal(module) or loc.locate(module) is not None:
        found.add(module)
    return found


def classify_chains(
    index_b: EagerIndex,
    index_a: EagerIndex,
    sources: Iterable[str],
    forbidden: Iterable[str],
    exempt: Iterable[str] = (),
    *,
    as_packages: bool = True,
    moved_from: dict[str, set[str]] | None = None,
) -> tuple[list[EagerChain], list[EagerChain]]:
    """The import-time chains of the new tree (``index_b``), split into those the change added
    and those that already existed in the base tree (``index_a``): ``(new, existing)``.

    A hop is old when the base tree has it: the importer (or the module its definitions moved
    from, ``moved_from``: new module -> old modules) ran the imported module (or the module
    that one's definitions came from) at import time, or both stand for the same old module (a
    split file importing its own parts). The existing chains are the shortest ones through old
    hops only. Each hop the change added (from a module the entry point loads) that leads to a
    forbidden module through modules the entry point did not load before gives a new chain
    through it, even where the contract was already broken: so a re-export that adds a second
    route to the kernels is reported, while a new hop into a module that was loaded anyway is
    not a new chain.
    """
    sources, forbidden, exempt = list(sources), list(forbidden), list(exempt)
    moved = moved_from or {}
    old_cache: dict[tuple[str, str], bool] = {}

    def is_old(hop: Hop) -> bool:
        key = (hop.importer, hop.imported)
        if key not in old_cache:
            left = _origins(index_a, moved, hop.importer)
            right = _origins(index_a, moved, hop.imported)
            old_cache[key] = bool(left & right) or any(
                h.imported in right for mu in left for h in index_a.edges(mu)
            )
        return old_cache[key]

    def old_tree(source: str) -> dict[str, Hop | None]:
        """Breadth-first predecessors from the source through hops that are all old."""
        via: dict[str, Hop | None] = {source: None}
        queue = deque([source])
        while queue:
            module = queue.popleft()
            for hop in index_b.hops(module, forbidden):
                if hop.imported in via or not is_old(hop):
                    continue
                if module == source and not hop.line_number and within(hop.imported, sources):
                    continue
                via[hop.imported] = hop
                if not within(hop.imported, forbidden):
                    queue.append(hop.imported)
        return via

    old_trees: dict[str, dict[str, Hop | None]] = {}

    def old_reach(source: str) -> set[str]:
        """The modules the source loads through hops that are all old."""
        if source not in old_trees:
            old_trees[source] = old_tree(source)
        return set(old_trees[source])

    def old_chains(source: str) -> dict[str, list[Hop]]:
        via = old_trees.get(source) or old_tree(source)
        return {t: path_to(via, t) for t in reached_targets(via, source, forbidden)}

    def tails_from(start: str, blocked: set[str]) -> dict[str, list[Hop]]:
        """Shortest routes from ``start`` to each forbidden module, not through a module the
        source loaded before the change (a forbidden module itself may be reached again)."""
        if within(start, forbidden):
            return {start: []}
        via: dict[str, Hop | None] = {start: None}
        queue = deque([start])
        while queue:
            module = queue.popleft()
            for hop in index_b.hops(module, forbidden):
                target = hop.imported
                if target in via or (target in blocked and not within(target, forbidden)):
                    continue
                via[target] = hop
                if not within(target, forbidden):
                    queue.append(target)
        return {t: path_to(via, t) for t in reached_targets(via, start, forbidden)}

    new: dict[tuple[str, str, tuple[Hop, ...]], EagerChain] = {}
    existing: list[EagerChain] = []
    for source in index_b.entry_points(sources, exempt, forbidden, as_packages):
        via = shortest_tree(index_b, source, sources, exempt, forbidden)
        before = old_reach(source)
        for target, old_hops in old_chains(source).items():
            existing.append(EagerChain(source, target, tuple(old_hops)))
        for module in list(via):
            if within(module, forbidden):
                continue
            for hop in index_b.hops(module, forbidden):
                if is_old(hop) or (hop.imported in before and not within(hop.imported,
                                                                            forbidden)):
                    continue  # an old hop, or a new route to a module loaded anyway
                if module == source and not hop.line_number and within(hop.imported, sources):
                    continue  # the enclosing package is an entry point of its own
                head = [*path_to(via, module), hop]
                for target, tail in tails_from(hop.imported, before).items():
                    hops = tuple(head + tail)
                    if len({h.imported for h in hops}) < len(hops):
                        continue  # runs in a circle: the chain is found the other way round
                    new.setdefault((source, target, hops), EagerChain(source, target, hops))
    return drop_tails(list(new.values())), drop_tails(existing)
