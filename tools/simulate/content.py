"""Deterministic K/V content: each stored byte is a function of (session, position, layer, role).

A row is ``pattern[role] XOR token_seed`` where ``token_seed`` is a 32-bit hash of
(session, position, layer, role) truncated to the element width and ``pattern[role]`` a fixed
seeded random vector. Two different tokens differ in every element, the values are generated in
integer arithmetic (exact on any device), and the second-highest bit of every element is cleared
so no element is NaN or Inf in any float format (fp8 e4m3fn/e5m2, fp16, bf16, fp32): copies and
casts to the same dtype keep the bytes. Expected rows are compared as integers, never as floats.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ContentModel", "int_view_dtype"]

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_M31 = (1 << 31) - 1


def int_view_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype of the same width as ``dtype`` (for bit-exact comparisons)."""
    width = torch.empty((), dtype=dtype).element_size()
    return _INT_OF_WIDTH[width]


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def _mix(h: torch.Tensor) -> torch.Tensor:
    """A 31-bit integer mixer on int64 tensors (no overflow: operands stay below 2**31)."""
    h = (h ^ (h >> 15)) & _M31
    h = (h * 0x2C1B3C6D) & _M31
    h = (h ^ (h >> 12)) & _M31
    h = (h * 0x297A2D39) & _M31
    return h ^ (h >> 15)


class ContentModel:
    """Generates and checks the rows of one pool geometry.

    ``row_shapes[r]`` is the per-token shape of role ``r`` (e.g. ``(heads, head_dim)``);
    ``dtype`` the logical dtype written through ``set_kv_buffer`` (fp8 pools store it as uint8,
    the same bytes).
    """

    def __init__(
        self,
        row_shapes: Sequence[tuple[int, ...]],
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
    ) -> None:
        self.row_shapes = tuple(tuple(s) for s in row_shapes)
        self.dtype = dtype
        self.device = device
        self.int_dtype = int_view_dtype(dtype)
        bits = 8 * torch.empty((), dtype=dtype).element_size()
        self._bits = bits
        # clear the second-highest bit: the top exponent bit of every float format we support
        self._mask = _signed(((1 << bits) - 1) ^ (1 << (bits - 2)), bits)
        gen = torch.Generator().manual_seed(seed)
        self._patterns: list[torch.Tensor] = []
        self._shifts: list[torch.Tensor] = []
        for shape in self.row_shapes:
            numel = 1
            for d in shape:
                numel *= d
            raw = torch.randint(0, 1 << 31, (numel,), generator=gen, dtype=torch.int64)
            self._patterns.append(self._to_width(raw).to(device))
            self._shifts.append((torch.arange(numel, dtype=torch.int64) % 3 * 8).to(device))

    def _to_width(self, values: torch.Tensor) -> torch.Tensor:
        """Low ``bits`` bits of int64 ``values`` as the same-width integer dtype."""
        low = values & ((1 << self._bits) - 1)
        if self.int_dtype != torch.uint8:
            low = torch.where(low >= 1 << (self._bits - 1), low - (1 << self._bits), low)
        return low.to(self.int_dtype)

    @staticmethod
    def _hash(
        sessions: torch.Tensor, positions: torch.Tensor, layer: int, role: int
    ) -> torch.Tensor:
        h = ((sessions & _M31) * 0x5BD1E995 + (positions & _M31) * 0x27D4EB2F) & _M31
        return _mix(h ^ ((layer * 8 + role + 1) * 0x165667B1 & _M31))

    def seeds(
        self, sessions: torch.Tensor, positions: torch.Tensor, layer: int, role: int
    ) -> torch.Tensor:
        """Per-token seeds (int of the element width) for int64 ``sessions``/``positions``."""
        return self._to_width(self._hash(sessions, positions, layer, role))

    def rows_int(
        self, sessions: torch.Tensor, positions: torch.Tensor, layer: int, role: int
    ) -> torch.Tensor:
        """Expected rows as integers: shape ``[n, *row_shapes[role]]``."""
        if self._bits >= 16:
            seed = self.seeds(sessions, positions, layer, role).unsqueeze(1)
        else:  # 8-bit: spread 24 hash bits over the row so two tokens rarely share a row
            shifts = self._shifts[role]
            seed = self._to_width(self._hash(sessions, positions, layer, role)[:, None] >> shifts)
        rows = (self._patterns[role].unsqueeze(0) ^ seed) & self._mask
        return rows.view(-1, *self.row_shapes[role])

    def rows(
        self, sessions: torch.Tensor, positions: torch.Tensor, layer: int, role: int
    ) -> torch.Tensor:
        """Expected rows in the logical dtype (what a model would pass to ``set_kv_buffer``)."""
        return self.rows_int(sessions, positions, layer, role).view(self.dtype)

    def mismatches(
        self,
        stored: torch.Tensor,
        sessions: torch.Tensor,
        positions: torch.Tensor,
        layer: int,
        role: int,
    ) -> int:
        """Number of tokens whose ``stored`` row (any dtype of the same width) is not bit-exact."""
        got = stored.reshape(stored.shape[0], -1).view(self.int_dtype)
        want = self.rows_int(sessions, positions, layer, role).reshape(got.shape[0], -1)
        if got.device != want.device:
            got = got.to(want.device)
        return int((got != want).any(dim=1).sum().item())
