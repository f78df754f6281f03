"""The op catalogue (``_registry.OPS``) that dispatch reads: complete, and every entry resolves.

``_problems`` and ``_uncatalogued`` are the checks; each is also run on a deliberately broken
catalogue, so a check that stops finding problems fails here too.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import pytest

import mem_cache_kernels as mk
from mem_cache_kernels import _dispatch, _registry, reference
from mem_cache_kernels._registry import OPS, OpInfo

# every public submodule (the DeepSeek-V4 records module among them) is searched for ops
_PUBLIC_SUBMODULES = tuple(
    m.name for m in pkgutil.iter_modules(mk.__path__) if not m.name.startswith("_")
)


def _takes_backend(obj: object) -> bool:
    """A public op: a function with a keyword-only ``backend`` parameter."""
    if not inspect.isfunction(obj):
        return False
    param = inspect.signature(obj).parameters.get("backend")
    return param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY


def _public_ops() -> dict[str, Callable[..., Any]]:
    """``qualname -> function`` of every exported function that takes ``backend=``."""
    found: dict[str, Callable[..., Any]] = {}
    modules: list[tuple[str, ModuleType]] = [("", mk)]
    modules += [
        (f"{n}.", importlib.import_module(f"mem_cache_kernels.{n}")) for n in _PUBLIC_SUBMODULES
    ]
    for prefix, module in modules:
        for name in module.__all__:
            obj = getattr(module, name)
            if _takes_backend(obj):
                found[prefix + name] = obj
    return found


def _uncatalogued(ops: Sequence[OpInfo]) -> list[str]:
    """Public ops (``backend=`` functions) without a catalogue entry."""
    return sorted(set(_public_ops()) - {op.qualname for op in ops})


def _params(fn: Callable[..., Any]) -> list[tuple[str, Any]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


def _resolve(
    op: OpInfo, target: str, backend: str, problems: list[str]
) -> Callable[..., Any] | None:
    try:
        fn = _dispatch.load_target(target)
    except Exception as exc:  # report every kind of failure as a problem of this entry
        problems.append(f"{op.qualname}: {backend} target {target!r}: {type(exc).__name__}: {exc}")
        return None
    return fn


def _problems(ops: Sequence[OpInfo], *, triton: bool) -> list[str]:
    """Everything wrong with ``ops``: an entry that is not a public function of its module, a
    target that does not resolve to a callable, Triton and torch implementations whose
    parameters differ (``triton``: resolve Triton targets too; this imports triton)."""
    problems: list[str] = []
    for op in ops:
        try:
            module = importlib.import_module(op.module)
        except ImportError as exc:
            problems.append(f"{op.qualname}: module {op.module!r} does not import: {exc}")
            continue
        public = getattr(module, op.name, None)
        if op.name not in getattr(module, "__all__", ()) or not inspect.isfunction(public):
            problems.append(f"{op.qualname}: not a public function of {op.module}")
            continue
        if op.torch is not None and not _takes_backend(public):
            problems.append(f"{op.qualname}: dispatched, but takes no keyword-only backend")
        impls: dict[str, Callable[..., Any]] = {}
        for backend, target in (("torch", op.torch), ("triton", op.triton if triton else None)):
            if target is not None:
                fn = _resolve(op, target, backend, problems)
                if fn is not None:
                    impls[backend] = fn
        if len(impls) == 2 and _params(impls["torch"]) != _params(impls["triton"]):
            problems.append(
                f"{op.qualname}: torch and triton implementations take different parameters: "
                f"{_params(impls['torch'])} vs {_params(impls['triton'])}"
            )
        executors = [_registry.split_target(t)[2] for t in (op.torch, op.triton) if t]
        if triton and len(executors) == 2 and None not in executors:
            runs = [_dispatch.load_target(e) for e in executors if e is not None]
            if _params(runs[0]) != _params(runs[1]):
                problems.append(f"{op.qualname}: row executors take different parameters")
    return problems


# ----------------------------------------------------------------------------- completeness
def test_every_public_op_is_catalogued() -> None:
    assert _uncatalogued(OPS) == []
    assert mk.list_ops() is OPS
    public = _public_ops()
    # the package's ops and the DeepSeek-V4 record ops are found (so the check is not vacuous)
    found = {"store_kv", "alloc_extend", "deepseek_v4.pack_records", "deepseek_v4.read_records"}
    assert found <= set(public)
    assert "resolve_backend" not in public  # takes backend positionally: not an op


def test_a_missing_entry_is_caught() -> None:
    without = tuple(op for op in OPS if op.name != "write_records")
    assert _uncatalogued(without) == ["deepseek_v4.write_records"]
    without = tuple(op for op in OPS if op.name != "get_last_loc")
    assert _uncatalogued(without) == ["get_last_loc"]


def test_deepseek_v4_is_one_family() -> None:
    family = {op.qualname for op in OPS if op.family == "deepseek_v4"}
    assert family == {
        "deepseek_v4.quantize_nope",
        "deepseek_v4.dequantize_nope",
        "deepseek_v4.pack_records",
        "deepseek_v4.unpack_records",
        "deepseek_v4.write_records",
        "deepseek_v4.read_records",
    }
    assert not {op.family for op in OPS} & {"dsv4", "deepseek-v4", "DeepSeekV4"}
    assert mk.list_ops()[0].name == "alloc_extend"  # documentation order kept


# ----------------------------------------------------------------------------- resolution
def test_every_torch_target_resolves() -> None:
    assert _problems(OPS, triton=False) == []
    for op in OPS:
        if op.torch is not None:
            assert callable(_dispatch.implementation_for(op, "torch")), op.qualname


@pytest.mark.triton
@pytest.mark.usefixtures("triton_interpret")
def test_every_triton_target_resolves() -> None:
    assert _problems(OPS, triton=True) == []
    dispatched = [op for op in OPS if op.triton is not None]
    assert len(dispatched) >= 15
    for op in dispatched:
        assert callable(_dispatch.implementation_for(op, "triton")), op.qualname


def _broken() -> list[tuple[OpInfo, str]]:
    extend, store, pack = (
        _registry.op("alloc_extend"),
        _registry.op("store_kv"),
        _registry.op("pack_records"),
    )
    return [
        (dataclasses.replace(extend, torch="mem_cache_kernels._torch.alloc:no_such"), "no_such"),
        (
            dataclasses.replace(extend, torch="mem_cache_kernels._torch.nowhere:alloc_extend"),
            "nowhere",
        ),
        (dataclasses.replace(extend, name="alloc_extended"), "not a public function"),
        (dataclasses.replace(pack, module="mem_cache_kernels.reference"), "not a public function"),
        (dataclasses.replace(store, torch="mem_cache_kernels._row_ops:__all__"), "not a function"),
        (
            dataclasses.replace(store, torch="mem_cache_kernels._row_ops:store_kv(nowhere:run)"),
            "nowhere",
        ),
        (dataclasses.replace(extend, torch="mem_cache_kernels.checks:DEBUG_ENV_VAR"), "not a"),
    ]


def test_a_broken_entry_is_caught() -> None:
    for broken, needle in _broken():
        problems = _problems([broken], triton=False)
        assert len(problems) == 1 and needle in problems[0], (broken, problems)


def test_dispatch_reports_a_broken_entry() -> None:
    broken = dataclasses.replace(
        _registry.op("alloc_extend"),
        name="alloc_extend_broken",
        torch="mem_cache_kernels._torch.alloc:no_such",
    )
    with pytest.raises(RuntimeError, match=r"alloc_extend_broken: torch target .*no_such"):
        _dispatch.implementation_for(broken, "torch")
    host = _registry.op("direct_transfer_rows")
    with pytest.raises(RuntimeError, match="has no torch implementation"):
        _dispatch.implementation_for(host, "torch")


@pytest.mark.triton
@pytest.mark.usefixtures("triton_interpret")
def test_a_broken_triton_entry_is_caught() -> None:
    extend = _registry.op("alloc_extend")
    swapped = dataclasses.replace(extend, triton="mem_cache_kernels._triton.alloc:alloc_decode")
    problems = _problems([swapped], triton=True)
    assert len(problems) == 1 and "different parameters" in problems[0]
    missing = dataclasses.replace(extend, triton="mem_cache_kernels._triton.alloc:no_such")
    assert "no_such" in _problems([missing], triton=True)[0]


def test_malformed_entries_are_rejected_at_construction() -> None:
    extend = _registry.op("alloc_extend")
    with pytest.raises(ValueError, match=r"OpInfo\.triton of alloc_extend must run code under"):
        dataclasses.replace(extend, triton="mem_cache_kernels._torch.alloc:alloc_extend")
    with pytest.raises(ValueError, match="'module:function'"):
        dataclasses.replace(extend, torch="mem_cache_kernels._torch.alloc.alloc_extend")
    with pytest.raises(ValueError, match="torch of alloc_extend must be set"):
        dataclasses.replace(extend, torch=None)
    with pytest.raises(ValueError, match="module must be mem_cache_kernels"):
        dataclasses.replace(extend, module="somewhere_else")


def test_reference_module_mirrors_the_dispatched_ops() -> None:
    """``mem_cache_kernels.reference`` (the tests' oracle) has every dispatched op of the package
    with the public signature minus ``backend``."""
    for op in OPS:
        if op.torch is None or op.module != "mem_cache_kernels":
            continue
        public = list(inspect.signature(getattr(mk, op.name)).parameters)
        assert public[-1] == "backend", op.name
        assert list(inspect.signature(getattr(reference, op.name)).parameters) == public[:-1]


@pytest.mark.triton
@pytest.mark.usefixtures("triton_interpret")
def test_triton_implementations_follow_a_reimport(monkeypatch: pytest.MonkeyPatch) -> None:
    """Triton implementations are cached, but a dropped ``_triton`` module (tests decorate the
    kernels afresh that way) is imported again on the next call, never served stale."""
    for name, module in (("alloc_extend", "alloc"), ("store_kv", "rows")):
        op = _registry.op(name)
        first = _dispatch.implementation_for(op, "triton")
        assert _dispatch.implementation_for(op, "triton") is first  # cached
        full = f"mem_cache_kernels._triton.{module}"
        old = sys.modules[full]
        monkeypatch.delitem(sys.modules, full)
        again = _dispatch.implementation_for(op, "triton")
        assert again is not first and sys.modules[full] is not old, name
