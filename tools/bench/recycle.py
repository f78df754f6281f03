"""Recently used memory for the kernel to hand out before a timed call.

Why: on a virtual machine whose host takes back the memory the guest leaves free (a balloon
with free page reporting, as here), the first touch of a page the guest has not used lately
costs a fault in the host. Measured on this machine: touching 256 MiB of new memory runs at
0.43 GB/s (about 10 us per 4 KiB page) once the guest's recently freed memory is used up,
against 7.8 GB/s for memory freed a moment before. A call that takes new memory (a file write's
page cache, a read into a new buffer) is then timed at the host's speed, not at its own: the
storage side-by-side rows that move 64 MiB per call measured appends of 0.5-1 GB/s on both sides
where 16 MiB calls measured 5 GB/s, and perf put 43% of the time in the kernel's copy into
new page cache pages. A server without such a host pays no such cost (a new page is zeroed at
memory speed).

:class:`Recycler` writes ``n`` bytes to a scratch file and deletes it before a timed call: the
pages the write took are free again, and the kernel hands recently freed pages out first (to
the page cache and to anonymous memory alike), so the timed call takes memory the guest has
already backed. Before that it flushes every dirty page (``os.sync``), so no series is timed
while the kernel writes back what the series before it wrote (the other side's pages, often):
with the flush, SGLang's one-page sets here ran at 228-319 us in most rounds, without it at
700-900 us in most, and our reads right after our ``sglang``-scheme side lost a third in some
rounds. Both sides of a comparison get the same. It runs before a series of timed calls, not
before each: a scratch write between two calls would leave the second one's code and data out
of the caches.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["Recycler"]


class Recycler:
    """``recycler(n)``: flush dirty pages, write ``n`` bytes to a scratch file under ``root``
    (its buffer of ``buffer_bytes``, allocated once, written as often as needed) and delete it
    (see the module docstring)."""

    def __init__(self, root: Path, buffer_bytes: int) -> None:
        self.path = root / ".recycle"
        self._buf = memoryview(bytearray(max(1, buffer_bytes)))

    def __call__(self, nbytes: int) -> None:
        os.sync()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            done = 0
            while done < nbytes:
                done += os.pwrite(fd, self._buf[: nbytes - done], done)
        finally:
            os.close(fd)
            os.unlink(self.path)
