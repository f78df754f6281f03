"""Several threads allocate, free and transfer at once: no slot is handed out twice, every slot
is back at the end, and every transferred byte is right."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool_host import LAYOUTS, MHATokenToKVPoolHost

MakePool = Callable[..., Any]
THREADS = 4
ITERS = 25
PS = 4


class Ledger:
    """Slots currently held by any thread (checked for overlap under its own lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held: set[int] = set()

    def take(self, slots: torch.Tensor) -> None:
        new = set(slots.tolist())
        with self.lock:
            overlap = self.held & new
            assert not overlap, f"slots handed out twice: {sorted(overlap)[:8]}"
            self.held |= new

    def give(self, slots: torch.Tensor) -> None:
        with self.lock:
            self.held -= set(slots.tolist())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_concurrent_alloc_free_and_transfer(make_pool: MakePool, layout: str) -> None:
    device = make_pool("mha", torch.bfloat16, page_size=PS, size=THREADS * 8 * PS, seed=None)
    desc = device.get_buffer_desc()
    host = MHATokenToKVPoolHost(device, layout=layout, host_to_device_ratio=1.0)
    backends = ["direct"] if layout == "page_first_direct" else ["kernel"]
    if layout == "layer_first":
        backends.append("direct")
    ledger = Ledger()
    errors: list[BaseException] = []
    transfers = [0] * THREADS

    def worker(t: int) -> None:
        rng = random.Random(t)
        gen = torch.Generator().manual_seed(t)
        # this thread's device pages (page 0 is the padding page)
        my_pages = list(range(1 + t * 8, 1 + (t + 1) * 8))
        kept: list[torch.Tensor] = []
        try:
            for _ in range(ITERS):
                n_pages = rng.randint(1, 4)
                hidx = host.alloc(n_pages * PS)
                if hidx is None:  # pool momentarily full: release what we keep and retry later
                    for k in kept:
                        ledger.give(k)
                        host.free(k)
                    kept.clear()
                    continue
                ledger.take(hidx)
                pages = rng.sample(my_pages, n_pages)
                didx = (torch.tensor(pages)[:, None] * PS + torch.arange(PS)).reshape(-1)
                expect = []
                for role in desc.buffers:
                    for b in role:
                        rows = torch.randint(
                            0,
                            256,
                            (didx.numel(), b[0].numel() * 2),
                            dtype=torch.uint8,
                            generator=gen,
                        )
                        b[didx] = rows.view(b.dtype).view(-1, *b.shape[1:])
                        expect.append(rows)
                backend = rng.choice(backends)
                host.backup_from_device_all_layer(device, hidx, didx, backend)
                for role in desc.buffers:
                    for b in role:
                        b[didx] = 0
                for layer in range(desc.layer_num):
                    host.load_to_device_per_layer(device, hidx, didx, layer, backend)
                got = [
                    b[didx].reshape(didx.numel(), -1).view(torch.uint8)
                    for role in desc.buffers
                    for b in role
                ]
                for g, e in zip(got, expect):
                    assert torch.equal(g, e), "transferred bytes differ"
                transfers[t] += 1
                if rng.random() < 0.3:
                    kept.append(hidx)  # hold some slots for a while: fragmentation
                else:
                    ledger.give(hidx)
                    host.free(hidx)
            for k in kept:
                ledger.give(k)
                host.free(k)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors[0]
    assert all(n > 0 for n in transfers)
    assert not ledger.held
    assert host.available_size() == host.size  # conservation: every slot came back
    everything = host.alloc(host.size)
    assert everything is not None and torch.unique(everything).numel() == host.size
