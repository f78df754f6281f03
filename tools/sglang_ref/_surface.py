"""Public class surfaces: SGLang's read from its source with ``ast``, ours by inspection.

A *surface* maps each public member name to a :class:`Member`: a method (with its parameter
list), a property, or an attribute (a class-level assignment, or ``self.X = ...`` in any method).
Members inherited from base classes in the same source tree are included; the nearest definition
wins, as in Python's MRO. Names starting with ``_`` are private and left out, except
``__init__``, whose parameters are the constructor's.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["method", "property", "attribute"]


@dataclass(frozen=True)
class Param:
    """One parameter: its name, how it binds, and whether it has a default."""

    name: str
    kind: Literal["positional", "keyword", "var_positional", "var_keyword"]
    has_default: bool


@dataclass(frozen=True)
class Member:
    """One public member of a class surface (``params`` is empty unless ``kind == 'method'``)."""

    name: str
    kind: Kind
    params: tuple[Param, ...] = ()
    owner: str = ""


def _is_public(name: str) -> bool:
    return name == "__init__" or not name.startswith("_")


def _params_of(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[Param, ...]:
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    n_defaults = len(a.defaults)
    out: list[Param] = []
    for i, arg in enumerate(positional):
        out.append(Param(arg.arg, "positional", i >= len(positional) - n_defaults))
    if a.vararg is not None:
        out.append(Param(a.vararg.arg, "var_positional", True))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append(Param(arg.arg, "keyword", default is not None))
    if a.kwarg is not None:
        out.append(Param(a.kwarg.arg, "var_keyword", True))
    is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in fn.decorator_list)
    return tuple(out if is_static else out[1:])


def _decorator_names(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names: set[str] = set()
    for d in fn.decorator_list:
        if isinstance(d, ast.Name):
            names.add(d.id)
        elif isinstance(d, ast.Attribute):
            names.add(d.attr)
    return names


def _own_members(cls: ast.ClassDef, owner: str) -> dict[str, Member]:
    members: dict[str, Member] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            decorators = _decorator_names(node)
            if "setter" in decorators or "deleter" in decorators:
                continue
            kind: Kind = "property" if decorators & {"property", "cached_property"} else "method"
            params = _params_of(node) if kind == "method" else ()
            if _is_public(node.name):
                members[node.name] = Member(node.name, kind, params, owner)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and _is_public(target.id):
                    members.setdefault(target.id, Member(target.id, "attribute", (), owner))
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and _is_public(node.target.id)):
                members.setdefault(node.target.id, Member(node.target.id, "attribute", (), owner))
    for sub in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = list(sub.targets)
        elif isinstance(sub, (ast.AnnAssign, ast.AugAssign)):
            targets = [sub.target]
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                        and t.value.id == "self" and not t.attr.startswith("_")):
                    members.setdefault(t.attr, Member(t.attr, "attribute", (), owner))
    return members


class SourceTree:
    """SGLang's source, parsed lazily per module, for class surfaces by name."""

    def __init__(self, root: Path) -> None:
        self._root = root  # the folder that holds ``sglang/``
        self._modules: dict[str, ast.Module] = {}

    def module(self, name: str) -> ast.Module | None:
        if name not in self._modules:
            rel = Path(*name.split("."))
            for path in (self._root / rel.with_suffix(".py"), self._root / rel / "__init__.py"):
                if path.is_file():
                    self._modules[name] = ast.parse(path.read_text(), str(path))
                    break
            else:
                return None
        return self._modules[name]

    def _find_class(self, module: str, name: str,
                    depth: int = 0) -> tuple[str, ast.ClassDef] | None:
        tree = self.module(module)
        if tree is None or depth > 8:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return module, node
        for sub in ast.walk(tree):  # re-exports and imports, also under try/if
            if isinstance(sub, ast.ImportFrom) and sub.module and sub.level == 0:
                for alias in sub.names:
                    if (alias.asname or alias.name) == name and sub.module.startswith("sglang"):
                        return self._find_class(sub.module, alias.name, depth + 1)
        return None

    def surface(self, module: str, name: str) -> dict[str, Member]:
        """Every public member of ``module.name`` and of its bases in the tree (MRO order)."""
        found = self._find_class(module, name)
        if found is None:
            raise ValueError(f"class {module}.{name} not found in the SGLang source")
        mod, cls = found
        result: dict[str, Member] = {}
        for base in reversed(cls.bases):
            base_name = base.id if isinstance(base, ast.Name) else (
                base.attr if isinstance(base, ast.Attribute) else None)
            if base_name is None:
                continue
            if self._find_class(mod, base_name) is not None:
                result.update(self.surface(mod, base_name))
        result.update(_own_members(cls, f"{mod}.{name}"))
        return result


def _runtime_params(fn: object) -> tuple[Param, ...]:
    kinds = {
        inspect.Parameter.POSITIONAL_ONLY: "positional",
        inspect.Parameter.POSITIONAL_OR_KEYWORD: "positional",
        inspect.Parameter.VAR_POSITIONAL: "var_positional",
        inspect.Parameter.KEYWORD_ONLY: "keyword",
        inspect.Parameter.VAR_KEYWORD: "var_keyword",
    }
    try:
        sig = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return (Param("args", "var_positional", True), Param("kwargs", "var_keyword", True))
    params = list(sig.parameters.values())
    return tuple(
        Param(p.name, kinds[p.kind], p.default is not inspect.Parameter.empty  # type: ignore[arg-type]
              or p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD))
        for p in params
    )


def our_surface(cls: type) -> dict[str, Member]:
    """Our class's public members: inspected (methods, properties, class attributes) plus the
    ``self.X`` attributes assigned in the source of every class of its MRO that is ours."""
    members: dict[str, Member] = {}
    for klass in reversed(cls.__mro__):
        if not klass.__module__.startswith("mem_cache_"):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        text = inspect.cleandoc("\n" + source) if source[:1].isspace() else source
        node = ast.parse(text).body[0]
        if isinstance(node, ast.ClassDef):
            for name, m in _own_members(node, klass.__qualname__).items():
                if m.kind == "attribute":
                    members[name] = m
    for name in dir(cls):
        if not _is_public(name):
            continue
        raw = inspect.getattr_static(cls, name)
        if isinstance(raw, (property,)) or type(raw).__name__ == "cached_property":
            members[name] = Member(name, "property")
        elif isinstance(raw, staticmethod):
            members[name] = Member(name, "method", _runtime_params(raw.__func__))
        elif isinstance(raw, classmethod):
            members[name] = Member(name, "method", _runtime_params(getattr(cls, name)))
        elif inspect.isfunction(raw):
            members[name] = Member(name, "method", _runtime_params(raw)[1:])
        elif name not in members:
            members[name] = Member(name, "attribute")
    return members
