"""Session-wide test setup (loaded before any test module of the default run is imported).

Triton decides between compiling a kernel and interpreting it when ``@triton.jit`` decorates it,
i.e. when a ``mem_cache_kernels._triton`` module is first imported in the process, and its
interpreter patches ``triton.language`` process-wide. On a machine without a GPU every Triton
test therefore runs under the interpreter, and the whole session must agree on that from the start:
otherwise kernels decorated by one package's tests in one mode leak into another package's tests.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
