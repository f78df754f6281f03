"""64-bit addressing: rows more than 2**31 bytes from a buffer's start.

``torch.empty`` only reserves virtual memory, so a 2.2 GB buffer costs the few pages written.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import mem_cache_kernels as mk

ROW = 1024  # float32 elements = 4 KiB per row
ROWS = 2**31 // (ROW * 4) + 64  # the last rows start beyond 2**31 bytes


@pytest.fixture(scope="module")
def huge() -> Iterator[torch.Tensor]:
    try:
        buf = torch.empty(ROWS, ROW, dtype=torch.float32)
    except RuntimeError as exc:  # pragma: no cover - machine without overcommit
        pytest.skip(f"cannot reserve a 2 GiB buffer: {exc}")
    yield buf
    del buf


def _check(huge: torch.Tensor, backend: str) -> None:
    far = torch.tensor([ROWS - 1, ROWS - 40])
    assert far.min() * ROW * 4 > 2**31
    src = torch.randn(2, ROW)
    mk.transfer_rows([src], [huge], torch.tensor([0, 1]), far, backend=backend)  # type: ignore[arg-type]
    assert torch.equal(huge[ROWS - 1], src[0]) and torch.equal(huge[ROWS - 40], src[1])
    back = torch.zeros(2, ROW)
    mk.transfer_rows([huge], [back], far, torch.tensor([1, 0]), backend=backend)  # type: ignore[arg-type]
    assert torch.equal(back[1], src[0])
    # far -> far within the buffer (copy_all_layer goes through its temporary)
    mk.copy_all_layer_kv_cache(
        [huge], torch.tensor([ROWS - 2]), torch.tensor([ROWS - 1]), backend=backend
    )  # type: ignore[arg-type]
    assert torch.equal(huge[ROWS - 2], src[0])
    loc = torch.tensor([ROWS - 3], dtype=torch.int32)
    mk.store_kv(
        huge.view(ROWS, 4, ROW // 4),
        huge.view(ROWS, 4, ROW // 4),
        loc,
        src[:1].view(1, 4, -1),
        src[:1].view(1, 4, -1),
        backend=backend,
    )  # type: ignore[arg-type]
    assert torch.equal(huge[ROWS - 3], src[0])


def test_torch_path_far_rows(huge: torch.Tensor) -> None:
    _check(huge, "torch")


@pytest.mark.triton
@pytest.mark.usefixtures("triton_interpret")
def test_triton_interpreter_far_rows(huge: torch.Tensor) -> None:
    _check(huge, "triton")
