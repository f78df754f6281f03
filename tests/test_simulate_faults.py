"""Issue 13 items 7-8 (simulator): injected faults fail *inside* the packages' calls, and a host
size that holds no page is an error, not a silent fallback to the default ratio."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from tools.simulate import SimConfig, run_simulation
from tools.simulate.cli import main
from tools.simulate.faults import FailingDevicePool, FaultInjector, InjectedTransferError
from tools.simulate.hicache import HostTransfers
from tools.simulate.stack import MemoryStack, build_stack
from tools.simulate.stats import SimStats

TINY = SimConfig(
    layers=2,
    heads=2,
    head_dim=16,
    device_tokens=1024,
    host_tokens=2048,
    requests=24,
    max_running=8,
    system_prompts=2,
    prompt_mu=3.5,
    output_mu=2.5,
    max_prompt=128,
    max_output=32,
    arrival_per_step=0.5,
    think_steps=4,
)


def _spy(stack: MemoryStack, name: str, seen: list[BaseException]) -> None:
    """Record the exceptions the host pool's own method ``name`` raises."""
    real = getattr(stack.host_pool, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return real(*args, **kwargs)
        except BaseException as exc:
            seen.append(exc)
            raise

    setattr(stack.host_pool, name, wrapper)


def _prefix(stack: MemoryStack) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    slots = stack.allocator.alloc(32)
    host_slots = stack.host_pool.alloc(32)
    assert slots is not None and host_slots is not None
    sessions = torch.full((32,), 5, dtype=torch.int64)
    positions = torch.arange(32)
    stack.write_kv(slots, sessions, positions)
    return slots, host_slots, sessions, positions


def test_failing_device_pool_raises_inside_the_package() -> None:
    pool = FailingDevicePool(InjectedTransferError("boom"))
    with pytest.raises(InjectedTransferError, match="boom"):
        pool.get_buffer_desc()
    assert pool.calls == 1


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_injected_load_fault_fails_the_host_pool_call_and_its_abort_path_runs(seed: int) -> None:
    stack = build_stack(TINY, max_context_len=64)
    stats = SimStats()
    seen: list[BaseException] = []
    transfers = HostTransfers(stack, stats, FaultInjector(1.0, seed))
    try:
        slots, host_slots, sessions, positions = _prefix(stack)
        stack.host_pool.backup_from_device_all_layer(stack.kv_pool, host_slots, slots, "kernel")
        stack.allocator.free(slots)
        _spy(stack, "load_to_device_per_layer", seen)
        counter = stack.host_pool.layer_done_counter
        aborted_with: list[BaseException | None] = []
        real_abort = counter.abort

        def abort(exc: BaseException | None = None) -> None:
            aborted_with.append(exc)
            real_abort(exc)

        counter.abort = abort  # type: ignore[method-assign]
        device_slots = stack.allocator.alloc(32)
        assert device_slots is not None
        assert transfers.load(host_slots, device_slots, sessions, positions) is False
        # the package call itself failed with the injected error ...
        assert [type(e) for e in seen] == [InjectedTransferError]
        # ... and the package's error path aborted the batch with that very error
        assert aborted_with == seen
        assert stats.integrity_failures == 0
    finally:
        transfers.close()
        stack.host_pool.close()


def test_injected_backup_fault_fails_the_host_pool_call() -> None:
    stack = build_stack(TINY, max_context_len=64)
    stats = SimStats()
    seen: list[BaseException] = []
    transfers = HostTransfers(stack, stats, FaultInjector(1.0, 0))
    try:
        slots, host_slots, _, _ = _prefix(stack)
        _spy(stack, "backup_from_device_all_layer", seen)
        assert transfers.backup(slots, host_slots) is False
        assert InjectedTransferError in [type(e) for e in seen]
        stat = stats.transfers["d2h backup"]
        assert stat.failed + stat.aborted == 1
    finally:
        transfers.close()
        stack.host_pool.close()


def test_run_with_faults_is_clean() -> None:
    stats = run_simulation(dataclasses.replace(TINY, faults=0.3, page_size=16))
    assert stats.faults_injected > 0
    assert stats.integrity_failures == 0
    assert not stats.leaked


@pytest.mark.parametrize("tokens", [1, 10, 15])
def test_host_tokens_below_one_page_is_an_error(
    tokens: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(
        ValueError, match=rf"--host-tokens must hold at least one page .* got {tokens}"
    ):
        dataclasses.replace(TINY, host_tokens=tokens).validate()
    assert main(["--host-tokens", str(tokens), "--no-progress"]) == 2
    assert "--host-tokens must hold at least one page" in capsys.readouterr().err
