"""The op catalogue (``_registry.OPS``, documentation) and the dispatch table
(``dispatch.TABLE``, what runs): complete, and in agreement.

``_problems`` and ``_uncatalogued`` are the checks; each is also run on a deliberately broken
catalogue or table, so a check that stops finding problems fails here too.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType
from typing import Any

import pytest
import torch

import mem_cache_kernels as mk
from mem_cache_kernels import dispatch, reference
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


Table = Mapping[str, tuple[Callable[..., Any], Callable[[], Callable[..., Any]]]]


def _home(fn: Callable[..., Any]) -> str:
    """Where ``fn`` is implemented: a function's module; for a row op body of ``_layout`` bound
    to a backend's executor (``functools.partial(body, run_jobs)``), the executor's module."""
    if (
        isinstance(fn, functools.partial)
        and inspect.isfunction(fn.func)
        and fn.func.__module__ == "mem_cache_kernels._layout"
        and len(fn.args) == 1
        and not fn.keywords
        and inspect.isfunction(fn.args[0])
        and fn.args[0].__name__ == "run_jobs"
    ):
        return str(fn.args[0].__module__)
    return str(fn.__module__) if inspect.isfunction(fn) else ""


def _problems(ops: Sequence[OpInfo], table: Table, *, triton: bool) -> list[str]:
    """Everything wrong with ``ops`` and ``table``: an entry that is not a public function of
    its module, a catalogue that disagrees with the table about which ops have backends, a torch
    implementation outside ``_torch`` (a Triton one outside ``_triton``), Triton and torch
    implementations whose parameters differ (``triton``: load the Triton ones too; this imports
    triton)."""
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
        if bool(op.backends) != (op.name in table):
            problems.append(
                f"{op.qualname}: backends {op.backends} but table row: {op.name in table}"
            )
            continue
        if not op.backends:
            continue
        if not _takes_backend(public):
            problems.append(f"{op.qualname}: dispatched, but takes no keyword-only backend")
        torch_fn, load_triton_fn = table[op.name]
        if not _home(torch_fn).startswith("mem_cache_kernels._torch."):
            problems.append(f"{op.qualname}: torch implementation {torch_fn!r} is not in _torch")
            continue
        if triton:
            try:
                triton_fn = load_triton_fn()
            except Exception as exc:  # report every kind of failure as a problem of this row
                problems.append(f"{op.qualname}: triton loader: {type(exc).__name__}: {exc}")
                continue
            if not _home(triton_fn).startswith("mem_cache_kernels._triton."):
                problems.append(
                    f"{op.qualname}: triton implementation {triton_fn!r} not in _triton"
                )
            elif _params(torch_fn) != _params(triton_fn):
                problems.append(
                    f"{op.qualname}: torch and triton implementations take different parameters: "
                    f"{_params(torch_fn)} vs {_params(triton_fn)}"
                )
    names = {op.name for op in ops}
    problems += [
        f"{name}: a table row without a catalogue entry" for name in table if name not in names
    ]
    return problems


def _op(name: str) -> OpInfo:
    return next(op for op in OPS if op.name == name)


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
def test_catalogue_and_table_agree() -> None:
    assert _problems(OPS, dispatch.TABLE, triton=False) == []
    assert len(dispatch.TABLE) >= 15
    for name, (torch_fn, _) in dispatch.TABLE.items():
        assert dispatch.pick(name, "torch", torch.zeros(1)) is torch_fn


def test_single_implementation_ops_pick_their_body_on_every_backend() -> None:
    """``dispatch.SINGLE``: public ops with one implementation (catalogued with no backends),
    whose trusted body ``pick`` returns for every backend, and which the public op runs."""
    by_name = {op.name: op for op in OPS}
    assert set(dispatch.SINGLE) == {
        "direct_load_layer_from_page_first_direct",
        "direct_backup_all_layers_to_page_first_direct",
    }
    for name, body in dispatch.SINGLE.items():
        assert by_name[name].backends == () and name not in dispatch.TABLE, name
        assert body.__module__ == "mem_cache_kernels._torch.rows", name
        for backend in ("auto", "torch", "triton"):
            assert dispatch.pick(name, backend, torch.zeros(1)) is body, (name, backend)
        public = getattr(mk, name)
        assert body.__name__ in public.__code__.co_names, name  # the op's own trusted body
    with pytest.raises(ValueError, match="op must name a kernel op"):
        dispatch.pick("direct_transfer_rows", "torch")  # its body is TABLE's torch column


@pytest.mark.triton
@pytest.mark.usefixtures("triton_interpret")
def test_every_triton_row_loads() -> None:
    assert _problems(OPS, dispatch.TABLE, triton=True) == []
    for name, (_, load_triton_fn) in dispatch.TABLE.items():
        assert dispatch.pick(name, "triton", torch.zeros(1)) is load_triton_fn(), name


def test_a_broken_catalogue_or_table_is_caught() -> None:
    extend, pack = _op("alloc_extend"), _op("pack_records")
    row = dispatch.TABLE["alloc_extend"]
    cases: list[tuple[Sequence[OpInfo], Table, str]] = [
        ([dataclasses.replace(extend, name="alloc_extended")], {}, "not a public function"),
        ([dataclasses.replace(pack, module="mem_cache_kernels.reference")], {}, "not a public"),
        ([extend], {}, "table row: False"),
        ([dataclasses.replace(extend, backends=())], {"alloc_extend": row}, "table row: True"),
        ([extend], {"alloc_extend": (reference.store_kv, row[1])}, "not in _torch"),
        ([extend], {"alloc_extend": row, "nowhere": row}, "nowhere: a table row without"),
    ]
    for ops, tab, needle in cases:
        problems = _problems(ops, tab, triton=False)
        assert len(problems) == 1 and needle in problems[0], (ops, problems)


def test_pick_rejects_an_unknown_op() -> None:
    with pytest.raises(ValueError, match=r"op must name a kernel op .* got 'no_such_op'"):
        dispatch.pick("no_such_op", "torch", torch.zeros(1))
    with pytest.raises(ValueError, match="direct_transfer_rows"):  # one implementation: no row
        dispatch.pick("direct_transfer_rows", "torch", torch.zeros(1))
    with pytest.raises(TypeError, match="op must be a str naming a kernel op, got list"):
        dispatch.pick([1, 2], "torch", torch.zeros(1))  # type: ignore[arg-type]


@pytest.mark.triton
@pytest.mark.usefixtures("triton_interpret")
def test_a_broken_triton_row_is_caught() -> None:
    extend = _op("alloc_extend")
    torch_fn, _ = dispatch.TABLE["alloc_extend"]
    swapped = {"alloc_extend": (torch_fn, dispatch.TABLE["alloc_decode"][1])}
    problems = _problems([extend], swapped, triton=True)
    assert len(problems) == 1 and "different parameters" in problems[0]

    def missing() -> Callable[..., Any]:
        raise ImportError("no_such")

    assert "no_such" in _problems([extend], {"alloc_extend": (torch_fn, missing)}, triton=True)[0]


def test_malformed_entries_are_rejected_at_construction() -> None:
    extend = _op("alloc_extend")
    with pytest.raises(ValueError, match=r"OpInfo\.backends of alloc_extend must be"):
        dataclasses.replace(extend, backends=("triton",))
    with pytest.raises(ValueError, match="module must be mem_cache_kernels"):
        dataclasses.replace(extend, module="somewhere_else")
    with pytest.raises(ValueError, match="name must be an identifier"):
        dataclasses.replace(extend, name="not an id")


def test_reference_module_mirrors_the_dispatched_ops() -> None:
    """``mem_cache_kernels.reference`` (the tests' oracle) has every dispatched op of the package
    with the public signature minus ``backend``."""
    for op in OPS:
        if not op.backends or op.module != "mem_cache_kernels":
            continue
        public = list(inspect.signature(getattr(mk, op.name)).parameters)
        assert public[-1] == "backend", op.name
        assert list(inspect.signature(getattr(reference, op.name)).parameters) == public[:-1]


@pytest.mark.triton
@pytest.mark.usefixtures("triton_interpret")
def test_triton_implementations_follow_a_reimport(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dropped ``_triton`` module (tests decorate the kernels afresh that way) is imported
    again on the next call, never served stale."""
    cpu = torch.zeros(1)
    for name, module in (("alloc_extend", "alloc"), ("store_kv", "rows")):
        first = dispatch.pick(name, "triton", cpu)
        assert dispatch.pick(name, "triton", cpu) is first  # the same module: the same function
        full = f"mem_cache_kernels._triton.{module}"
        old = sys.modules[full]
        monkeypatch.delitem(sys.modules, full)
        again = dispatch.pick(name, "triton", cpu)
        assert again is not first and sys.modules[full] is not old, name
        assert _home(again) == full
