"""An engine process for the Mooncake tests: writes or reads seeded pages through the backend.

``python _mooncake_worker.py write|read|exists MASTER METADATA LAYOUTS SEED NPAGES [PREFIX]``

(``LAYOUTS``: comma-separated host layouts, one host pool and backend each.)

It builds its own host pool whose buffers hold bytes derived from SEED, so a reader knows what
a writer stored without ever seeing it. ``write`` stores NPAGES pages (keys ``PREFIX{i}``) with
``batch_set_v1``; ``read`` loads them into *other* host slots with ``batch_get_v1`` and compares
every byte; ``exists`` prints ``batch_exists``. The last line printed is a JSON result.
"""

from __future__ import annotations

import json
import sys

import torch

from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost
from mem_cache_storage.config import HiCacheStorageConfig
from mem_cache_storage.mooncake import HiCacheMooncake

PAGE = 16


def make_host(layout: str, seed: int) -> MHATokenToKVPoolHost:
    dev = MHATokenToKVPool(64 * PAGE, PAGE, torch.bfloat16, 2, 8, 3, "cpu")
    host = MHATokenToKVPoolHost(dev, host_to_device_ratio=2.0, layout=layout, pin_memory=False)
    gen = torch.Generator().manual_seed(seed)
    for buf in host.buffers:
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return host


def expected_pages(layout: str, seed: int, n: int) -> tuple[MHATokenToKVPoolHost, torch.Tensor,
                                                            list[torch.Tensor]]:
    host = make_host(layout, seed)
    idx = host.alloc(n * PAGE)
    assert idx is not None
    pages = [host.get_data_page(int(idx[i * PAGE])).view(torch.uint8).clone() for i in range(n)]
    return host, idx, pages


def run_layout(role: str, *, master: str, metadata: str, layout: str, seed: int, n: int,
               prefix: str) -> dict[str, object]:
    host, idx, pages = expected_pages(layout, seed, n)
    cfg = HiCacheStorageConfig(model_name=f"xproc-{layout}", extra_config={
        "master_server_address": master, "metadata_server": metadata})
    backend = HiCacheMooncake(cfg, host)
    keys = [f"{prefix}{i}" for i in range(n)]
    result: dict[str, object] = {"connected": backend.connected}
    if role == "write":
        result["ok"] = backend.batch_set_v1(keys, idx)
    elif role == "exists":
        result["exists"] = backend.batch_exists(keys)
    else:
        other = host.alloc(n * PAGE)
        assert other is not None
        for buf in host.buffers:  # the reader's own pages hold other bytes
            buf.view(torch.uint8)[:] = 0
        ok = backend.batch_get_v1(keys, other)
        exact = [
            torch.equal(host.get_data_page(int(other[i * PAGE])).view(torch.uint8), pages[i])
            for i in range(n)
        ]
        result["ok"] = ok
        result["exact"] = exact
        result["wrong"] = sum(o and not e for o, e in zip(ok, exact))
    backend.close()
    return result


def main(argv: list[str]) -> int:
    role, master, metadata, layouts, seed_s, n_s = argv[:6]
    prefix = argv[6] if len(argv) > 6 else "xp"
    out = {layout: run_layout(role, master=master, metadata=metadata, layout=layout,
                              seed=int(seed_s), n=int(n_s), prefix=prefix)
           for layout in layouts.split(",")}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
