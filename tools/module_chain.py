"""How many of our modules one public call runs through, counted at run time.

For each of the four paths of issue 29 (a pool store, a page allocation + free, a host backup of
every layer, a storage prefetch) this builds small CPU objects, makes the call once to warm every
lazy import and cache, then makes it a second time under a profile hook (``sys.setprofile`` and
``threading.setprofile``, so the storage controller's I/O thread is seen too) and records, in call
order, every module of ``packages/*/src`` whose Python functions ran. C functions (torch ops) and
the standard library are not counted: the figure is the number of our files a reader follows from
the public method to the bytes.

``python3 tools/dev chain`` prints one row per path (``--json FILE`` writes them too); exit 0.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from tools.cli import OneLineParser

ROOT = Path(__file__).resolve().parent.parent
_SRC_MARK = "/src/mem_cache_"


def _module_of(filename: str) -> str | None:
    at = filename.find(_SRC_MARK)
    if at < 0:
        return None
    rel = filename[at + len("/src/") :]
    if rel.endswith("/__init__.py"):
        rel = rel[: -len("/__init__.py")]
    elif rel.endswith(".py"):
        rel = rel[:-3]
    return rel.replace("/", ".")


def trace(call: Callable[[], object]) -> list[str]:
    """Our modules ``call()`` runs through, in first-entered order (all threads)."""
    seen: dict[str, None] = {}
    lock = threading.Lock()

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        mod = _module_of(frame.f_code.co_filename)
        if mod is not None and mod not in seen:
            with lock:
                seen.setdefault(mod, None)

    threading.setprofile(hook)
    sys.setprofile(hook)
    try:
        call()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return list(seen)


def _paths() -> dict[str, Callable[[], object]]:
    import torch

    from mem_cache_allocator import PagedTokenToKVPoolAllocator
    from mem_cache_pool import MHATokenToKVPool
    from mem_cache_pool_host import MHATokenToKVPoolHost
    from mem_cache_storage import HiCacheMemory, HiCacheStorageConfig, page_hashes
    from mem_cache_storage.controller import StorageController

    ps = 4
    dev = MHATokenToKVPool(256, ps, torch.bfloat16, 2, 8, 2, "cpu")
    loc = torch.arange(8, 40, dtype=torch.int64)
    k = torch.randn(loc.numel(), 2, 8, dtype=torch.bfloat16)
    layer = type("Layer", (), {"layer_id": 1})()

    alloc = PagedTokenToKVPoolAllocator(256, ps, torch.bfloat16, "cpu", dev, need_sort=False)
    prefix = torch.tensor([0, 0], dtype=torch.int64)
    seq = torch.tensor([5, 9], dtype=torch.int64)
    last = torch.tensor([-1, -1], dtype=torch.int64)

    def alloc_free() -> None:
        out = alloc.alloc_extend(prefix, prefix.clone(), seq, seq.clone(), last, 14)
        if out is None:
            raise RuntimeError("alloc_extend ran out of pages in a 256-slot pool")
        alloc.free(out)

    host = MHATokenToKVPoolHost(dev, 2.0, 0, ps, "page_first", pin_memory=False)
    h_idx = torch.arange(0, 32, dtype=torch.int64)
    d_idx = torch.arange(32, 64, dtype=torch.int64)

    # The controller's I/O thread starts on its first prefetch, and only a thread started under
    # the hook is traced: the warm call uses one controller, the measured call a second one.
    keys = page_hashes(list(range(8 * ps)), ps)
    controllers = []
    for _ in range(2):
        host_pool = MHATokenToKVPoolHost(dev, 2.0, 0, ps, "page_first", pin_memory=False)
        ctrl = StorageController(HiCacheMemory(HiCacheStorageConfig(model_name="chain")), host_pool)
        written = ctrl.write(keys, torch.arange(0, 8 * ps, dtype=torch.int64))
        if written.written != len(keys):
            raise RuntimeError(f"storage wrote {written.written} of {len(keys)} pages")
        controllers.append((ctrl, host_pool))

    def prefetch() -> None:
        ctrl, host_pool = controllers.pop(0)
        result = ctrl.prefetch(keys).wait(30.0)
        if result.pages != len(keys):
            raise RuntimeError(
                f"prefetch got {result.pages} of {len(keys)} pages ({result.status})"
            )
        host_pool.free(result.host_indices)

    return {
        "MHATokenToKVPool.set_kv_buffer": lambda: dev.set_kv_buffer(layer, loc, k, k),
        "PagedTokenToKVPoolAllocator.alloc_extend + free": alloc_free,
        "MHATokenToKVPoolHost.backup_from_device_all_layer": lambda: (
            host.backup_from_device_all_layer(dev, h_idx, d_idx)
        ),
        "StorageController.prefetch": prefetch,
    }


def measure() -> list[dict[str, Any]]:
    rows = []
    for name, call in _paths().items():
        call()  # warm: lazy imports, dispatch caches
        chain = trace(call)
        rows.append({"path": name, "modules": len(chain), "chain": chain})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="tools/dev chain", description=__doc__.split("\n")[0])
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rows = measure()
    for row in rows:
        print(f"{row['modules']:3d}  {row['path']}")
        print("       " + " -> ".join(row["chain"]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
