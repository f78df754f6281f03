"""``help()`` shows a contract for every public method of every SGLang-named class.

A method has a docstring of its own or inherits one (the nearest class of the MRO that defines
the name and documents it, as ``inspect.getdoc`` does, so an override of a documented base method
passes). The classes are the ones the SGLang parity check
mirrors (tools/sglang_ref/parity.py), so a class added there is covered here too.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

from tools.sglang_ref.parity import CLASSES


def _cls(spec: str) -> type:
    module, _, name = spec.partition(":")
    obj = getattr(importlib.import_module(module), name)
    assert isinstance(obj, type)
    return obj


def _inherited_doc(cls: type, name: str) -> str | None:
    for klass in cls.__mro__:
        raw = vars(klass).get(name)
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        doc = getattr(raw, "__doc__", None) if raw is not None else None
        if isinstance(raw, property):
            doc = raw.__doc__ or (raw.fget.__doc__ if raw.fget else None)
        if doc and doc.strip():
            return doc
    return None


def undocumented(cls: type) -> list[str]:
    """Public methods and properties of ``cls`` (ours, not object's) with no docstring."""
    missing: list[str] = []
    for name in dir(cls):
        if name.startswith("_") and name != "__init__":
            continue
        raw = inspect.getattr_static(cls, name)
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None or not owner.__module__.startswith("mem_cache_"):
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            raw = raw.__func__
        if isinstance(raw, property) or inspect.isfunction(raw):
            if name == "__init__":
                continue  # the class docstring documents construction
            if not _inherited_doc(cls, name):
                missing.append(name)
    return missing


@pytest.mark.parametrize("spec", sorted(CLASSES))
def test_every_public_method_has_a_contract(spec: str) -> None:
    cls = _cls(spec)
    assert inspect.getdoc(cls), f"{spec} has no class docstring"
    missing = undocumented(cls)
    assert not missing, f"{spec}: no docstring (own or inherited) on {', '.join(missing)}"


def test_the_check_sees_an_undocumented_method() -> None:
    class Documented:
        def f(self) -> None:
            """A contract."""

    class Sub(Documented):
        def f(self) -> None:
            pass

        def g(self) -> None:
            pass

    Sub.__module__ = "mem_cache_probe"
    assert undocumented(Sub) == ["g"]
