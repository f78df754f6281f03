"""Deterministic K/V content: each stored byte is a function of (session, position, layer, role).

A row is ``pattern[role] XOR seed`` where ``seed`` comes from a 31-bit hash of
(session, position, layer, role) and ``pattern[role]`` is a fixed seeded random vector; the
first ``shared_tokens`` positions of every session hash as one common session (a system preamble
all sessions share: identical bytes across sessions). Two different tokens differ in (nearly)
every element; everything is integer arithmetic (exact on any
device); the second-highest bit of every element is cleared so that no element is NaN or Inf in
any supported float format (fp8 e4m3fn/e5m2, fp16, bf16, fp32) and copies or same-dtype casts
keep the bytes. Expected rows are compared as integers, never as floats.

Hashes are computed for all layers and roles of a token batch at once (``hashes``), so writing or
verifying ``L`` layers costs one small hashing pass plus one XOR per layer and role.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ContentModel", "int_view_dtype"]

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_M31 = (1 << 31) - 1
_SHARED_SESSION = _M31  # the session every shared-preamble position hashes as


def int_view_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype of the same width as ``dtype`` (for bit-exact comparisons)."""
    width = torch.empty((), dtype=dtype).element_size()
    return _INT_OF_WIDTH[width]


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
    the same bytes). Positions below ``shared_tokens`` have content that does not depend on
    the session.
    """

    def __init__(
        self,
        row_shapes: Sequence[tuple[int, ...]],
        dtype: torch.dtype,
        device: torch.device,
        seed: int,
        shared_tokens: int = 0,
    ) -> None:
        if shared_tokens < 0:
            raise ValueError(f"shared_tokens must be >= 0, got {shared_tokens}")
        self.shared_tokens = shared_tokens
        self.row_shapes = tuple(tuple(s) for s in row_shapes)
        self.roles = len(self.row_shapes)
        self.dtype = dtype
        self.device = device
        self.int_dtype = int_view_dtype(dtype)
        width = torch.empty((), dtype=dtype).element_size()
        self._bits = 8 * width
        # clear the second-highest bit: the top exponent bit of every float format we support
        self._lane_mask = ((1 << self._bits) - 1) ^ (1 << (self._bits - 2))
        gen = torch.Generator().manual_seed(seed)
        self._patterns: list[torch.Tensor] = []
        for shape in self.row_shapes:
            row_bytes = width
            for d in shape:
                row_bytes *= d
            if row_bytes % 8:
                raise ValueError(f"row bytes must be a multiple of 8, got {row_bytes} for {shape}")
            # rows are generated as int64 words (8 // width lanes each) and viewed as elements
            raw = torch.randint(0, 256, (row_bytes,), generator=gen, dtype=torch.uint8)
            words = raw.view(torch.int64) & self._word(torch.full((1,), -1, dtype=torch.int64))
            self._patterns.append(words.to(device))

    def _word(self, h: torch.Tensor) -> torch.Tensor:
        """One int64 word per hash: the hash spread over every lane, each lane masked."""
        lanes = 64 // self._bits
        word = torch.zeros_like(h)
        for k in range(lanes):
            shift = 8 * (k % 3) if self._bits == 8 else 0  # 8-bit lanes: different hash bytes
            lane = (h >> shift) & self._lane_mask
            word |= lane << (self._bits * k)
        return word

    def hashes(self, sessions: torch.Tensor, positions: torch.Tensor, layers: int) -> torch.Tensor:
        """Token seed words ``[layers, roles, n]`` (int64: a 31-bit hash spread over the lanes of
        one word) for int64 ``sessions``/``positions`` (local layers ``0..layers-1``)."""
        if self.shared_tokens:
            sessions = torch.where(positions < self.shared_tokens, _SHARED_SESSION, sessions)
        base = ((sessions & _M31) * 0x5BD1E995 + (positions & _M31) * 0x27D4EB2F) & _M31
        lr = torch.arange(layers * self.roles, dtype=torch.int64, device=base.device)
        salt = ((lr // self.roles * 8 + lr % self.roles + 1) * 0x165667B1) & _M31
        mixed = _mix(base.unsqueeze(0) ^ salt.unsqueeze(1))
        return self._word(mixed).view(layers, self.roles, -1)

    def rows_int_from(self, h: torch.Tensor, role: int) -> torch.Tensor:
        """Expected rows as integers, ``[n, *row_shapes[role]]``, from seed words ``h`` ``[n]``
        (a ``hashes(...)[layer, role]`` slice)."""
        words = self._patterns[role].unsqueeze(0) ^ h.unsqueeze(1)
        return words.view(self.int_dtype).view(-1, *self.row_shapes[role])

    def rows_from(self, h: torch.Tensor, role: int) -> torch.Tensor:
        """Expected rows in the logical dtype (what a model passes to ``set_kv_buffer``)."""
        return self.rows_int_from(h, role).view(self.dtype)

    def rows(
        self, sessions: torch.Tensor, positions: torch.Tensor, layer: int, role: int
    ) -> torch.Tensor:
        """Expected rows of one (layer, role) in the logical dtype."""
        return self.rows_from(self.hashes(sessions, positions, layer + 1)[layer, role], role)

    def mismatches(self, stored: torch.Tensor, h: torch.Tensor, role: int) -> int:
        """Tokens whose ``stored`` row (any dtype of the element width) differs from the
        expected row for hashes ``h`` ``[n]``."""
        got = stored.reshape(stored.shape[0], -1).view(self.int_dtype)
        want = self.rows_int_from(h, role).reshape(got.shape[0], -1)
        if got.device != want.device:
            got = got.to(want.device)
        if torch.equal(got, want):
            return 0
        return int((got != want).any(dim=1).sum().item())
