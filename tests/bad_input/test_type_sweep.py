"""Every public function and method, called with hostile values for its arguments.

Generated over the API snapshots (``_api.public_callables``): a new public function or method
is swept automatically, and one whose class the suite cannot build fails
``test_every_callable_is_covered`` until it gets a factory (``_subjects.OWNERS``) or a reasoned
exemption. Each call passes the same hostile value for every required argument (the first
optional one when none is required): a list instead of a tensor, an arbitrary object, a tensor
on the meta device, a float tensor. Expected: ``TypeError`` or ``ValueError`` whose message names
one of the callable's arguments, and no change to the object's state (every tensor and scalar
reachable from it, compared before and after).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.bad_input._api import public_callables
from tests.bad_input._subjects import EXEMPT_OWNERS, OWNERS, same_state, snapshot
from tests.bad_input._xfail import XFAIL

# callables the sweep does not call, with the reason
EXEMPT_FUNCTIONS: dict[str, str] = {
    "mem_cache_kernels.reference:*": "documented unvalidated oracle (library code uses the op)",
    "mem_cache_kernels._torch.*": "documented unvalidated oracle (mem_cache_kernels.reference)",
    "mem_cache_allocator.testing:*": "hypothesis state-machine builders (test helpers)",
    "mem_cache_allocator._testing_hisparse:*": "hypothesis state-machine builder re-exported by "
    "mem_cache_allocator.testing (test helper)",
    "mem_cache_kernels.checks:*": "the validators themselves: each raises on a bad *value* "
    "by design (packages/mem-cache-kernels/tests/test_checks.py) and takes the argument *name* "
    "from library code",
    "mem_cache_kernels.pages:extend_counts": "page arithmetic for callers that validated the "
    "lengths' kinds at their own public method (allocators, kernel ops: swept there); it checks "
    "the values it reads, 0 <= prefix <= seq (packages/mem-cache-kernels/tests/test_checks.py)",
    "mem_cache_kernels.pages:decode_counts": "page arithmetic for callers that validated the "
    "lengths' kinds at their own public method (allocators, kernel ops: swept there); it checks "
    "the values it reads, seq >= 1 (packages/mem-cache-kernels/tests/test_checks.py)",
    "mem_cache_pool_host.registration:register_chunked": "needs a registrar (CUDA)",
    "mem_cache_pool_host.memory:MmapHostTensorAllocator.allocate": "SGLang's allocate(dims, "
    "dtype, device): the sweep's list [1, 2] is a valid shape (it allocates); bad dims/dtype/"
    "device are rows of packages/mem-cache-pool-host/tests/test_host_error_rule.py",
    "mem_cache_pool_host.memory:HostTensorAllocator.allocate": "abstract base (SGLang's "
    "HostTensorAllocator): a valid shape reaches allocate_bytes, which subclasses implement; bad "
    "dims/dtype/device are rows of packages/mem-cache-pool-host/tests/test_host_error_rule.py",
    "mem_cache_pool_host.memory:HostTensorAllocator.allocate_bytes": "abstract: raises "
    "NotImplementedError for every input (MmapHostTensorAllocator implements it and is swept)",
    "mem_cache_pool.deepseek_v4:DeepSeekV4TokenToKVPool.clear_c4_req_states": "SGLang 0.5.23's "
    "returns before reading its argument unless the unified KV layout is on (not provided): "
    "every input is accepted and nothing changes, as in SGLang (packages/mem-cache-pool/tests/"
    "test_pool_deepseek_v4_sglang.py, tests/sglang/test_deepseek_v4_pool.py)",
    "mem_cache_pool.deepseek_v4:DeepSeekV4TokenToKVPool.unified_rope_region_buffers": "SGLang "
    "0.5.23's returns None before reading its argument unless unified_fp8 is on (ours then "
    "raises NotImplementedError): every input is accepted, as in SGLang (same tests)",
}


class _Arbitrary:
    def __repr__(self) -> str:
        return "<arbitrary object>"


HOSTILE: dict[str, Callable[[], object]] = {
    "list": lambda: [1, 2],
    "object": _Arbitrary,
    "meta": lambda: torch.tensor([1, 2], device="meta"),
    "float": lambda: torch.tensor([1.5, 2.5]),
}


def _exempt_function(key: str) -> str | None:
    for pattern, why in EXEMPT_FUNCTIONS.items():
        if (pattern.endswith("*") and key.startswith(pattern[:-1])) or key == pattern:
            return why
    return None


def _owner(key: str) -> str | None:
    module, qual = key.split(":")
    return f"{module}:{qual.rsplit('.', 1)[0]}" if "." in qual else None


def _resolve(key: str) -> tuple[Callable[..., Any], Any]:
    """(callable, owner instance or None)."""
    module, qual = key.split(":")
    owner_key = _owner(key)
    if owner_key is None:
        return getattr(importlib.import_module(module), qual), None
    obj = OWNERS[owner_key]()
    return getattr(obj, qual.rsplit(".", 1)[1]), obj


def _sweep_keys() -> list[str]:
    keys = []
    for key, takes_input in sorted(public_callables().items()):
        if not takes_input or _exempt_function(key):
            continue
        owner = _owner(key)
        if owner is not None and owner in EXEMPT_OWNERS:
            continue
        keys.append(key)
    return keys


def test_every_callable_is_covered() -> None:
    """A public callable that takes input is swept, or exempt with a reason."""
    missing = sorted(
        key for key in _sweep_keys() if _owner(key) is not None and _owner(key) not in OWNERS
    )
    assert not missing, f"no factory in _subjects.OWNERS (or exemption) for: {missing}"
    swept = set(_sweep_keys())
    stale = [k for k in XFAIL if not k.startswith("case:") and k.split("[")[0] not in swept]
    assert not stale, f"XFAIL entries for callables no longer swept: {stale}"


def _cases() -> list[Any]:
    out = []
    for key in _sweep_keys():
        for kind in HOSTILE:
            case_id = f"{key}[{kind}]"
            reason = XFAIL.get(case_id) or XFAIL.get(key)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(key, kind, id=case_id, marks=marks))
    return out


#: deprecated aliases: swept like the rest, their DeprecationWarning asserted (not printed)
DEPRECATED_ALIASES = frozenset({"free_unaligned"})


def _expect_deprecation(key: str) -> contextlib.AbstractContextManager[object]:
    if key.rsplit(".", 1)[-1] in DEPRECATED_ALIASES:
        return pytest.warns(DeprecationWarning, match="is deprecated")
    return contextlib.nullcontext()


@pytest.mark.parametrize(("key", "kind"), _cases())
def test_hostile_arguments_raise_naming_one(key: str, kind: str) -> None:
    fn, owner = _resolve(key)
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    required = [p for p in params if p.default is p.empty]
    chosen = required or params[:1]
    args = {p.name: HOSTILE[kind]() for p in chosen}
    before = snapshot(owner) if owner is not None else None
    positional = [args[p.name] for p in chosen if p.kind is not p.KEYWORD_ONLY]
    keywords = {p.name: args[p.name] for p in chosen if p.kind is p.KEYWORD_ONLY}
    try:
        with _expect_deprecation(key):
            fn(*positional, **keywords)
    except NotImplementedError as exc:  # documented "<Class> does not support X" only
        if owner is None or type(owner).__name__ not in str(exc):
            raise
        if owner is not None:
            assert same_state(before, snapshot(owner)), "a failed call changed the state"
        return
    except (TypeError, ValueError) as exc:
        error: Exception = exc
    else:
        pytest.fail(f"accepted {kind} arguments {list(args)}")
    names = [p.name for p in params]
    message = str(error)
    assert any(re.search(rf"\b{re.escape(n)}\b", message) for n in names), (
        f"{type(error).__name__}: {message!r} names none of {names}"
    )
    if owner is not None:
        assert same_state(before, snapshot(owner)), "a failed call changed the object's state"
