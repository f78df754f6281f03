"""Simulation configuration: one frozen dataclass, its embedded default and the CLI parser.

The default is what ``python3 tools/dev run`` executes: a small MHA model whose device pool is
deliberately too small for the working set of the sessions, so finished prefixes are backed up to
the host pool and loaded back, and the host pool in turn overflows into the storage tier (L3, a
file backend in a temporary directory) from which returning turns are prefetched.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Literal

import torch

__all__ = [
    "DTYPES",
    "HOST_LAYOUTS",
    "IO_BACKENDS",
    "STORAGE_BACKENDS",
    "STORAGE_WRITE_POLICIES",
    "SimConfig",
    "build_parser",
    "config_from_args",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}
HOST_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
IO_BACKENDS = ("kernel", "direct")
STORAGE_BACKENDS = ("none", "file", "mooncake")
STORAGE_WRITE_POLICIES = ("write_back", "write_through")

Model = Literal["mha", "mla", "dsv4", "hybrid"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """Everything one simulation run depends on (the run is a pure function of this and the code).

    Sizes are in tokens; ``device_tokens`` and ``host_tokens`` are rounded down to whole pages by
    the pools. ``faults`` is the probability that one host<->device transfer fails or is aborted.
    ``storage`` selects the L3 backend (``"file"`` or ``"none"``) in ``storage_dir`` (a temporary
    directory when ``None``), written under ``storage_write``, bounded by
    ``storage_capacity_mb`` (0: unlimited); ``storage_fault_rate`` is the probability that one
    storage call fails, is slow, corrupts a page or stops partway; ``restart_at`` (>= 0) is the
    step at which the engine restarts (caches flushed to L3 and dropped). With ``storage``
    ``"mooncake"`` the L3 is a Mooncake Store: the one at ``storage_master`` (``HOST:PORT``,
    metadata server ``storage_metadata``, default ``http://HOST:8080/metadata``), or a local
    store (master + holder) started for the run when ``storage_master`` is ``None``.
    ``shared_prefix_tokens``: a preamble of that many tokens common to every session (content
    independent of the session), whose page-aligned part the mha/mla engine caches once
    (``shared_prefix.py``; 0: off).
    """

    model: Model = "mha"
    layers: int = 8
    heads: int = 4
    head_dim: int = 64
    kv_lora_rank: int = 256
    qk_rope_head_dim: int = 64
    dtype: str = "bfloat16"
    page_size: int = 16
    device_tokens: int = 24576
    host_tokens: int = 32768
    host_layout: str = "page_first"
    io_backend: str = "kernel"
    requests: int = 800
    max_running: int = 48
    mean_turns: float = 4.0
    system_prompts: int = 4
    prompt_mu: float = 4.6
    prompt_sigma: float = 0.8
    output_mu: float = 3.6
    output_sigma: float = 0.7
    max_prompt: int = 768
    max_output: int = 256
    arrival_per_step: float = 0.15
    think_steps: int = 60
    seed: int = 0
    device: str = "cpu"
    faults: float = 0.0
    spec_draft: int = 0
    retract_after: int = 0
    shared_prefix_tokens: int = 64
    check_every: int = 1
    threads: int = 1
    storage: str = "file"
    storage_dir: str | None = None
    storage_write: str = "write_back"
    storage_capacity_mb: int = 0
    storage_fault_rate: float = 0.0
    restart_at: int = -1
    storage_master: str | None = None
    storage_metadata: str | None = None

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def validate(self) -> None:
        """``ValueError`` naming the first option whose value cannot work."""
        positive = ("layers", "heads", "head_dim", "kv_lora_rank", "qk_rope_head_dim",
                    "page_size", "device_tokens", "host_tokens", "requests", "max_running",
                    "system_prompts", "max_prompt", "max_output", "check_every", "threads")
        for name in positive:
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.page_size & (self.page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {self.page_size}")
        if self.device_tokens < 4 * self.page_size:
            raise ValueError(
                f"device_tokens must hold at least 4 pages ({4 * self.page_size}), "
                f"got {self.device_tokens}"
            )
        if self.host_tokens < self.page_size:  # rounded down to whole pages it would hold none
            raise ValueError(
                f"host_tokens must hold at least one page ({self.page_size} tokens at page size "
                f"{self.page_size}), got {self.host_tokens}"
            )
        if self.model not in ("mha", "mla", "dsv4", "hybrid"):
            raise ValueError(f"model must be 'mha', 'mla', 'dsv4' or 'hybrid', got {self.model!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.host_layout not in HOST_LAYOUTS:
            raise ValueError(f"host_layout must be one of {HOST_LAYOUTS}, got {self.host_layout!r}")
        if self.io_backend not in IO_BACKENDS:
            raise ValueError(f"io_backend must be one of {IO_BACKENDS}, got {self.io_backend!r}")
        for name in ("spec_draft", "retract_after", "shared_prefix_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.faults <= 1.0:
            raise ValueError(f"faults must be a probability in [0, 1], got {self.faults}")
        if self.mean_turns < 1.0:
            raise ValueError(f"mean_turns must be >= 1, got {self.mean_turns}")
        if self.arrival_per_step <= 0.0:
            raise ValueError(f"arrival_per_step must be positive, got {self.arrival_per_step}")
        if self.storage not in STORAGE_BACKENDS:
            raise ValueError(f"storage must be one of {STORAGE_BACKENDS}, got {self.storage!r}")
        if self.storage_write not in STORAGE_WRITE_POLICIES:
            raise ValueError(f"storage_write must be one of {STORAGE_WRITE_POLICIES}, "
                             f"got {self.storage_write!r}")
        if not 0.0 <= self.storage_fault_rate <= 1.0:
            raise ValueError(f"storage_fault_rate must be a probability in [0, 1], "
                             f"got {self.storage_fault_rate}")
        if self.storage_capacity_mb < 0:
            raise ValueError(f"storage_capacity_mb must be >= 0, got {self.storage_capacity_mb}")


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m tools.simulate`` argument parser (defaults = the embedded default run)."""
    d = SimConfig()
    p = argparse.ArgumentParser(
        prog="python -m tools.simulate",
        description="Serving-workload simulator driving the four mem-cache packages through "
        "hierarchical caching (device pool <-> host pool), with integrity checks and a report.",
    )
    m = p.add_argument_group("model shape")
    m.add_argument("--model", choices=("mha", "mla", "dsv4", "hybrid"), default=d.model,
                   help="dsv4: the DeepSeek-V4 HiSparse stack (tools/simulate/dsv4.py); hybrid: "
                   "attention every 4th layer, Mamba elsewhere (tools/simulate/hybrid.py)")
    m.add_argument("--layers", type=int, default=d.layers)
    m.add_argument("--heads", type=int, default=d.heads, help="MHA KV heads")
    m.add_argument("--head-dim", type=int, default=d.head_dim, help="MHA head dim")
    m.add_argument("--kv-lora-rank", type=int, default=d.kv_lora_rank, help="MLA latent width")
    m.add_argument("--qk-rope-head-dim", type=int, default=d.qk_rope_head_dim, help="MLA rope")
    m.add_argument("--dtype", choices=sorted(DTYPES), default=d.dtype)
    c = p.add_argument_group("memory")
    c.add_argument("--page-size", type=int, default=d.page_size)
    c.add_argument("--device-tokens", type=int, default=d.device_tokens,
                   help="device KV pool size in tokens")
    c.add_argument("--host-tokens", type=int, default=d.host_tokens,
                   help="host KV pool size in tokens")
    c.add_argument("--host-layout", choices=HOST_LAYOUTS, default=d.host_layout)
    c.add_argument("--io-backend", choices=IO_BACKENDS, default=d.io_backend)
    c.add_argument("--device", default=None,
                   help="torch device for the device pool (default: cpu; 'cuda' when available)")
    w = p.add_argument_group("workload")
    w.add_argument("--requests", type=int, default=d.requests, help="turns to serve in total")
    w.add_argument("--max-running", type=int, default=d.max_running)
    w.add_argument("--mean-turns", type=float, default=d.mean_turns)
    w.add_argument("--arrival-per-step", type=float, default=d.arrival_per_step,
                   help="new sessions per engine step (Poisson)")
    w.add_argument("--think-steps", type=int, default=d.think_steps,
                   help="steps between a turn finishing and the session's next turn arriving")
    w.add_argument("--seed", type=int, default=d.seed)
    w.add_argument("--faults", type=float, default=d.faults,
                   help="probability that a host<->device transfer fails or is aborted midway")
    w.add_argument("--spec-draft", type=int, default=d.spec_draft,
                   help="speculative decoding: N draft slots per request and decode step, the "
                        "rejected ones freed (0: plain decode)")
    w.add_argument("--retract-after", type=int, default=d.retract_after,
                   help="retract the running request with the most output left when the queue "
                        "head has waited N steps for memory (0: never)")
    w.add_argument("--shared-prefix-tokens", type=int, default=d.shared_prefix_tokens,
                   help="a system preamble of N tokens common to every session (identical KV): "
                        "its page-aligned part is cached once, matched at admission, and the "
                        "duplicate pages a finished request computed are freed (0: off; "
                        "mha/mla engine)")
    w.add_argument("--check-every", type=int, default=d.check_every,
                   help="run the slot-conservation check every N steps")
    w.add_argument("--threads", type=int, default=d.threads,
                   help="torch intra-op threads (1 is fastest for these small ops on a busy CPU)")
    st = p.add_argument_group("storage tier (L3)")
    st.add_argument("--storage", choices=STORAGE_BACKENDS, default=d.storage,
                    help="L3 backend: 'file' (one file per page in --storage-dir), 'mooncake' "
                    "(a Mooncake Store: --storage-master, or a local one started for the run) "
                    "or 'none'")
    st.add_argument("--storage-dir", default=d.storage_dir, metavar="DIR",
                    help="L3 directory (default: a temporary directory, removed afterwards)")
    st.add_argument("--storage-write", choices=STORAGE_WRITE_POLICIES, default=d.storage_write,
                    help="write pages to L3 when the host evicts them, or when they reach it")
    st.add_argument("--storage-capacity-mb", type=int, default=d.storage_capacity_mb,
                    help="L3 capacity in MiB, LRU eviction (0: unlimited)")
    st.add_argument("--storage-fault-rate", type=float, default=d.storage_fault_rate,
                    help="probability that a storage call fails, is slow (prefetch timeout), "
                    "corrupts a stored page or stops partway")
    st.add_argument("--restart-at", type=int, default=d.restart_at, metavar="STEP",
                    help="restart the engine at this step: device and host caches are flushed "
                    "to L3 and dropped, so the next turns are served by the warm L3")
    st.add_argument("--storage-master", default=d.storage_master, metavar="HOST:PORT",
                    help="--storage mooncake: join this Mooncake master instead of starting a "
                    "local store")
    st.add_argument("--storage-metadata", default=d.storage_metadata, metavar="URL",
                    help="--storage mooncake: metadata server (default http://HOST:8080/metadata)")
    o = p.add_argument_group("output")
    o.add_argument("--json", metavar="PATH", default=None,
                   help="also write the report as JSON to PATH ('-' for stdout only)")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """Build and validate a ``SimConfig`` from parsed arguments."""
    names = {f.name for f in fields(SimConfig)}
    values = {k: v for k, v in vars(ns).items() if k in names and v is not None}
    device = ns.device
    if device is None:
        device = "cpu"
    elif device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but torch.cuda.is_available() is False")
    values["device"] = device
    cfg = SimConfig(**values)
    cfg.validate()
    return cfg
