"""Backend dispatch: env override, errors, lazy triton import (the table that dispatch reads
is tested in test_kernels_registry.py)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch

import mem_cache_kernels as mk


def test_import_does_not_import_triton() -> None:
    code = "import sys, mem_cache_kernels; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_env_override(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.zeros(1)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(mk.BACKEND_ENV_VAR, "torch")
    assert mk.resolve_backend("auto", cpu) == "torch"
    monkeypatch.setenv(mk.BACKEND_ENV_VAR, "triton")
    with pytest.raises(ValueError, match="needs GPU tensors or TRITON_INTERPRET=1"):
        mk.resolve_backend("auto", cpu)
    assert mk.resolve_backend("torch", cpu) == "torch"  # an explicit argument wins
    monkeypatch.setenv(mk.BACKEND_ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="MEM_CACHE_KERNELS_BACKEND must be one of"):
        mk.resolve_backend("auto", cpu)


def test_auto_is_torch_on_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(mk.BACKEND_ENV_VAR, raising=False)
    assert mk.resolve_backend("auto", torch.zeros(1)) == "torch"
    with pytest.raises(ValueError, match="backend must be one of"):
        mk.resolve_backend("Torch", torch.zeros(1))
    with pytest.raises(TypeError, match=r"backend must be one of .*, got int"):
        mk.resolve_backend(1, torch.zeros(1))  # type: ignore[arg-type]


def test_triton_on_cpu_without_interpreter_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    out = torch.empty(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        mk.alloc_decode(
            torch.tensor([1]), torch.tensor([-1]), torch.tensor([3]), out, 1, backend="triton"
        )


@pytest.mark.triton
@pytest.mark.usefixtures("triton_interpret")
def test_env_forces_interpreted_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(mk.BACKEND_ENV_VAR, "triton")
    src, dst = torch.arange(12.0).view(3, 4), torch.zeros(3, 4)
    mk.transfer_rows([src], [dst], torch.tensor([2, 0]), torch.tensor([0, 1]))
    assert torch.equal(dst[:2], src[[2, 0]])
    rows = importlib.import_module("mem_cache_kernels._triton.rows")
    assert type(rows._copy_rows_kernel).__name__ == "InterpretedFunction"


def test_triton_without_triton_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors without the interpreter are the caller's mistake (``ValueError``) whether or
    not triton is installed; with the interpreter on, a missing triton is a ``RuntimeError``."""
    from mem_cache_kernels import dispatch

    monkeypatch.setattr(dispatch, "triton_available", lambda: False)
    cpu = torch.zeros(1)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="needs GPU tensors or TRITON_INTERPRET=1"):
        mk.resolve_backend("triton", cpu)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="triton cannot be imported"):
        mk.resolve_backend("triton", cpu)
    assert mk.resolve_backend("auto", cpu) == "torch"
