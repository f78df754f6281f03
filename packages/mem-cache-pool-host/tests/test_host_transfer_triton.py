"""The "kernel" IO backend through the kernels' Triton path (TRITON_INTERPRET=1 on CPU).

Runs in a subprocess: Triton reads TRITON_INTERPRET when kernels are first decorated, and
MEM_CACHE_KERNELS_BACKEND=triton makes every kernel op take its Triton implementation. The host
buffers of ``page_first`` are strided per layer, which is what this checks end to end.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import torch
    from mem_cache_pool import MHATokenToKVPool, MLATokenToKVPool
    from mem_cache_kernels import resolve_backend
    from mem_cache_pool_host import MHATokenToKVPoolHost, MLATokenToKVPoolHost

    assert resolve_backend("auto", torch.empty(1)) == "triton"

    cases = ((MHATokenToKVPool, MHATokenToKVPoolHost, (2, 8)),
             (MLATokenToKVPool, MLATokenToKVPoolHost, (16, 8)))
    for dev_cls, host_cls, dims in cases:
        for layout in ("layer_first", "page_first"):
            dev = dev_cls(16, 4, torch.bfloat16, *dims, 2, "cpu")
            desc = dev.get_buffer_desc()
            gen = torch.Generator().manual_seed(0)
            for role in desc.buffers:
                for b in role:
                    raw = b.view(torch.uint8)
                    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
            orig = [[b.clone() for b in role] for role in desc.buffers]
            host = host_cls(dev, layout=layout)
            hidx = torch.tensor([12, 13, 14, 15, 4, 5, 6, 7])
            didx = torch.tensor([8, 9, 10, 11, 4, 5, 6, 7])
            host.backup_from_device_all_layer(dev, hidx, didx, "kernel")
            for role in desc.buffers:
                for b in role:
                    b.view(torch.uint8).zero_()
            tgt = torch.tensor([16, 17, 18, 19, 4, 5, 6, 7])
            for layer in range(2):
                host.load_to_device_per_layer(dev, hidx, tgt, layer, "kernel")
            for r in range(len(desc.roles)):
                for layer in range(2):
                    got = desc.buffers[r][layer][tgt].view(torch.uint8)
                    want = orig[r][layer][didx].view(torch.uint8)
                    assert torch.equal(got, want), (host_cls.__name__, layout, r, layer)
    print("OK")
    """
)


@pytest.mark.triton
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_kernel_io_through_triton_interpreter_is_bit_exact() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1", MEM_CACHE_KERNELS_BACKEND="triton")
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("OK")
