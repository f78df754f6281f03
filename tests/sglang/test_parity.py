"""Every public member of every SGLang 0.5.23 class we mirror exists here, compatibly."""

from __future__ import annotations

import pytest

from tools.sglang_ref import parity
from tools.sglang_ref._surface import Member, Param
from tools.sglang_ref._wheel import WheelUnavailable, ensure_wheel


@pytest.fixture(scope="module")
def reports() -> list[parity.ClassReport]:
    try:
        ensure_wheel()
    except WheelUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    return parity.check()


def test_every_mirrored_class_has_sglangs_surface(reports: list[parity.ClassReport]) -> None:
    print("\n" + parity.render(reports))
    bad = [r for r in reports if not r.ok]
    assert not bad, parity.render(bad)


def test_the_surface_reader_sees_inherited_members(reports: list[parity.ClassReport]) -> None:
    by_name = {r.ours.split(":")[-1]: r for r in reports}
    # alloc / free are defined on SGLang's base allocator, not on the paged class itself
    paged = by_name["PagedTokenToKVPoolAllocator"]
    assert {"alloc", "free", "available_size"} <= set(paged.covered) | set(paged.excepted)
    assert paged.members > 30


def _m(*params: Param) -> Member:
    return Member("f", "method", params)


P = Param


@pytest.mark.parametrize(("theirs", "ours", "problem"), [
    (_m(P("a", "positional", False)), _m(P("a", "positional", False)), None),
    (_m(P("a", "positional", False)), _m(P("b", "positional", False)), "positional parameter 1"),
    (_m(P("a", "positional", True)), _m(P("a", "positional", False)), "optional in SGLang's"),
    (_m(P("a", "positional", False)), _m(), "'a' is missing"),
    (_m(), _m(P("x", "positional", False)), "ours requires 'x'"),
    (_m(), _m(P("x", "positional", True)), None),
    (_m(P("k", "keyword", True)), _m(P("kw", "var_keyword", True)), None),
    (_m(P("k", "keyword", True)), _m(), "keyword 'k' is missing"),
    (_m(P("args", "var_positional", True), P("kw", "var_keyword", True)),
     _m(P("x", "positional", False)), None),
    (_m(P("a", "positional", False), P("args", "var_positional", True)),
     _m(P("a", "positional", False)), "takes *args"),
    (Member("p", "property"), Member("p", "method"), "ours a method"),
    (Member("p", "method"), Member("p", "property"), "ours a property"),
    (Member("p", "attribute"), Member("p", "property"), None),
])
def test_signature_rules(theirs: Member, ours: Member, problem: str | None) -> None:
    got = parity.signature_problem(theirs, ours)
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got
