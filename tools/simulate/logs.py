"""Third-party logs of the tools (simulator, benchmarks): off by default, ``--verbose`` on.

The Mooncake Store client (C++, glog) prints INFO lines on every connect, a WARNING per rejected
put and ERROR lines for conditions the storage tier handles and counts (a missing key, a full
segment); the tools report those counts, so the log lines are noise for a user. Both knobs are
read when the client library initialises, so :func:`quiet_third_party_logs` must run before the
first ``import mooncake`` (the tools import it lazily, when a Mooncake backend is created);
processes started afterwards (the local store's master and holder, the multi-instance engines)
inherit the environment.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["QUIET_ENV", "GLOG_LINE", "filtered_stderr", "quiet_third_party_logs"]

#: a glog line (``E1201 20:13:12.892370  5429 file.cpp:292] ...``) or glog's note that it
#: logs before ``InitGoogleLogging`` (printed once, whatever the level)
GLOG_LINE = re.compile(
    rb"^(?:[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [^ \]]+:\d+\] |WARNING: Logging before "
    rb"InitGoogleLogging\(\))")

#: environment of a quiet run: glog keeps FATAL only (``GLOG_minloglevel`` 3), the transfer
#: engine's own level is ERROR; a value the user set already wins
QUIET_ENV = {"GLOG_minloglevel": "3", "MC_LOG_LEVEL": "ERROR", "GLOG_logtostderr": "1"}


def quiet_third_party_logs(verbose: bool) -> None:
    """Silence the Mooncake client and ``mem_cache_storage`` warnings unless ``verbose``."""
    if verbose:
        return
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # the storage tier logs each failed backend call; the report counts them
    logging.getLogger("mem_cache_storage").setLevel(logging.ERROR)


class _Filter:
    """Counts what :func:`filtered_stderr` dropped."""

    def __init__(self) -> None:
        self.dropped = 0


@contextmanager
def filtered_stderr(verbose: bool) -> Iterator[_Filter]:
    """Drop glog lines (C++ clients write them to file descriptor 2, below Python's logging)
    from this process's stderr while the block runs, unless ``verbose``; every other line passes
    through unchanged. Yields a counter of the dropped lines."""
    counter = _Filter()
    if verbose:
        yield counter
        return
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to filter
        yield counter
        return
    read_end, write_end = os.pipe()

    def pump() -> None:
        with os.fdopen(read_end, "rb", buffering=0) as src:
            pending = b""
            while chunk := src.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if GLOG_LINE.match(line):
                        counter.dropped += 1
                    else:
                        os.write(saved, line + b"\n")
            if pending and not GLOG_LINE.match(pending):
                os.write(saved, pending)

    sys.stderr.flush()
    os.dup2(write_end, 2)
    os.close(write_end)
    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()
    try:
        yield counter
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the pump sees EOF
        thread.join(timeout=5)
        os.close(saved)
