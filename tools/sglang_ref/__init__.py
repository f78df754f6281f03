"""SGLang 0.5.23 as a reference, read from its wheel: fetched, never vendored.

Our packages mirror SGLang's ``mem_cache`` classes, and *SGLang's callers* are the contract. This
package lets tests and benchmarks run SGLang's own modules (scheduler helpers, radix caches,
``HiCacheController``, its pools and allocators) on the CPU, next to ours, in one process:

* :func:`ensure_wheel` downloads ``sglang==0.5.23`` with ``pip download --no-deps`` into
  ``.cache/sglang/`` (or ``$SGLANG_WHEEL_CACHE``) and unpacks it there; ``$SGLANG_WHEEL`` points at
  a wheel file already on disk instead. A few small pure-Python dependencies that SGLang's
  modules use at import time are installed beside it with ``pip install --no-deps --target``.
* :func:`load` imports SGLang modules from that tree. SGLang's top-level ``sglang/__init__.py``
  (the frontend language) is not run; third-party packages that SGLang imports and that are not
  installed (CUDA kernels, transformers, ...) get permissive stand-ins *only when SGLang's own code
  imports them*; two SGLang modules far from the memory layer (the OpenAI protocol models and the
  reasoning parser) are replaced by stand-ins. :data:`STUBBED_INTERNAL` lists them.
* :mod:`tools.sglang_ref.parity` reads SGLang's class surfaces from the source with ``ast`` and
  compares them with ours (``python3 tools/dev parity``).

Nothing of SGLang enters the repository. Without network, set ``SGLANG_WHEEL`` to a downloaded
wheel; a test that needs SGLang fails (never skips) with :data:`HOW_TO_GET` in its message.
"""

from __future__ import annotations

from tools.sglang_ref._loader import STUBBED_INTERNAL, load, stubbed_externals
from tools.sglang_ref._wheel import HOW_TO_GET, VERSION, WheelUnavailable, ensure_wheel, source_root

__all__ = [
    "HOW_TO_GET",
    "STUBBED_INTERNAL",
    "VERSION",
    "WheelUnavailable",
    "ensure_wheel",
    "load",
    "source_root",
    "stubbed_externals",
]
