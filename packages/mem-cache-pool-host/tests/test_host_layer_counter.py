"""LayerDoneCounter: readers of layer i wait for layer i, aborts wake readers, resets."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool import LayerReadyWaiter
from mem_cache_pool_host import LayerDoneCounter, LayerLoadAbortedError, MHATokenToKVPoolHost

MakePool = Callable[..., Any]


def test_idle_counter_never_blocks() -> None:
    c = LayerDoneCounter(3)
    assert isinstance(c, LayerReadyWaiter)
    for i in range(3):
        c.wait_until(i, timeout=0)
        assert c.is_done(i)
    c.complete(1)  # no batch in flight: no-op


def test_readers_wake_in_layer_order() -> None:
    c = LayerDoneCounter(4)
    c.begin()
    woke: list[int] = []
    lock = threading.Lock()

    def reader(i: int) -> None:
        c.wait_until(i, timeout=10)
        with lock:
            woke.append(i)

    threads = [threading.Thread(target=reader, args=(i,)) for i in (3, 0, 2, 1)]
    for t in threads:
        t.start()
    for layer in range(4):
        time.sleep(0.02)
        with lock:
            assert woke == list(range(layer))  # nobody ahead of the loader
        c.complete(layer)
    for t in threads:
        t.join(10)
    assert woke == [0, 1, 2, 3]
    assert not c.in_flight


def test_wait_times_out_while_layer_pending() -> None:
    c = LayerDoneCounter(2)
    c.begin()
    c.complete(0)
    c.wait_until(0, timeout=0)
    with pytest.raises(TimeoutError, match="layer 1"):
        c.wait_until(1, timeout=0.01)


def test_abort_wakes_waiters_with_an_error_until_next_begin() -> None:
    c = LayerDoneCounter(2)
    c.begin()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            c.wait_until(1, timeout=10)
        except LayerLoadAbortedError as exc:
            errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.02)
    cause = OSError("copy failed")
    c.abort(cause)
    t.join(10)
    assert len(errors) == 1 and errors[0].__cause__ is cause
    with pytest.raises(LayerLoadAbortedError):
        c.wait_until(0, timeout=0)  # sticky: no silent read of a half-loaded batch
    c.begin()
    c.complete(0)
    c.complete(1)
    c.wait_until(1, timeout=0)


def test_begin_twice_and_double_complete_raise_and_reset_recovers() -> None:
    c = LayerDoneCounter(2)
    first = c.begin()
    with pytest.raises(RuntimeError, match="still in flight"):
        c.begin()
    c.complete(0)
    with pytest.raises(RuntimeError, match="completed twice"):
        c.complete(0)
    c.reset()
    c.wait_until(1, timeout=0)
    assert c.begin() == first + 1
    with pytest.raises(ValueError, match=r"layer_index must be <= 1, got 2"):
        c.wait_until(2)


def test_load_batch_context_aborts_on_error_and_on_missing_layers() -> None:
    c = LayerDoneCounter(2)
    with pytest.raises(KeyError), c.load_batch():
        c.complete(0)
        raise KeyError("boom")
    with pytest.raises(LayerLoadAbortedError):
        c.wait_until(1, timeout=0)
    with pytest.raises(RuntimeError, match="1/2 layers"), c.load_batch():
        c.complete(0)
    with c.load_batch():
        c.complete(1)
        c.complete(0)
    c.wait_until(1, timeout=0)


def test_device_pool_reads_wait_for_host_loads(make_pool: MakePool) -> None:
    device = make_pool("mha", torch.float16, page_size=1, size=16, layer_num=2, start_layer=4)
    host = MHATokenToKVPoolHost(device, layout="layer_first")
    counter = host.layer_done_counter
    device.register_layer_transfer_counter(counter)
    counter.begin()
    got: list[int] = []

    def forward() -> None:
        for layer_id in (4, 5):
            device.get_key_buffer(layer_id)
            got.append(layer_id)

    t = threading.Thread(target=forward)
    t.start()
    time.sleep(0.05)
    assert got == []
    counter.complete(0)
    time.sleep(0.05)
    assert got == [4]
    counter.complete(1)
    t.join(10)
    assert got == [4, 5]


def test_reader_sees_each_layer_loaded_when_its_wait_returns(make_pool: MakePool) -> None:
    layers = 4
    device = make_pool("mha", torch.float32, page_size=4, size=32, layer_num=layers, seed=7)
    host = MHATokenToKVPoolHost(device, layout="page_first")
    desc = device.get_buffer_desc()
    slots = torch.arange(4, 20)
    host.backup_from_device_all_layer(device, slots, slots)
    want = [desc.buffers[0][layer][slots].view(torch.uint8).clone() for layer in range(layers)]
    for b in desc.buffers[0] + desc.buffers[1]:
        b.zero_()
    device.register_layer_transfer_counter(host.layer_done_counter)
    seen: list[bool] = []
    gate = threading.Event()

    def forward() -> None:
        gate.set()
        for layer in range(layers):
            k = device.get_key_buffer(layer)  # blocks until the loader finished this layer
            seen.append(torch.equal(k[slots].view(torch.uint8), want[layer]))

    with host.layer_done_counter.load_batch():
        t = threading.Thread(target=forward)
        t.start()
        gate.wait(10)
        for layer in range(layers):
            time.sleep(0.01)  # give the reader a chance to run ahead (it must not)
            host.load_to_device_per_layer(device, slots, slots, layer)
    t.join(10)
    assert seen == [True] * layers


def test_consumer_pinned_to_a_batch_ignores_the_next_one() -> None:
    c = LayerDoneCounter(2, history=2)
    b1 = c.begin()
    c.complete(0)
    c.complete(1)
    c.set_consumer(b1)
    b2 = c.begin()
    assert b2 == b1 + 1 and c.in_flight
    c.wait_until(1, timeout=0)  # batch 1 is loaded even though batch 2 is running
    c.abort(RuntimeError("batch 2 failed"))
    c.wait_until(0, timeout=0)  # batch 2's abort does not fail batch 1's readers
    c.set_consumer(None)
    with pytest.raises(LayerLoadAbortedError):
        c.wait_until(0, timeout=0)
    c.set_consumer(b2 + 1)  # not begun yet: readers wait for it
    with pytest.raises(TimeoutError):
        c.wait_until(0, timeout=0.01)
    assert not c.is_done(0)
    c.begin()
    c.complete(0)
    c.wait_until(0, timeout=0)
    c.complete(1)
    c.set_consumer(b1)  # evicted from the history of 2: long finished
    c.wait_until(1, timeout=0)
    with pytest.raises(ValueError, match="batch_id"):
        c.set_consumer(0)
