"""The Mooncake backend's output is honest: the client's own log lines stay off stderr unless
``verbose``, and every write the store refused ("BatchPut failed ... insufficient space") is
counted in ``get_stats().set_refused`` (and a page that stayed unstored in ``set_failed``).

The engine runs in a child process so that the test sees the client library's stderr (it writes
to file descriptor 2, below Python)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tools.mooncake.store import LocalMooncakeStore

CHILD = r"""
import json, sys, torch
from mem_cache_pool import MHATokenToKVPool
from mem_cache_pool_host import MHATokenToKVPoolHost
from mem_cache_storage import HiCacheStorageConfig, create_backend, page_hashes
opts = json.loads(sys.argv[1])
ps = 16
dev = MHATokenToKVPool(64, ps, torch.bfloat16, 4, 64, 8, "cpu")
host = MHATokenToKVPoolHost(dev, host_size_bytes=200 * ps * dev.get_buffer_desc().bytes_per_token,
                            layout="page_first", pin_memory=False)
b = create_backend("mooncake", HiCacheStorageConfig(model_name="honest"), host, **opts)
n = 192  # 24 MiB of pages into a 16 MiB store whose fresh objects are leased (10 s):
    # some writes must be refused
ok = b.batch_set_v1(page_hashes(list(range(n * ps)), ps), host.alloc(n * ps))
s = b.get_stats()
print("RESULT", json.dumps({"ok": sum(ok), "set_ok": s.set_ok, "set_failed": s.set_failed,
                            "set_refused": s.set_refused}))
b.close()
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_refused_writes_are_counted_and_client_logs_are_quiet(verbose: bool) -> None:
    with LocalMooncakeStore(segment_bytes=16 << 20) as store:
        opts = {**store.client_options(), "verbose": verbose}
        proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(opts)],
                              capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    r = json.loads(line.removeprefix("RESULT "))
    assert r["ok"] == r["set_ok"] and r["set_ok"] + r["set_failed"] == 192
    assert r["set_failed"] > 0 and r["set_refused"] >= r["set_failed"], r  # counted, not hidden
    refused_lines = proc.stderr.count("insufficient space")
    if verbose:  # the client's own (glog) lines are shown; which ones depends on timing and load
        glog = re.search(r"^[IWEF]\d{8} |InitGoogleLogging|client_service\.cpp", proc.stderr,
                         re.MULTILINE)
        assert refused_lines > 0 or glog is not None, proc.stderr[-2000:]
    else:
        assert refused_lines == 0, proc.stderr[-2000:]
        assert " client_service.cpp" not in proc.stderr  # no client info/warning lines
