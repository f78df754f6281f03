"""The command line of ``tools/dev run``: the grouped parser, and every check of the user's input
that can be made before the run starts (values, paths, options the chosen mode ignores).

A bad flag or path is refused here with exit status 2 and one line naming the flag, the value and
what is expected; nothing the user types reaches the run as a traceback. The model choices come
from ``config.MODELS`` (one entry per adapter), the options each model ignores from
``config.MODEL_IGNORES``, so a new model adapter adds its entries there.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from tools.cli import OneLineParser
from tools.simulate.config import (
    DTYPES,
    HOST_LAYOUTS,
    IO_BACKENDS,
    MODEL_IGNORES,
    MODELS,
    MODELS_WITH_L3,
    STORAGE_BACKENDS,
    STORAGE_WRITE_POLICIES,
    SimConfig,
    flag,
)

__all__ = [
    "MULTI_INSTANCE_OPTIONS",
    "PROG",
    "UsageError",
    "build_parser",
    "check_output_path",
    "check_storage_dir",
    "explicit_options",
    "refuse_ignored",
]

PROG = "tools/dev run"

#: the options of the multi-instance mode (``--instances N``: ``tools/mooncake/instances.py``)
MULTI_INSTANCE_OPTIONS = ("instances", "routing", "kill_master_at", "segment_mib")

#: what each storage backend ignores (``--storage none``: every L3 option)
_L3_OPTIONS = ("storage_dir", "storage_write", "storage_capacity_mb", "storage_fault_rate",
               "storage_master", "storage_metadata")
STORAGE_IGNORES: dict[str, tuple[str, ...]] = {
    "none": _L3_OPTIONS,
    "file": ("storage_master", "storage_metadata"),
    "mooncake": ("storage_dir", "storage_capacity_mb"),
}


class UsageError(ValueError):
    """A user input the run cannot take (printed as one ``error:`` line, exit status 2)."""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Shows ``(default: X)`` after every option that has a default worth showing."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if ("%(default)" in text or default is None or default is argparse.SUPPRESS
                or isinstance(action, argparse._StoreTrueAction)):
            return text
        return f"{text} (default: %(default)s)"


_EPILOG = """\
examples:
  tools/dev run                                   the default run: MHA, device + host + file L3
  tools/dev run --model mla --requests 200 --json r.json
  tools/dev run --storage mooncake                a local Mooncake Store started for the run
  tools/dev run --storage mooncake --instances 4  four engines sharing one store
  tools/dev run --storage-fault-rate 0.05 --restart-at 400 --faults 0.02

