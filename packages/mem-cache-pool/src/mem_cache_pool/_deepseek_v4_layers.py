"""Per-ratio configs and per-layer compress-state views of ``DeepSeekV4TokenToKVPool`` (private;
re-exported by :mod:`mem_cache_pool.deepseek_v4`).

SGLang 0.5.23 keeps one compress-state pool per layer (``compress_state_pools[layer_id]``); ours
keeps one :class:`~mem_cache_pool.deepseek_v4.CompressStatePool` per ratio with a layer axis.
:class:`CompressStateLayer` is the per-layer view the SGLang-named lists and getters return.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mem_cache_pool._deepseek_v4_state import CompressStatePool

__all__ = ["CompressStateLayer", "CompressedPoolConfig", "clear_state_rows"]


@dataclass(frozen=True)
class CompressedPoolConfig:
    """Sizes of one compress ratio's sub-pools (SGLang's ``_CompressedPoolConfig``).

    ``kv_size``: slots of the compressed KV pool; ``state_size``: request slots of the
    compress-state ring pool (ours are request-addressed: rows ``(state_size + 1) * ring``);
    ``state_dtype``; ``indexer_size``: slots of the indexer pool (ratio 4 only, else None).
    """

    kv_size: int
    state_size: int
    state_dtype: torch.dtype
    indexer_size: int | None = None


@dataclass(frozen=True)
class CompressStateLayer:
    """One layer of a :class:`~mem_cache_pool.deepseek_v4.CompressStatePool` (what SGLang's
    per-layer state pool is).

    ``ratio`` (4 or 128), ``request_scoped`` (True for ratio 128: the ring belongs to a request
    slot and travels as PD request state; ratio 4 follows the window pages in SGLang),
    ``online`` (always False: SGLang's online c128 state is not provided). Request slot ``r``
    owns rows ``[r * ring_size, (r + 1) * ring_size)`` of :attr:`kv_state` / :attr:`score_state`.
    """

    pool: CompressStatePool
    layer_index: int
    ratio: int
    request_scoped: bool
    online: bool = False

    @property
    def ring_size(self) -> int:
        """Rows of one request's ring."""
        return self.pool.ring_size

    @property
    def kv_state(self) -> torch.Tensor:
        """This layer's kv-state rows ``[(size + 1) * ring_size, state_dim]`` (a view)."""
        return self.pool.kv_state[self.layer_index]

    @property
    def score_state(self) -> torch.Tensor:
        """This layer's score-state rows (same shape as :attr:`kv_state`; a view)."""
        return self.pool.score_state[self.layer_index]

    def get_state(
        self, req_pool_indices: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`mem_cache_pool.deepseek_v4.CompressStatePool.get_state` of this layer."""
        return self.pool.get_state(self.layer_index, req_pool_indices, positions)

    def set_state(
        self,
        req_pool_indices: torch.Tensor,
        positions: torch.Tensor,
        kv_state: torch.Tensor,
        score_state: torch.Tensor,
    ) -> None:
        """:meth:`mem_cache_pool.deepseek_v4.CompressStatePool.set_state` of this layer."""
        self.pool.set_state(self.layer_index, req_pool_indices, positions, kv_state, score_state)


def clear_state_rows(layer: CompressStateLayer, rows: torch.Tensor) -> None:
    """SGLang's ``KVAndScore.clear`` on ``rows`` of one layer: kv 0, score -inf (trusted rows)."""
    if rows.numel():
        layer.kv_state[rows] = 0
        layer.score_state[rows] = float("-inf")
