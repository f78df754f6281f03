"""``CompressStatePool``: per-request ring buffers of compressor state (private; re-exported by
:mod:`mem_cache_pool.deepseek_v4`)."""

from __future__ import annotations

import torch

from mem_cache_kernels import checks
from mem_cache_kernels.checks import check_dtype
from mem_cache_pool._checks import check_layer, check_rows, check_slots
from mem_cache_pool.base import KVBufferDesc

__all__ = ["CompressStatePool"]


class CompressStatePool:
    """Ring buffers holding the not-yet-compressed tokens' compressor state, per request.

    A DeepSeek-V4 compressor turns every ``ratio`` tokens (with overlap: a sliding window of
    ``ring_size`` tokens) into one compressed KV entry; until then the per-token projected KV and
    gating scores wait here. Request slot ``r`` (``1..size``; 0 is the padding request, as in
    ``ReqToTokenPool``) owns rows ``[r * ring_size, (r + 1) * ring_size)``; position ``p`` of
    the request lives in row ``r * ring_size + p % ring_size`` (:meth:`ring_loc`).

    Per layer (``layer_index`` is local, ``0..layer_num-1``): ``kv_state[l]`` and
    ``score_state[l]``, each ``[(size + 1) * ring_size, state_dim]`` of ``dtype``, zeroed.
    Descriptor roles ``("kv_state", "score_state")`` with one row per ring entry
    (``page_size = ring_size``, ``size = size * ring_size``).
    """

    def __init__(  # noqa: PLR0917 (positional like the other pools)
        self,
        size: int,
        ring_size: int,
        state_dim: int,
        layer_num: int,
        device: str | torch.device,
        dtype: torch.dtype = torch.float32,
        *,
        debug: bool = False,
    ) -> None:
        self.size = checks.check_int("size", size, minimum=0)
        self.ring_size = checks.check_int("ring_size", ring_size, minimum=1)
        self.state_dim = checks.check_int("state_dim", state_dim, minimum=1)
        self.layer_num = checks.check_int("layer_num", layer_num, minimum=1)
        if not check_dtype("dtype", dtype).is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype}")
        self.dtype = dtype
        self.device = checks.check_device_arg("device", device)
        self.debug = checks.debug_enabled(debug)
        rows = (self.size + 1) * self.ring_size
        self.kv_state = [
            torch.zeros((rows, state_dim), dtype=dtype, device=self.device)
            for _ in range(layer_num)
        ]
        self.score_state = [torch.zeros_like(t) for t in self.kv_state]
        self._desc: KVBufferDesc | None = None

    def ring_loc(self, req_pool_indices: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rows of ``(request slot, position)`` pairs: ``req * ring_size + pos % ring_size``."""
        req = check_slots(
            "req_pool_indices", req_pool_indices, self.device, self.size + 1, full=self.debug
        )
        pos = check_slots(
            "positions", positions, self.device, 2**62, full=self.debug, length=req.numel()
        )
        return req.long() * self.ring_size + pos.long() % self.ring_size

    def _layer(self, layer_index: int) -> int:
        return check_layer("layer_index", layer_index, 0, self.layer_num)

    def set_state(
        self,
        layer_index: int,
        req_pool_indices: torch.Tensor,
        positions: torch.Tensor,
        kv_state: torch.Tensor,
        score_state: torch.Tensor,
    ) -> None:
        """Write ``kv_state``/``score_state`` (``[n, state_dim]``, cast to ``dtype``) at the ring
        rows of ``(req_pool_indices[i], positions[i])`` of one layer. Validates first."""
        layer = self._layer(layer_index)
        rows = self.ring_loc(req_pool_indices, positions)
        shape = (rows.numel(), self.state_dim)
        kv = check_rows("kv_state", kv_state, shape, self.device)
        score = check_rows("score_state", score_state, shape, self.device)
        self.kv_state[layer][rows] = kv.to(self.dtype)
        self.score_state[layer][rows] = score.to(self.dtype)

    def get_state(
        self, layer_index: int, req_pool_indices: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(kv_state, score_state)`` rows ``[n, state_dim]`` (copies) of one layer."""
        layer = self._layer(layer_index)
        rows = self.ring_loc(req_pool_indices, positions)
        return self.kv_state[layer][rows], self.score_state[layer][rows]

    def clear(self, req_pool_indices: torch.Tensor) -> None:
        """Zero the whole ring of each request slot in ``req_pool_indices``, every layer."""
        req = check_slots(
            "req_pool_indices", req_pool_indices, self.device, self.size + 1, full=self.debug
        )
        ring = torch.arange(self.ring_size, device=self.device)
        rows = (req.long()[:, None] * self.ring_size + ring).reshape(-1)
        for t in (*self.kv_state, *self.score_state):
            t[rows] = 0

    def get_total_bytes(self) -> int:
        """Bytes of every state buffer."""
        return sum(t.numel() * t.element_size() for t in (*self.kv_state, *self.score_state))

    def get_buffer_desc(self) -> KVBufferDesc:
        """Descriptor: roles ``("kv_state", "score_state")``, one row per ring entry."""
        if self._desc is None:
            buffers = (tuple(self.kv_state), tuple(self.score_state))
            ptrs = [t.data_ptr() for role in buffers for t in role]
            row_bytes = self.state_dim * self.kv_state[0].element_size()
            self._desc = KVBufferDesc(
                roles=("kv_state", "score_state"),
                buffers=buffers,
                row_shape=((self.state_dim,), (self.state_dim,)),
                row_bytes=(row_bytes, row_bytes),
                data_ptrs=torch.tensor(ptrs, dtype=torch.int64, device=self.device).view(
                    torch.uint64
                ),
                size=self.size * self.ring_size,
                page_size=self.ring_size,
                layer_num=self.layer_num,
                start_layer=0,
                dtype=self.dtype,
                store_dtype=self.dtype,
                device=self.device,
            )
        return self._desc