Exit status: 0 when the run had no integrity failure and no leak, 1 otherwise, 2 for bad input.
The six distributions it drives: mem-cache-kernels, mem-cache-pool, mem-cache-allocator,
mem-cache-pool-host, mem-cache-storage (and mem-cache-refactor, the refactor tools, no torch).
"""


_N: dict[str, Any] = {"type": int, "metavar": "N"}
_X: dict[str, Any] = {"type": float, "metavar": "X"}

#: every option of ``tools/dev run`` as ``--help`` groups them: (group, its description, rows of
#: (flag, argparse keywords)); an option named for a ``SimConfig`` field defaults to the field's
#: default (``SimConfig()`` is the default run) unless its row says otherwise
_OPTIONS: tuple[tuple[str, str | None, tuple[tuple[str, dict[str, Any]], ...]], ...] = (
    ("workload", None, (
        ("--requests", {**_N, "help": "turns to serve in total"}),
        ("--max-running", {**_N, "help": "most requests in one batch"}),
        ("--mean-turns", {**_X, "help": "mean turns per session (>= 1)"}),
        ("--arrival-per-step", {**_X, "help": "new sessions per engine step (Poisson)"}),
        ("--think-steps", {**_N, "help": "steps between a turn finishing and the session's "
                           "next turn arriving"}),
        ("--shared-prefix-tokens", {**_N, "help": "a system preamble of N tokens common to "
                                    "every session: its page-aligned part is cached once and "
                                    "matched at admission (0: off; mha/mla)"}),
        ("--spec-draft", {**_N, "help": "speculative decoding: N draft slots per request and "
                          "decode step, the rejected ones freed (0: plain decode; mha/mla)"}),
        ("--retract-after", {**_N, "help": "retract the running request with the most output "
                             "left when the queue head has waited N steps for memory (0: "
                             "never; mha/mla)"}),
        ("--seed", {**_N, "help": "seed of the workload, the KV content and the fault "
                    "injectors"}),
    )),
    ("model", None, (
        ("--model", {"choices": tuple(MODELS), "help": "attention family: " + "; ".join(
            f"{k}: {v}" for k, v in MODELS.items())}),
        ("--layers", {**_N, "help": "layers"}),
        ("--heads", {**_N, "help": "KV heads (mha)"}),
        ("--head-dim", {**_N, "help": "head dimension (mha)"}),
        ("--kv-lora-rank", {**_N, "help": "latent width (mla)"}),
        ("--qk-rope-head-dim", {**_N, "help": "rope part of the latent (mla)"}),
        ("--dtype", {"choices": sorted(DTYPES),
                     "help": "KV dtype (mha/mla; fp8 is stored as uint8)"}),
    )),
    ("memory", None, (
        ("--page-size", {**_N, "help": "tokens per page (a power of two)"}),
        ("--device-tokens", {**_N, "help": "device KV pool (L1) size in tokens, rounded down "
                             "to whole pages"}),
        ("--host-tokens", {**_N, "help": "host KV pool (L2) size in tokens, rounded down to "
                           "whole pages"}),
        ("--host-layout", {"choices": HOST_LAYOUTS, "help": "host pool layout"}),
        ("--io-backend", {"choices": IO_BACKENDS, "help": "host<->device copies: 'kernel' (row "
                          "kernels) or 'direct' (one copy_ per contiguous run)"}),
        ("--device", {"default": None, "metavar": "DEV", "help": "torch device of the device "
                      "pool: cpu, cuda or cuda:N (default: cpu)"}),
        ("--threads", {**_N, "help": "torch intra-op threads (1 is fastest for these small "
                       "ops)"}),
    )),
    ("storage tier (L3)", None, (
        ("--storage", {"choices": STORAGE_BACKENDS, "help": "L3 backend: 'file' (one file per "
                       "page in --storage-dir), 'mooncake' (a Mooncake Store: --storage-master, "
                       "or a local one started for the run; mha/mla) or 'none'; hybrid and "
                       "deepseek_v4 send their extra host pools (Mamba states, c4/c128 records) "
                       "along"}),
        ("--storage-dir", {"metavar": "DIR", "help": "--storage file: the L3 directory, created "
                           "when missing (default: a temporary directory, removed "
                           "afterwards)"}),
        ("--storage-write", {"choices": STORAGE_WRITE_POLICIES, "help": "write pages to L3 "
                             "when the host evicts them, or when they reach it"}),
        ("--storage-capacity-mb", {"type": int, "metavar": "MIB", "help": "--storage file: L3 "
                                   "capacity in MiB, LRU eviction (0: unlimited)"}),
        ("--storage-master", {"metavar": "HOST:PORT", "help": "--storage mooncake: join this "
                              "Mooncake master instead of starting a local store (default: a "
                              "local store)"}),
        ("--storage-metadata", {"metavar": "URL", "help": "--storage mooncake with "
                                "--storage-master: the metadata server (default: "
                                "http://HOST:8080/metadata)"}),
    )),
    ("faults", None, (
        ("--faults", {"type": float, "metavar": "P", "help": "probability that a host<->device "
                      "transfer fails or is aborted midway"}),
        ("--storage-fault-rate", {"type": float, "metavar": "P", "help": "probability that a "
                                  "storage call fails, is slow (prefetch timeout), corrupts a "
                                  "stored page or stops partway"}),
        ("--restart-at", {"type": int, "metavar": "STEP", "help": "restart the engine at this "
                          "step: device and host caches are flushed to L3 and dropped, so the "
                          "next turns are served by the warm L3 (-1: never; a step past the "
                          "run's end is reported as a warning; mha/mla)"}),
        ("--check-every", {**_N, "help": "run the slot-conservation check every N steps"}),
    )),
    ("multi-instance (--storage mooncake --instances N: tools/mooncake/instances.py)",
     "N simulator engines (processes) on one Mooncake Store, a session's turns on different "
     "engines; the other options apply to every instance (its own defaults: --requests 240, "
     "--device-tokens 8192, --host-tokens 8192, --max-running 32)", (
        ("--instances", {**_N, "default": None, "help": "run N engines on one store (default: "
                         "one engine, this simulator)"}),
        ("--routing", {"choices": ("round-robin", "random"), "default": None,
                       "help": "which engine serves a turn (default: round-robin)"}),
        ("--kill-master-at", {"type": int, "default": None, "metavar": "WAVE",
                              "help": "SIGKILL the local store's master before this wave, "
                              "restart it after (default: never)"}),
        ("--segment-mib", {"type": int, "default": None, "metavar": "MIB", "help": "the local "
                           "store's holder segment in MiB (default: 1024)"}),
    )),
    ("output", None, (
        ("--json", {"metavar": "PATH", "default": None, "help": "also write the report as JSON "
                    "to PATH ('-': stdout, the table goes to stderr); PATH's folder must "
                    "exist"}),
        ("--no-progress", {"action": "store_true", "help": "no progress bar"}),
        ("--verbose", {"action": "store_true", "help": "show third-party logs (the Mooncake "
                       "client's INFO/WARNING lines, mem_cache_storage warnings); off by "
                       "default"}),
    )),
)


def build_parser() -> argparse.ArgumentParser:
    """The ``tools/dev run`` parser (defaults = the embedded default run, ``SimConfig()``)."""
    d = SimConfig()
    config_fields = {f.name for f in fields(SimConfig)}
    p = OneLineParser(
        prog=PROG, formatter_class=_Formatter, epilog=_EPILOG, usage="%(prog)s [OPTIONS]",
        description="Serving-workload simulator: one continuous-batching engine loop (no model\n"
        "weights) driving the mem-cache packages through hierarchical caching, device pool\n"
        "(L1) <-> host pool (L2) <-> storage tier (L3). Every loaded page is verified\n"
        "bit-exact, slot conservation is checked every step and leaks at the end; the run\n"
        "ends with a report table.",
    )
    for title, description, rows in _OPTIONS:
        group = p.add_argument_group(title, description)
        for option, keywords in rows:
            dest = option[2:].replace("-", "_")
            field_default = {"default": getattr(d, dest)} if dest in config_fields else {}
            group.add_argument(option, **{**field_default, **keywords})
    return p


def explicit_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The ``dest`` names of the options ``argv`` gives explicitly (defaults not counted)."""
    saved = [(a, a.default) for a in parser._actions]
    try:
        for action, _ in saved:
            action.default = argparse.SUPPRESS
        ns, _ = parser.parse_known_args(list(argv))
    finally:
        for action, default in saved:
            action.default = default
    return set(vars(ns))


