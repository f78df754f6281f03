"""``HostKVCache.io_guard``: closing a pool while a raw-pointer user (a storage copy on another
thread) holds the guard defers the release of its memory to the last user."""

from __future__ import annotations

import pytest
import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost


def _host() -> MHATokenToKVPoolHost:
    dev = MHATokenToKVPool(32, 4, torch.bfloat16, 2, 8, 2, "cpu")
    return MHATokenToKVPoolHost(dev, 2.0, 0, 4, "page_first", pin_memory=False)


def test_close_under_the_guard_defers_the_release_to_the_last_user() -> None:
    host = _host()
    allocations = list(host._allocations)
    with host.io_guard(), host.io_guard():
        host.close()
        assert host._closed and host.buffers == ()
        assert all(not a.closed for a in allocations), "memory released under an in-flight copy"
    assert all(a.closed for a in allocations)
    assert host._allocations == []


def test_guard_after_close_raises_and_close_without_users_releases_at_once() -> None:
    host = _host()
    allocations = list(host._allocations)
    host.close()
    assert all(a.closed for a in allocations)
    with pytest.raises(RuntimeError, match="closed"), host.io_guard():
        pass
    host.close()  # idempotent
