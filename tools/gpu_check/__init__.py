"""GPU check: every GPU figure the kernels and host pools promise, in one command.

On a CUDA machine (run from the repository root; needs only a Python with torch and triton,
e.g. the H200 image's ``python3``)::

    python3 tools/dev gpu-check --json $OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.log

(``$OUT`` is any folder; without ``--json`` the JSON goes to ``bench-results/gpu_check.json``.)
It finishes in about 5.5 minutes (``--budget``, default 330 s, Triton's first compiles
included), prints one table and exits 0 when everything passed, 1 on any mismatch or error, 3
when the time budget cut something short. Without CUDA it says so and exits 0 without measuring;
``--dry-run`` runs the same code paths on the CPU with tiny sizes under Triton's interpreter and
no timing (CI runs it: ``tests/test_gpu_check.py``).

Sections (``--only NAME[,NAME]``, and ``--ops A,B`` to rerun chosen ops; on CUDA each section
runs in its own process, so a sticky CUDA error or a crash stays in it and the rows it saved
survive; ``--no-isolate`` runs them in-process):

``ops`` (:mod:`._ops`, :mod:`._op_cases`)
    every public op of ``mem_cache_kernels`` (discovered: ``list_ops()`` plus every public
    function with a ``backend`` keyword, ``deepseek_v4`` included) with ``backend="triton"`` on CUDA
    tensors, bit-exact against ``backend="torch"`` on the same device: page sizes 1/16/64,
    bf16/fp16/fp8 storage, int32/int64 indices, host<->device and device<->device, rows past
    2**31 bytes from the buffer start. A mismatch prints op, case and first differing index.
``register`` (:mod:`._register`)
    ``cudaHostRegister`` in chunks with rollback on a real driver failure, host pool memory
    pinned in chunks and released on ``close()``.
``host`` (:mod:`._host`)
    host pool backup / load GB/s per layout (layer_first, page_first, page_first_direct), IO
    backend (kernel, direct), page size and page pattern, against ``cudaMemcpyAsync`` of the
    same bytes between pinned host memory and the device.
``device`` (:mod:`._device`)
    ``store_kv`` and ``copy_all_layer_kv_cache`` (Triton and torch) against a device-to-device
    copy of the same bytes.
``alloc`` (:mod:`._alloc`)
    ``alloc_extend`` / ``alloc_decode`` latency at batch 1/32/256/1024: Triton vs the torch path
    on the same GPU, the Triton op replayed from a CUDA graph, and the allocator class end to end.
``layers`` (:mod:`._layers`)
    ``LayerDoneCounter``'s per-layer CUDA events (reads wait for their layer while the load
    stream is held back) and the layer-wise load overlap (time until layer 0 is readable vs
    the whole load).

Timing uses CUDA events; ratios in the table are "higher is better" (GB/s over the reference,
or reference time over the op's time).
"""

from tools.gpu_check._cli import main

__all__ = ["main"]
