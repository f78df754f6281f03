"""Random write / move / retract sequences against a plain dict model ``slot -> row bytes``.

A *row* here is every byte a pool keeps for one slot across all layers and roles (for DSA also the
token's index key and scale inside its page). The model starts empty (absent = all-zero row). Writes
to slot 0 (the padding slot) are dropped by the stores that skip it (MHA ``set_kv_buffer``, as in
SGLang 0.5.23); moves and CPU-copy reloads write it.
"""

from __future__ import annotations

from collections.abc import Callable

import hypothesis.strategies as st
import torch
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mem_cache_pool import DSATokenToKVPool, KVCache, MHATokenToKVPool

_SETTINGS = settings(max_examples=20, stateful_step_count=12, deadline=None)

# ----------------------------------------------------------------------------- adapters
# each adapter: (make pool, row bytes, write(pool, slots, bytes [n, B]), read(pool, slots))

_L = 2


def _make_mha() -> KVCache:
    return MHATokenToKVPool(12, 2, torch.float8_e5m2, 2, 4, _L, "cpu", v_head_dim=2)


def _write_mha(pool: KVCache, slots: torch.Tensor, data: torch.Tensor) -> None:
    n = slots.numel()
    for layer, part in enumerate(data.view(n, _L, 12).unbind(1)):
        k = part[:, :8].reshape(n, 2, 4).view(torch.float8_e5m2)
        v = part[:, 8:].reshape(n, 2, 2).view(torch.float8_e5m2)
        pool.set_kv_buffer(layer, slots, k, v)


def _read_mha(pool: KVCache, slots: torch.Tensor) -> torch.Tensor:
    parts = []
    for layer in range(_L):
        k, v = pool.get_kv_buffer(layer)
        parts += [k[slots].reshape(len(slots), -1), v[slots].reshape(len(slots), -1)]
    return torch.cat([p.view(torch.uint8) for p in parts], dim=1)


def _make_dsa() -> KVCache:
    return DSATokenToKVPool(12, 4, torch.bfloat16, 8, 4, _L, "cpu")


_DSA_ROW = 24 + 128 + 4  # latent bf16 [1, 12], index key, fp32 scale


def _write_dsa(pool: KVCache, slots: torch.Tensor, data: torch.Tensor) -> None:
    assert isinstance(pool, DSATokenToKVPool)
    n = slots.numel()
    for layer, part in enumerate(data.view(n, _L, _DSA_ROW).unbind(1)):
        row = part.contiguous()
        pool.set_kv_buffer(layer, slots, row[:, :24].view(torch.bfloat16).view(n, 1, 12), None)
        scale = row[:, 152:].contiguous().view(torch.float32).reshape(n)
        pool.set_index_k_scale_buffer(layer, slots, row[:, 24:152], scale)


def _read_dsa(pool: KVCache, slots: torch.Tensor) -> torch.Tensor:
    assert isinstance(pool, DSATokenToKVPool)
    n = slots.numel()
    parts = []
    for layer in range(_L):
        parts += [
            pool.get_key_buffer(layer)[slots].reshape(n, -1).view(torch.uint8),
            pool.get_index_k(layer, slots).view(torch.uint8),
            pool.get_index_k_scale(layer, slots).view(torch.uint8).reshape(n, 4),
        ]
    return torch.cat(parts, dim=1)


# ----------------------------------------------------------------------------- machine


class _PoolModel(RuleBasedStateMachine):
    make: Callable[[], KVCache]
    write_rows: Callable[[KVCache, torch.Tensor, torch.Tensor], None]
    read_rows: Callable[[KVCache, torch.Tensor], torch.Tensor]
    row_bytes: int
    skips_padding_slot: bool

    def __init__(self) -> None:
        super().__init__()
        self.pool = type(self).make()
        self.rows = self.pool.num_rows
        self.model: dict[int, torch.Tensor] = {}

    def _expected(self, slot: int) -> torch.Tensor:
        return self.model.get(slot, torch.zeros(self.row_bytes, dtype=torch.uint8))

    def _pairs(self, data: st.DataObject) -> tuple[list[int], list[int]]:
        slots = st.integers(0, self.rows - 1)
        tgt = data.draw(st.lists(slots, min_size=1, max_size=5, unique=True), label="tgt")
        src = data.draw(st.lists(slots, min_size=len(tgt), max_size=len(tgt)), label="src")
        return tgt, src

    def _apply_move(self, tgt: list[int], src: list[int]) -> None:
        old = [self._expected(s) for s in src]  # all reads before any write
        for t, row in zip(tgt, old):
            self.model[t] = row

    @rule(data=st.data(), seed=st.integers(0, 2**31 - 1))
    def write(self, data: st.DataObject, seed: int) -> None:
        slots = data.draw(
            st.lists(st.integers(0, self.rows - 1), min_size=1, max_size=5, unique=True)
        )
        gen = torch.Generator().manual_seed(seed)
        rows = torch.randint(0, 256, (len(slots), self.row_bytes), dtype=torch.uint8, generator=gen)
        type(self).write_rows(self.pool, torch.tensor(slots), rows)
        for s, row in zip(slots, rows):
            if not (s == 0 and type(self).skips_padding_slot):
                self.model[s] = row.clone()

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def move(self, data: st.DataObject) -> None:
        tgt, src = self._pairs(data)
        self.pool.move_kv_cache(torch.tensor(tgt), torch.tensor(src))
        self._apply_move(tgt, src)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def retract_and_reload(self, data: st.DataObject) -> None:
        tgt, src = self._pairs(data)
        src = list(dict.fromkeys(src))[: len(tgt)]
        tgt = tgt[: len(src)]
        copy = self.pool.get_cpu_copy(torch.tensor(src))
        self.pool.load_cpu_copy(copy, torch.tensor(tgt))
        self._apply_move(tgt, src)

    @invariant()
    def matches_model(self) -> None:
        actual = type(self).read_rows(self.pool, torch.arange(self.rows))
        for slot in range(self.rows):
            assert torch.equal(actual[slot], self._expected(slot)), f"slot {slot} differs"


class MHAPoolModel(_PoolModel):
    make = staticmethod(_make_mha)
    write_rows = staticmethod(_write_mha)
    read_rows = staticmethod(_read_mha)
    row_bytes = _L * 12
    skips_padding_slot = True


class DSAPoolModel(_PoolModel):
    make = staticmethod(_make_dsa)
    write_rows = staticmethod(_write_dsa)
    read_rows = staticmethod(_read_dsa)
    row_bytes = _L * _DSA_ROW
    skips_padding_slot = False  # packed-row and index-key stores write slot 0


TestMHAPoolModel = MHAPoolModel.TestCase
TestMHAPoolModel.settings = _SETTINGS
TestDSAPoolModel = DSAPoolModel.TestCase
TestDSAPoolModel.settings = _SETTINGS
