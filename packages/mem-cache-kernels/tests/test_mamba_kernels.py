"""Mamba state-slot ops (:mod:`mem_cache_kernels.mamba`): torch and Triton (interpreter) against
an advanced-indexing oracle, bit-exact; negative pairs skipped; overlap-safe copies; the error
rule (checks before any byte moves)."""

from __future__ import annotations

import pytest
import torch

from mem_cache_kernels import mamba as ops

BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.triton)]
IDX = [torch.int32, torch.int64]


@pytest.fixture(autouse=True)
def _interpret(request: pytest.FixtureRequest) -> None:
    if "triton" in request.node.name:
        request.getfixturevalue("triton_interpret")


def _bits(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8).view(dtype).view(shape)


def _states(slots: int) -> list[torch.Tensor]:
    """bf16 conv windows, fp32 temporal states, an odd-byte entry (1-byte words)."""
    return [
        _bits((3, slots, 6, 3), torch.bfloat16),
        _bits((3, slots, 2, 4, 8), torch.float32),
        _bits((2, slots, 7), torch.uint8),
    ]


def _eq(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("idx", IDX)
def test_copy_matches_the_oracle_with_overlap_and_skips(backend: str, idx: torch.dtype) -> None:
    states = _states(12)
    before = [t.clone() for t in states]
    src = torch.tensor([1, 2, 3, -1, 7], dtype=idx)
    dst = torch.tensor([2, 3, 9, 5, -1], dtype=idx)  # 2 and 3 are also sources: overlap
    ops.copy_state_slots(states, src, dst, backend=backend)
    for got, old in zip(states, before):
        want = old.clone()
        want[:, [2, 3, 9]] = old[:, [1, 2, 3]]
        assert _eq(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("idx", IDX)
def test_gather_then_scatter_round_trips(backend: str, idx: torch.dtype) -> None:
    states = _states(10)
    host = [torch.zeros((t.shape[0], 6, *t.shape[2:]), dtype=t.dtype) for t in states]
    slots = torch.tensor([9, 0, 4, 5], dtype=idx)
    order = torch.tensor([5, 1, 0, 3], dtype=idx)
    ops.gather_state_slots(states, slots, host, order, backend=backend)
    for h, t in zip(host, states):
        assert _eq(h[:, [5, 1, 0, 3]], t[:, [9, 0, 4, 5]])
        assert not h[:, [2, 4]].view(torch.uint8).any()  # untouched host slots
    fresh = [torch.zeros_like(t) for t in states]
    ops.scatter_state_slots(fresh, slots, host, order, backend=backend)
    for f, t in zip(fresh, states):
        assert _eq(f[:, [9, 0, 4, 5]], t[:, [9, 0, 4, 5]])
        assert not f[:, [1, 2, 3, 6, 7, 8]].view(torch.uint8).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_default_order_and_skips(backend: str) -> None:
    states = _states(8)
    out = [torch.zeros((t.shape[0], 3, *t.shape[2:]), dtype=t.dtype) for t in states]
    ops.gather_state_slots(states, torch.tensor([3, -1, 6]), out, backend=backend)
    for o, t in zip(out, states):
        assert _eq(o[:, 0], t[:, 3]) and _eq(o[:, 2], t[:, 6])
        assert not o[:, 1].view(torch.uint8).any()


def test_backends_agree_bit_exact_on_random_streams(triton_interpret: None) -> None:
    gen = torch.Generator().manual_seed(3)
    for _ in range(4):
        a = _states(20)
        b = [t.clone() for t in a]
        perm = torch.randperm(19, generator=gen)[:8] + 1
        ops.copy_state_slots(a, perm[:4], perm[4:], backend="torch")
        ops.copy_state_slots(b, perm[:4], perm[4:], backend="triton")
        assert all(_eq(x, y) for x, y in zip(a, b))


def test_empty_slots_change_nothing() -> None:
    states = _states(4)
    before = [t.clone() for t in states]
    empty = torch.empty(0, dtype=torch.int64)
    ops.copy_state_slots(states, empty, empty)
    ops.scatter_state_slots(states, empty, [t[:, :0].clone() for t in states])
    assert all(_eq(x, y) for x, y in zip(states, before))


def test_bad_input_raises_before_any_write() -> None:
    states = _states(6)
    before = [t.clone() for t in states]
    two = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="src_slots"):
        ops.copy_state_slots(states, two.float(), two)
    with pytest.raises(ValueError, match="dst_slots must index"):
        ops.copy_state_slots(states, two, torch.tensor([3, 6]))
    with pytest.raises(ValueError, match="dst_slots must not repeat"):
        ops.copy_state_slots(states, two, torch.tensor([3, 3]))
    with pytest.raises(ValueError, match=r"length"):
        ops.copy_state_slots(states, two, torch.tensor([3]))
    with pytest.raises(ValueError, match="states\\[0\\]"):
        ops.copy_state_slots([torch.zeros(4, 4)], two, two)
    with pytest.raises(TypeError, match="states"):
        ops.copy_state_slots(states[0], two, two)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.copy_state_slots([states[0].transpose(2, 3)], two, two)
    out = [torch.zeros((t.shape[0], 2, *t.shape[2:]), dtype=t.dtype) for t in states]
    with pytest.raises(TypeError, match=r"out\[1\] must be torch\.float32"):
        ops.gather_state_slots(states, two, [out[0], out[1].double(), out[2]])
    with pytest.raises(ValueError, match="out\\[0\\] must be"):
        ops.gather_state_slots(states, two, [out[0][:2], out[1], out[2]])
    with pytest.raises(ValueError, match="out must hold 3"):
        ops.gather_state_slots(states, two, out[:2])
    with pytest.raises(ValueError, match="out_slots must index"):
        ops.gather_state_slots(states, two, out, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="src_slots must index"):
        ops.scatter_state_slots(states, two, out, torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="backend"):
        ops.copy_state_slots(states, two, torch.tensor([3, 4]), backend="cuda")  # type: ignore[arg-type]
    assert all(_eq(x, y) for x, y in zip(states, before))
