"""Griffe extension for the docs build: the packages' reST-style docstring markup as Markdown.

The docstrings use Sphinx roles (``:func:`x```, ``:class:`~a.B```, ``:mod:`.memory``) and
``::`` literal-block markers. Before mkdocstrings renders a docstring this extension rewrites

* a role whose target resolves (in the docstring's scope, through imports) to a public object of
  the documented packages into a cross-reference ``[text][full.path]``: autorefs resolves it, and
  a target that is not rendered anywhere is a warning, which fails the strict build;
* a role whose target is private (``_module``), external (``torch``) or unknown in the scope into
  inline code (it names code that the reference does not render);
* a paragraph ending in ``::`` into one ending in ``:`` (the indented block after it is a
  Markdown code block).

A target defined in a private module but re-exported by its package (every kernel op) links to
the package-level name.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")
_PACKAGES = (
    "mem_cache_kernels",
    "mem_cache_pool",
    "mem_cache_allocator",
    "mem_cache_pool_host",
    "mem_cache_refactor",
)


def _private(path: str) -> bool:
    return any(part.startswith("_") and not part.startswith("__") for part in path.split("."))


class SphinxRoles(griffe.Extension):
    """See the module docstring."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        self._walk(pkg, pkg)

    def _walk(self, obj: griffe.Object, top: griffe.Module) -> None:
        if obj.docstring is not None:
            obj.docstring.value = self._rewrite(obj.docstring.value, obj, top)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member, top)  # type: ignore[arg-type]

    def _rewrite(self, text: str, obj: griffe.Object, top: griffe.Module) -> str:
        def role(m: re.Match[str]) -> str:
            short, target = m.group(1) == "~", m.group(2)
            label = target.rsplit(".", 1)[-1] if short else target.lstrip(".")
            path = self._resolve(target, obj, top)
            if path is None:
                return f"`{label}`"
            return f"[`{label}`][{path}]"

        text = _ROLE.sub(role, text)
        return re.sub(r"(?<=\S)::$", ":", text, flags=re.MULTILINE)

    def _resolve(self, target: str, obj: griffe.Object, top: griffe.Module) -> str | None:
        """Full public path of ``target`` seen from ``obj``, or None (private/external/unknown)."""
        if target.startswith("."):  # relative module: .memory
            base = obj.module
            package = base.path if base.is_package else base.path.rsplit(".", 1)[0]
            path: str | None = f"{package}.{target.lstrip('.')}"
        elif target.split(".", 1)[0] in _PACKAGES:
            path = target
        else:
            path = self._in_scope(target, obj)
        if path is None or not path.startswith(_PACKAGES):
            return None
        if _private(path):
            return self._reexported(path, top)
        return path

    @staticmethod
    def _in_scope(target: str, obj: griffe.Object) -> str | None:
        first, _, rest = target.partition(".")
        scope: griffe.Object | None = obj
        while scope is not None:
            try:
                if first in scope.members or first in getattr(scope, "imports", {}):
                    base = scope.resolve(first)
                    return f"{base}.{rest}" if rest else base
            except griffe.NameResolutionError:
                pass
            scope = scope.parent
        return None

    @staticmethod
    def _reexported(path: str, top: griffe.Module) -> str | None:
        """``top.name`` when ``top`` re-exports the private object at ``path``."""
        name = path.rsplit(".", 1)[-1]
        member = top.members.get(name)
        if member is not None and member.is_alias and member.target_path == path:  # type: ignore[union-attr]
            return f"{top.path}.{name}"
        return None
