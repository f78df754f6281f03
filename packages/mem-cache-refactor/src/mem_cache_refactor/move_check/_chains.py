"""The ``eager_forbidden`` contracts of a tree, checked in-process at both refs: which
import-time chains the change added and which were already there."""

from __future__ import annotations

import configparser
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mem_cache_refactor._chain_diff import classify_chains
from mem_cache_refactor._eager import (
    EagerChain,
    EagerIndex,
)
from mem_cache_refactor._locate import Locator, unresolved_modules
from mem_cache_refactor.move_check._probe import import_linter_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "EagerResult",
    "EagerSpec",
    "check_eager_contracts",
    "read_eager_contracts",
]

_CONTRACT_CLASS = "EagerForbiddenContract"


@dataclass(frozen=True, slots=True)
class EagerSpec:
    """One ``eager_forbidden`` contract of an import-linter configuration."""

    name: str
    sources: tuple[str, ...]
    forbidden: tuple[str, ...]
    exempt: tuple[str, ...] = ()
    as_packages: bool = True


@dataclass(frozen=True, slots=True)
class EagerResult:
    """The verdict on one eager contract: ``errors`` (modules it cannot see), the chains the
    change added (``new``) and those already in the base tree (``existing``), each as
    ``{"source", "forbidden", "summary", "hops": [[file, line, text], ...]}``."""

    name: str
    errors: tuple[str, ...]
    new: tuple[dict[str, Any], ...]
    existing: tuple[dict[str, Any], ...]

    @property
    def broken_by_change(self) -> bool:
        return bool(self.errors or self.new)

    @property
    def broken(self) -> bool:
        return bool(self.errors or self.new or self.existing)


def _list(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        items = value.replace(",", "\n").splitlines()
    elif isinstance(value, list):
        items = [str(v) for v in value]
    else:
        items = []
    return tuple(s.strip() for s in items if s.strip() and not s.strip().startswith(("#", ";")))


def _bool(value: Any, default: bool = True) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        return value.strip().lower() in ("1", "true", "yes", "on")
    return default


def _eager_aliases(types: Iterable[str]) -> set[str]:
    aliases = set()
    for entry in types:
        alias, _, path = entry.partition(":")
        if path.strip().rpartition(".")[2] == _CONTRACT_CLASS:
            aliases.add(alias.strip())
    return aliases


def read_eager_contracts(tree: Path) -> tuple[tuple[str, ...], list[EagerSpec]]:
    """``(root_packages, eager contracts)`` of the import-linter configuration of ``tree``
    (``.importlinter``, ``setup.cfg`` or ``pyproject.toml``); empty when there is none."""
    config = import_linter_config(tree)
    if config is None:
        return (), []
    text = (tree / config).read_text(encoding="utf-8", errors="replace")
    session: dict[str, Any]
    contracts: list[dict[str, Any]]
    if config == "pyproject.toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            return (), []
        session = dict(data.get("tool", {}).get("importlinter", {}))
        contracts = [c for c in session.pop("contracts", []) if isinstance(c, dict)]
    else:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(text)
        except configparser.Error:
            return (), []
        session = dict(parser["importlinter"]) if parser.has_section("importlinter") else {}
        contracts = [dict(parser[s]) for s in parser.sections()
                     if s.startswith("importlinter:contract:")]
    roots = _list(session.get("root_packages", "")) or _list(session.get("root_package", ""))
    aliases = _eager_aliases(_list(session.get("contract_types", "")))
    specs = [
        EagerSpec(
            name=str(c.get("name", "")).strip(),
            sources=_list(c.get("source_modules", "")),
            forbidden=_list(c.get("forbidden_modules", "")),
            exempt=_list(c.get("exempt_modules", "")),
            as_packages=_bool(c.get("as_packages")),
        )
        for c in contracts
        if str(c.get("type", "")).strip() in aliases
    ]
    return roots, specs


def _chain_json(chain: EagerChain) -> dict[str, Any]:
    return {
        "source": chain.source,
        "forbidden": chain.forbidden,
        "summary": chain.summary(),
        "hops": [
            [h.file, h.line_number,
             h.line_contents if h.line_number else
             f"importing {h.importer} runs its package {h.imported} first"]
            for h in chain.hops
        ],
    }


def check_eager_contracts(
    tree_a: Path, roots_a: list[Path], tree_b: Path, roots_b: list[Path],
    moved_from: dict[str, set[str]],
) -> list[EagerResult]:
    """Each eager contract of ``tree_b``'s configuration, checked on both trees (module files
    from the trees' source ``roots``, then this interpreter's ``sys.path`` for installed
    external modules)."""
    packages_b, specs = read_eager_contracts(tree_b)
    if not specs:
        return []
    packages_a, _ = read_eager_contracts(tree_a)
    index_b = EagerIndex(Locator([*roots_b, *sys.path], packages_b), display_base=tree_b)
    index_a = EagerIndex(Locator([*roots_a, *sys.path], packages_a or packages_b),
                         display_base=tree_a)
    results: list[EagerResult] = []
    for spec in specs:
        errors = unresolved_modules(index_b.locator, spec.sources, spec.forbidden)
        if errors:
            results.append(EagerResult(spec.name, tuple(errors), (), ()))
            continue
        new, existing = classify_chains(
            index_b, index_a, spec.sources, spec.forbidden, spec.exempt,
            as_packages=spec.as_packages, moved_from=moved_from,
        )
        results.append(EagerResult(
            spec.name, (), tuple(_chain_json(c) for c in new),
            tuple(_chain_json(c) for c in existing),
        ))
    return results
