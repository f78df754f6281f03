"""Issue 29: a public call reaches its bytes through at most five of our modules.

Counted at run time by ``tools/module_chain.py`` (``python3 tools/dev chain``): the second call of
each path under a profile hook, every thread, every Python function of ``packages/*/src``. The five
are the public method's module, the shared checks, dispatch, the backend module and one shared
layout helper at most.
"""

from __future__ import annotations

import pytest

from tools import module_chain

MOST = 5


@pytest.fixture(scope="module")
def rows() -> dict[str, list[str]]:
    return {row["path"]: row["chain"] for row in module_chain.measure()}


def test_the_four_paths_are_measured(rows: dict[str, list[str]]) -> None:
    assert len(rows) == 4
    for chain in rows.values():
        assert chain, "a path ran none of our modules: the hook saw nothing"


@pytest.mark.parametrize(
    "path",
    [
        "MHATokenToKVPool.set_kv_buffer",
        "PagedTokenToKVPoolAllocator.alloc_extend + free",
        "MHATokenToKVPoolHost.backup_from_device_all_layer",
        "StorageController.prefetch",
    ],
)
def test_at_most_five_modules(rows: dict[str, list[str]], path: str) -> None:
    chain = rows[path]
    assert len(chain) <= MOST, f"{path}: {len(chain)} modules: {' -> '.join(chain)}"


def test_the_hook_counts_modules_it_enters() -> None:
    """The yardstick itself: a call into two of our modules is counted as two."""
    import torch

    from mem_cache_kernels import checks, pages

    chain = module_chain.trace(
        lambda: pages.extend_counts(torch.tensor([0]), torch.tensor([checks.check_int("n", 3)]), 4)
    )
    assert chain == ["mem_cache_kernels.checks", "mem_cache_kernels.pages"]
