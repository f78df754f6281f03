"""Kernel-backed allocator methods under the Triton interpreter (tiny sizes, one subprocess).

``TRITON_INTERPRET`` is read when Triton first launches a kernel, so the run happens in a fresh
interpreter with ``MEM_CACHE_KERNELS_BACKEND=triton`` and ``TRITON_INTERPRET=1``; its results
must equal the torch backend's, computed in this process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.triton,
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed"),
]

SCRIPT = r"""
import json, torch
from mem_cache_allocator import PagedTokenToKVPoolAllocator
from mem_cache_allocator.swa import SWATokenToKVPoolAllocator
from mem_cache_allocator.hisparse import HiSparseTokenToKVPoolAllocator

t = lambda *v: torch.tensor(v, dtype=torch.int64)
res = {}
a = PagedTokenToKVPoolAllocator(64, 4, torch.float16, "cpu", None, debug=True)
res["paged_prefix"] = a.alloc_extend(t(0), t(0), t(2), t(2), t(-1), 2).tolist()
res["paged_extend"] = a.alloc_extend(t(0, 2), t(0, 2), t(5, 11), t(5, 11), t(-1, 5), 14).tolist()
res["paged_decode"] = a.alloc_decode(t(6, 12), t(6, 12), t(12, 22)).tolist()
res["paged_decode_new_page"] = a.alloc_decode(t(7, 13), t(7, 13), t(13, 23)).tolist()
s = SWATokenToKVPoolAllocator(32, 32, 2, torch.float16, "cpu", None)
x = s.alloc_extend(t(0), t(0), t(3), t(3), t(-1), 3)
res["swa_extend"] = x.tolist()
res["swa_decode"] = s.alloc_decode(t(4), t(4), x[-1:]).tolist()
h = HiSparseTokenToKVPoolAllocator(16, 2, torch.float16, "cpu", None)
y = h.alloc_extend(t(0), t(0), t(3), t(3), t(-1), 3)
res["hisparse_extend"] = y.tolist()
res["hisparse_decode"] = h.alloc_decode(t(4), t(4), y[-1:]).tolist()
res["hisparse_logical_only"] = h.alloc_logical_only(t(0), t(0), t(3), t(3), t(-1), 3).tolist()
print(json.dumps(res))
"""


def _run(env_extra: dict[str, str]) -> dict[str, list[int]]:
    env = {**os.environ, **env_extra}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict[str, list[int]] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_alloc_kernel_methods_under_triton_interpreter() -> None:
    triton = _run({"MEM_CACHE_KERNELS_BACKEND": "triton", "TRITON_INTERPRET": "1"})
    torch_ref = _run({"MEM_CACHE_KERNELS_BACKEND": "torch"})
    assert triton == torch_ref
    assert triton["paged_prefix"] == [4, 5]
    assert triton["paged_extend"] == [8, 9, 10, 11, 12, 6, 7, 16, 17, 18, 19, 20, 21, 22]
    assert triton["paged_decode"] == [13, 23]
    assert triton["paged_decode_new_page"] == [14, 24]
