"""A local Mooncake Store on loopback: ``mooncake_master`` (with its HTTP metadata server) plus
a holder process that contributes a memory segment.

Used by the Mooncake backend's tests, the multi-instance simulator run and the storage
benchmark; also runnable by hand::

    python -m tools.mooncake.store serve [--segment-mib 512]   # prints the addresses, Ctrl-C stops
    python -m tools.mooncake.store holder --master H:P --metadata URL --segment-bytes N

The holder is the process whose memory holds the pages: it must outlive every engine that wrote
through it (engines are pure clients, ``global_segment_size=0``). If the master or the holder
cannot start, :class:`LocalMooncakeStore` raises :class:`StoreStartError` with the reason and the
tail of the process log (tests fail with it; they never skip).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tools.cli import OneLineParser

__all__ = ["LocalMooncakeStore", "StoreStartError", "find_master_binary", "free_port"]

ROOT = Path(__file__).resolve().parents[2]


class StoreStartError(RuntimeError):
    """The local store could not be started (the message says why)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_master_binary() -> str:
    """Path of ``mooncake_master`` (this interpreter's ``bin`` first, then ``PATH``)."""
    candidates = [Path(sys.executable).parent / "mooncake_master"]
    try:
        import importlib.util

        spec = importlib.util.find_spec("mooncake")
        if spec is not None and spec.submodule_search_locations:
            for loc in spec.submodule_search_locations:
                candidates.append(Path(loc) / "mooncake_master")
    except (ImportError, ValueError):
        pass
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    found = shutil.which("mooncake_master")
    if found:
        return found
    raise StoreStartError(
        "mooncake_master not found: install mooncake-transfer-engine-non-cuda==0.3.13.post1 "
        "(python3 tools/dev env does)"
    )


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise StoreStartError(f"process exited with {proc.returncode} before port {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise StoreStartError(f"port {port} not listening after {timeout:.0f}s")


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-n:])


@dataclass
class LocalMooncakeStore:
    """Master + holder on free loopback ports (a context manager; see the module docstring)."""

    segment_bytes: int = 256 << 20
    workdir: Path | None = None
    timeout_s: float = 30.0
    rpc_port: int = 0
    http_port: int = 0
    master: subprocess.Popen[bytes] | None = field(default=None, init=False)
    holder: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="mooncake-store-"))
        self.rpc_port = self.rpc_port or free_port()
        self.http_port = self.http_port or free_port()
        self.metrics_port = free_port()

    @property
    def master_address(self) -> str:
        return f"127.0.0.1:{self.rpc_port}"

    @property
    def metadata_server(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/metadata"

    def client_options(self) -> dict[str, object]:
        """``extra_config`` entries that point a backend at this store."""
        return {"master_server_address": self.master_address,
                "metadata_server": self.metadata_server, "protocol": "tcp",
                "local_hostname": "127.0.0.1"}

    def env(self) -> dict[str, str]:
        """Environment variables that point a backend at this store."""
        return {"MOONCAKE_MASTER": self.master_address,
                "MOONCAKE_TE_META_DATA_SERVER": self.metadata_server,
                "MOONCAKE_PROTOCOL": "tcp", "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1"}

    def _log(self, name: str) -> Path:
        assert self.workdir is not None
        return self.workdir / f"{name}.log"

    def start_master(self) -> None:
        """Start (or restart) the master on the same ports."""
        binary = find_master_binary()
        cmd = [binary, f"--rpc_port={self.rpc_port}", "--rpc_address=127.0.0.1",
               "--enable_http_metadata_server=true", "--http_metadata_server_host=127.0.0.1",
               f"--http_metadata_server_port={self.http_port}", "--metrics_host=127.0.0.1",
               f"--metrics_port={self.metrics_port}", "--rpc_thread_num=2"]
        log = self._log("master").open("ab")
        self.master = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        try:
            _wait_port(self.rpc_port, self.master, self.timeout_s)
            _wait_port(self.http_port, self.master, self.timeout_s)
        except StoreStartError as exc:
            self.stop()
            raise StoreStartError(
                f"mooncake_master did not start ({exc}); command: {' '.join(cmd)}\n"
                f"{_tail(self._log('master'))}") from None

    def capacity_bytes(self) -> int:
        """The master's mounted segment capacity (its metrics endpoint); -1 if unreadable."""
        import urllib.request

        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            text = urllib.request.urlopen(url, timeout=2).read().decode()
        except OSError:
            return -1
        for line in text.splitlines():
            if line.startswith("master_total_capacity_bytes"):
                return int(float(line.split()[-1]))
        return -1

    def wait_mounted(self, timeout: float = 30.0) -> bool:
        """Wait until some segment is mounted (after a master restart the holder re-mounts
        its segment by itself, about a second later)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.capacity_bytes() > 0:
                return True
            time.sleep(0.1)
        return False

    def start_holder(self) -> None:
        """Start (or restart) the holder process and wait until its segment is mounted."""
        cmd = [sys.executable, "-m", "tools.mooncake.store", "holder",
               "--master", self.master_address, "--metadata", self.metadata_server,
               "--segment-bytes", str(self.segment_bytes)]
        log_path = self._log("holder")
        log = log_path.open("ab")
        self.holder = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                       start_new_session=True)
        end = time.monotonic() + self.timeout_s
        while time.monotonic() < end:
            if self.holder.poll() is not None:
                break
            if "HOLDER READY" in log_path.read_text(errors="replace"):
                return
            time.sleep(0.05)
        self.stop()
        raise StoreStartError(f"mooncake holder did not become ready\n{_tail(log_path)}")

    def start(self) -> LocalMooncakeStore:
        self.start_master()
        self.start_holder()
        return self

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes] | None, sig: int) -> None:
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def kill_master(self) -> None:
        """SIGKILL the master (a crash: every object's metadata is lost)."""
        self._kill(self.master, signal.SIGKILL)

    def stop_holder(self) -> None:
        """SIGKILL the holder (its segment, and every page in it, is gone)."""
        self._kill(self.holder, signal.SIGKILL)

    def stop(self) -> None:
        """Stop both (the holder by SIGKILL: its segment goes with the whole store anyway, and
        a clean client shutdown takes seconds)."""
        self._kill(self.holder, signal.SIGKILL)
        self._kill(self.master, signal.SIGTERM)

    def __enter__(self) -> LocalMooncakeStore:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def _holder(args: argparse.Namespace) -> int:
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", args.metadata, args.segment_bytes, 0, "tcp", "", args.master)
    if rc != 0:
        print(f"HOLDER FAILED setup returned {rc}", flush=True)
        return 1
    print("HOLDER READY", flush=True)
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop:
        time.sleep(0.2)
    store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m tools.mooncake.store")
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("holder", help="contribute a segment until SIGTERM")
    h.add_argument("--master", required=True)
    h.add_argument("--metadata", required=True)
    h.add_argument("--segment-bytes", type=int, default=256 << 20)
    s = sub.add_parser("serve", help="run a master and a holder until Ctrl-C")
    s.add_argument("--segment-mib", type=int, default=512)
    args = ap.parse_args(argv)
    if args.cmd == "holder":
        return _holder(args)

    def _interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM, and SIGINT even where the shell started us with it ignored (a background job of a
    # non-interactive shell), end the loop below, so the master and holder are stopped on exit.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    with LocalMooncakeStore(segment_bytes=args.segment_mib << 20) as store:
        print(f"master {store.master_address}  metadata {store.metadata_server}  "
              f"logs {store.workdir}", flush=True)
        for k, v in store.env().items():
            print(f"export {k}={v}")
        try:
            while store.master is not None and store.master.poll() is None:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