def refuse_ignored(cfg: SimConfig, given: set[str]) -> None:
    """``UsageError`` for an explicitly given option that the chosen model or storage backend
    would ignore, naming the option and the mode."""
    extra = "" if cfg.model in MODELS_WITH_L3 else " (it has no storage tier)"
    # (options, the message refusing one): the model's, the storage backend's, the metadata
    # server without a master, the multi-instance mode's; the first option given is refused
    rules: tuple[tuple[Iterable[str], Callable[[str], str]], ...] = (
        # `--storage none` says what a model without a storage tier does anyway
        ([n for n in MODEL_IGNORES.get(cfg.model, ()) if (n, cfg.storage) != ("storage", "none")],
         lambda n: f"{flag(n)} {getattr(cfg, n)} is ignored by --model {cfg.model}{extra}: "
                   "drop it or pick another --model"),
        (STORAGE_IGNORES[cfg.storage] if cfg.model in MODELS_WITH_L3 else (),
         lambda n: f"{flag(n)} {getattr(cfg, n)} is ignored by --storage {cfg.storage}: drop it "
                   "or pick another --storage"),
        (() if cfg.storage_master else ("storage_metadata",),
         lambda n: "--storage-metadata is ignored without --storage-master (the local store "
                   "brings its own metadata server)"),
        (MULTI_INSTANCE_OPTIONS[1:],
         lambda n: f"{flag(n)} is an option of the multi-instance mode: add --storage mooncake "
                   "--instances N"),
    )
    for names, message in rules:
        for name in names:
            if name in given:
                raise UsageError(message(name))


def check_storage_dir(directory: str) -> None:
    """``UsageError`` unless ``directory`` is (or can be created as) a writable directory; it is
    created when missing (the run would create it anyway)."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise UsageError(f"--storage-dir {directory}: exists and is not a directory; expected "
                         "a directory (created when missing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".mem-cache-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"--storage-dir {directory}: cannot be created or written "
                         f"({exc.strerror or exc}); expected a directory this user can "
                         "create and write") from None


def check_output_path(option: str, target: str) -> None:
    """``UsageError`` unless ``target`` can be written (its folder exists, it is not a folder):
    checked before the run so a finished run never loses its result."""
    path = Path(target)
    if path.is_dir():
        raise UsageError(f"{option} {target}: is a directory; expected a file path")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"{option} {target}: folder {str(parent)!r} does not exist; expected "
                         "a file in an existing folder")
    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise UsageError(f"{option} {target}: cannot be written ({exc.strerror or exc})") \
            from None
    if not existed:
        path.unlink()
