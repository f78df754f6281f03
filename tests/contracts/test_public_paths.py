"""Every documented import path resolves, without a deprecation warning.

Table-driven. Each case runs in a fresh interpreter state: one helper interpreter imports torch
(allowed everywhere, and the slow part), then forks one child per case, so each case imports the
mem_cache packages into a pristine ``sys.modules`` with a pristine warnings registry.

* ``DOCUMENTED``: the public paths of the README/spec, one case per module. ``from <module> import
  <name>`` works for each name, emits no ``DeprecationWarning``, and where the package root also
  exports the name it is the same object.

Nothing has been released (every distribution is 0.1.0), so no moved name keeps a
deprecated alias at an old path: a move changes the import paths, and this table, in one commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

# (module, names): names importable from that module. A family module and its package root.
DOCUMENTED: list[tuple[str, tuple[str, ...]]] = [
    ("mem_cache_kernels", (
        "Backend", "alloc_extend", "alloc_decode", "write_req_to_token", "get_last_loc",
        "store_kv", "set_mla_kv_buffer", "get_mla_kv_buffer", "copy_all_layer_kv_cache",
        "transfer_rows", "transfer_rows_all_layers", "load_layer_from_page_first",
        "backup_all_layers_to_page_first", "direct_transfer_rows",
        "direct_load_layer_from_page_first_direct",
        "direct_backup_all_layers_to_page_first_direct", "resolve_backend",
    )),
    ("mem_cache_kernels.checks", ("check_int", "check_index", "check_tensor", "debug_enabled")),
    ("mem_cache_kernels.pages", ("extend_counts", "decode_counts", "trim_segments")),
    ("mem_cache_kernels.dispatch", ("TABLE", "pick", "resolve_backend")),
    ("mem_cache_pool", (
        "ReqToTokenPool", "KVCache", "KVWriteLoc", "KVBufferDesc", "LayerReadyWaiter",
        "storage_dtype", "FP8_DTYPES", "MHATokenToKVPool", "MLATokenToKVPool",
        "DSATokenToKVPool", "HiSparseDSATokenToKVPool", "BaseSWAKVPool", "SWAKVPool",
    )),
    ("mem_cache_pool.base", (
        "KVCache", "KVWriteLoc", "KVBufferDesc", "LayerReadyWaiter", "storage_dtype", "FP8_DTYPES",
    )),
    ("mem_cache_pool.req_to_token", ("ReqToTokenPool",)),
    ("mem_cache_pool.mha", ("MHATokenToKVPool",)),
    ("mem_cache_pool.mla", ("MLATokenToKVPool",)),
    ("mem_cache_pool.dsa", ("DSATokenToKVPool",)),
    ("mem_cache_pool.hisparse", ("HiSparseDSATokenToKVPool",)),
    ("mem_cache_pool.swa", ("BaseSWAKVPool", "SWAKVPool")),
    ("mem_cache_allocator", (
        "BaseTokenToKVPoolAllocator", "TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator",
    )),
    ("mem_cache_allocator.base", ("BaseTokenToKVPoolAllocator",)),
    ("mem_cache_allocator.token", ("TokenToKVPoolAllocator",)),
    ("mem_cache_allocator.paged", ("PagedTokenToKVPoolAllocator",)),
    ("mem_cache_allocator.page_allocator", ("PageAllocatorCore", "PageAllocatorState")),
    ("mem_cache_allocator.swa", ("SWATokenToKVPoolAllocator",)),
    ("mem_cache_allocator.mamba", ("MambaSlotAllocator",)),
    ("mem_cache_allocator.hisparse", ("HiSparseTokenToKVPoolAllocator",)),
    ("mem_cache_pool_host", (
        "HostTensorAllocator", "HostKVCache", "MHATokenToKVPoolHost", "MLATokenToKVPoolHost",
        "LayerDoneCounter", "HiSparseHostPoolMixin",
    )),
    ("mem_cache_pool_host.base", ("HostKVCache",)),
    ("mem_cache_pool_host.mha", ("MHATokenToKVPoolHost",)),
    ("mem_cache_pool_host.mla", ("MLATokenToKVPoolHost",)),
]

# Modules that are documented as import targets themselves.
DOCUMENTED_MODULES: list[str] = ["mem_cache_allocator.testing", "mem_cache_pool.deepseek_v4"]

_RUNNER = textwrap.dedent(
    r"""
    import importlib, json, os, sys, traceback, warnings
    import torch  # allowed everywhere; imported once, before forking

    def resolve(case):
        kind = case[0]
        warnings.simplefilter("always")
        if kind == "module":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                importlib.import_module(case[1])
            dep = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
            assert not dep, f"importing {case[1]} warned: {dep}"
            return
        if kind == "documented":
            _, module, names = case
            problems = []
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                mod = importlib.import_module(module)
                objs = {}
                for name in names:
                    try:
                        objs[name] = getattr(mod, name)
                    except AttributeError:
                        problems.append(f"{module} has no attribute {name}")
            dep = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
            if dep:
                problems.append(f"{module}: DeprecationWarning {dep}")
            root = importlib.import_module(module.split(".")[0])
            for name, obj in objs.items():
                if module != root.__name__ and name in getattr(root, "__all__", ()):
                    if getattr(root, name) is not obj:
                        problems.append(f"{root.__name__}.{name} is not {module}.{name}")
            assert not problems, "; ".join(problems)
            return
        raise ValueError(f"unknown case kind {kind!r}")

    results = []
    for case in json.loads(sys.argv[1]):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            try:
                resolve(case)
                message = ""
            except BaseException:
                message = traceback.format_exc(limit=3)
            os.write(write_fd, message.encode())
            os._exit(0)
        os.close(write_fd)
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
        os.close(read_fd)
        _, status = os.waitpid(pid, 0)
        error = b"".join(chunks).decode()
        if status != 0 and not error:
            error = f"child exited with status {status}"
        results.append(error)
    print(json.dumps(results))
    """
)


def _cases() -> list[tuple[str, list[Any]]]:
    cases: list[tuple[str, list[Any]]] = []
    cases += [(m, ["documented", m, list(names)]) for m, names in DOCUMENTED]
    cases += [(m, ["module", m]) for m in DOCUMENTED_MODULES]
    return cases


CASES = _cases()


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps([c for _, c in CASES])],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    errors: list[str] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {case_id: err for (case_id, _), err in zip(CASES, errors, strict=True)}


@pytest.mark.parametrize("case_id", [c for c, _ in CASES])
def test_public_path(case_id: str, results: dict[str, Any]) -> None:
    error = results[case_id]
    assert not error, f"{case_id}:\n{error}"


def test_table_is_not_empty_and_has_no_duplicates() -> None:
    ids = [c for c, _ in CASES]
    assert len(ids) == len(set(ids))
    assert sum(len(names) for _, names in DOCUMENTED) > 50
