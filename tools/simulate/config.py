"""Simulation configuration: one frozen dataclass, its embedded default and the CLI parser.

The default is what ``python3 tools/dev run`` executes: a small MHA model whose device pool is
deliberately too small for the working set of the sessions, so finished prefixes are backed up to
the host pool and loaded back, and the host pool in turn overflows into the storage tier (L3, a
file backend in a temporary directory) from which returning turns are prefetched.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, fields
from typing import Literal

import torch

__all__ = [
    "DTYPES",
    "HOST_LAYOUTS",
    "IO_BACKENDS",
    "STORAGE_BACKENDS",
    "STORAGE_WRITE_POLICIES",
    "MODELS",
    "MODELS_WITHOUT_MOONCAKE",
    "MODELS_WITH_L3",
    "MODEL_IGNORES",
    "SimConfig",
    "config_from_args",
    "flag",
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

Model = Literal["mha", "mla", "deepseek_v4", "hybrid"]

#: ``--model`` choices and their one-line help (a new model adapter adds its entry here, in
#: ``MODEL_IGNORES`` and, when it has a storage tier, in ``MODELS_WITH_L3``)
MODELS: dict[str, str] = {
    "mha": "multi-head attention over device/host/storage pools",
    "mla": "multi-head latent attention (one latent row per token)",
    "deepseek_v4": "the DeepSeek-V4 HiSparse stack (tools/simulate/deepseek_v4.py; device, "
                   "host and file L3 tiers)",
    "hybrid": "a hybrid linear-attention model (tools/simulate/hybrid.py; attention every 4th "
              "layer, the rest Mamba conv + temporal state; device, host and file L3 tiers)",
}
MODELS_WITH_L3 = ("mha", "mla", "deepseek_v4", "hybrid")
#: options (``SimConfig`` field names) that a model does not use: given explicitly, they are
#: refused (``options.refuse_ignored``)
MODEL_IGNORES: dict[str, tuple[str, ...]] = {
    "mha": ("kv_lora_rank", "qk_rope_head_dim"),
    "mla": ("heads", "head_dim"),
    "deepseek_v4": ("heads", "head_dim", "kv_lora_rank", "qk_rope_head_dim", "dtype",
             "shared_prefix_tokens", "spec_draft", "retract_after", "restart_at"),
    "hybrid": ("kv_lora_rank", "qk_rope_head_dim", "shared_prefix_tokens", "restart_at"),
}
#: models whose storage tier is the file backend only (their extra host pools are not
#: registered with a Mooncake client)
MODELS_WITHOUT_MOONCAKE = ("deepseek_v4", "hybrid")


def flag(name: str) -> str:
    """The command-line flag of a ``SimConfig`` field: ``page_size`` -> ``--page-size``."""
    return "--" + name.replace("_", "-")


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
        """``ValueError`` naming the first option (as its flag, ``--page-size``) whose value
        cannot work, the value and what is expected."""
        positive = ("layers", "heads", "head_dim", "kv_lora_rank", "qk_rope_head_dim",
                    "page_size", "device_tokens", "host_tokens", "requests", "max_running",
                    "system_prompts", "max_prompt", "max_output", "check_every", "threads")
        for name in positive:
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"{flag(name)} must be positive, got {value}")
        if self.page_size & (self.page_size - 1):
            raise ValueError(f"--page-size must be a power of two, got {self.page_size}")
        if self.device_tokens < 4 * self.page_size:
            raise ValueError(
                f"--device-tokens must hold at least 4 pages ({4 * self.page_size} tokens at "
                f"page size {self.page_size}), got {self.device_tokens}"
            )
        if self.host_tokens < self.page_size:  # rounded down to whole pages it would hold none
            raise ValueError(
                f"--host-tokens must hold at least one page ({self.page_size} tokens at page "
                f"size {self.page_size}), got {self.host_tokens}"
            )
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if value not in choices:
                raise ValueError(f"{flag(name)} must be one of {choices}, got {value!r}")
        for name in ("faults", "storage_fault_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{flag(name)} must be a probability in [0, 1], "
                                 f"got {getattr(self, name)}")
        if not _DEVICE.fullmatch(self.device):
            raise ValueError(f"--device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        for name in ("spec_draft", "retract_after", "shared_prefix_tokens", "seed",
                     "think_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{flag(name)} must be >= 0, got {getattr(self, name)}")
        if self.restart_at < -1:
            raise ValueError(f"--restart-at must be a step >= 0 (or -1: never), "
                             f"got {self.restart_at}")
        if not self.mean_turns >= 1.0:
            raise ValueError(f"--mean-turns must be >= 1, got {self.mean_turns}")
        if not 0.0 < self.arrival_per_step < float("inf"):
            raise ValueError(f"--arrival-per-step must be positive, got {self.arrival_per_step}")
        if self.storage == "mooncake" and self.model in MODELS_WITHOUT_MOONCAKE:
            raise ValueError(f"--storage mooncake is not available for --model {self.model} "
                             "(its extra host pools reach L3 through --storage file)")
        if self.storage_capacity_mb < 0:
            raise ValueError(f"--storage-capacity-mb must be >= 0 (0: unlimited), "
                             f"got {self.storage_capacity_mb}")
        if self.storage_master is not None:
            host, _, port = self.storage_master.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"--storage-master must be HOST:PORT (port 1-65535), "
                                 f"got {self.storage_master!r}")
        if self.storage_metadata is not None and not self.storage_metadata.startswith(
                ("http://", "https://")):
            raise ValueError(f"--storage-metadata must be an http:// or https:// URL, "
                             f"got {self.storage_metadata!r}")


_DEVICE = re.compile(r"cpu|cuda(:\d+)?")

#: the options whose value is one of a fixed set (checked by ``SimConfig.validate``)
_CHOICES: dict[str, tuple[str, ...] | list[str]] = {
    "model": tuple(MODELS),
    "dtype": sorted(DTYPES),
    "host_layout": HOST_LAYOUTS,
    "io_backend": IO_BACKENDS,
    "storage": STORAGE_BACKENDS,
    "storage_write": STORAGE_WRITE_POLICIES,
}


def config_from_args(ns: argparse.Namespace) -> SimConfig:
    """Build and validate a ``SimConfig`` from parsed arguments."""
    names = {f.name for f in fields(SimConfig)}
    values = {k: v for k, v in vars(ns).items() if k in names and v is not None}
    device = ns.device
    if device is None:
        device = "cpu"
    elif device.startswith("cuda") and _DEVICE.fullmatch(device):
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device!r} requested but torch.cuda.is_available() is "
                             "False; expected cpu")
        index = int(device.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"--device {device!r}: this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
    values["device"] = device
    cfg = SimConfig(**values)
    cfg.validate()
    return cfg
