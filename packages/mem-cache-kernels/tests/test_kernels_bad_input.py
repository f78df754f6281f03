"""Every op rejects caller mistakes before doing any work, with a message naming the argument."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import mem_cache_kernels as mk

I64 = torch.int64


def _i(*xs: int, dtype: torch.dtype = I64) -> torch.Tensor:
    return torch.tensor(xs, dtype=dtype)


def _caches() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)


K, V = torch.ones(2, 2, 4), torch.ones(2, 2, 4)
MLA = torch.zeros(8, 1, 6)
DEV = [[torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)], [torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)]]
HOST_PF = [torch.zeros(10, 2, 2, 4), torch.zeros(10, 2, 2, 4)]
HOST_PFD = [torch.zeros(5, 2, 2, 2, 4), torch.zeros(5, 2, 2, 2, 4)]

CASES: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    # store_kv
    (
        "store loc dtype",
        lambda: mk.store_kv(*_caches(), _i(1, 2).float(), K, V),
        TypeError,
        r"loc must be int32 or int64, got torch\.float32",
    ),
    (
        "store loc length",
        lambda: mk.store_kv(*_caches(), _i(1, 2, 3), K, V),
        ValueError,
        "same number of rows",
    ),
    (
        "store row shape",
        lambda: mk.store_kv(*_caches(), _i(1, 2), torch.ones(2, 2, 5), V),
        ValueError,
        r"k must have shape \[n, 2, 4\]",
    ),
    (
        "store loc range",
        lambda: mk.store_kv(*_caches(), _i(1, 8), K, V),
        ValueError,
        r"loc must index rows of k_cache \(< 8\), got index 8",
    ),
    (
        "store fp8 itemsize",
        lambda: mk.store_kv(
            torch.zeros(8, 2, 4, dtype=torch.uint8),
            torch.zeros(8, 2, 4, dtype=torch.uint8),
            _i(1, 2),
            K,
            V,
            dtype=torch.bfloat16,
        ),
        ValueError,
        "item size",
    ),
    (
        "store dtype type",
        lambda: mk.store_kv(*_caches(), _i(1, 2), K, V, dtype="fp8"),  # type: ignore[arg-type]
        TypeError,
        "dtype must be a torch.dtype",
    ),
    (
        "store noncontiguous cache",
        lambda: mk.store_kv(
            torch.zeros(8, 4, 2).transpose(1, 2), torch.zeros(8, 2, 4), _i(1, 2), K, V
        ),
        ValueError,
        "k_cache must have C-contiguous rows",
    ),
    (
        "store meta device",
        lambda: mk.store_kv(*_caches(), _i(1, 2), K.to("meta"), V),
        ValueError,
        r"k must be a tensor with data \(cpu or a GPU\), got a tensor on the meta device",
    ),
    # MLA
    (
        "mla split",
        lambda: mk.set_mla_kv_buffer(MLA, _i(1), torch.ones(1, 1, 4), torch.ones(1, 1, 3)),
        ValueError,
        "sum to the buffer's 6",
    ),
    ("mla nope_dim", lambda: mk.get_mla_kv_buffer(MLA, _i(1), 6), ValueError, "nope_dim must be <"),
    (
        "mla heads",
        lambda: mk.get_mla_kv_buffer(torch.zeros(8, 2, 6), _i(1), 4),
        ValueError,
        "one latent head",
    ),
    (
        "mla loc 2-D",
        lambda: mk.get_mla_kv_buffer(MLA, _i(1).view(1, 1), 4),
        ValueError,
        "loc must be 1-D",
    ),
    # move
    (
        "move lengths",
        lambda: mk.copy_all_layer_kv_cache([MLA.clone()], _i(1, 2), _i(3)),
        ValueError,
        "equal lengths, got tgt_loc=2, src_loc=1",
    ),
    (
        "move empty",
        lambda: mk.copy_all_layer_kv_cache([], _i(1), _i(3)),
        ValueError,
        "buffers must not be empty",
    ),
    (
        "move not list",
        lambda: mk.copy_all_layer_kv_cache(MLA, _i(1), _i(3)),  # type: ignore[arg-type]
        TypeError,
        "buffers must be a sequence of tensors",
    ),
    # transfers
    (
        "transfer roles",
        lambda: mk.transfer_rows(DEV[0], DEV[0][:1], _i(1), _i(2)),
        ValueError,
        "dst must hold 2 tensors, got 1",
    ),
    (
        "transfer row bytes",
        lambda: mk.transfer_rows(
            [torch.zeros(8, 2, 4)], [torch.zeros(8, 2, 4, dtype=torch.float16)], _i(1), _i(2)
        ),
        ValueError,
        "dst.0. rows must have the 32 bytes of src.0. rows, got 16",
    ),
    (
        "transfer idx dtype",
        lambda: mk.transfer_rows(DEV[0], DEV[1], _i(1).to(torch.int16), _i(2)),
        TypeError,
        "src_indices must be int32 or int64, got torch.int16",
    ),
    (
        "transfer idx lengths",
        lambda: mk.transfer_rows(DEV[0], DEV[1], _i(1, 2), _i(2)),
        ValueError,
        "equal lengths",
    ),
    (
        "all-layer layers",
        lambda: mk.transfer_rows_all_layers(DEV, [d[:1] for d in DEV], _i(1), _i(2)),
        ValueError,
        "dst must have 2 layers per role like src, got 1",
    ),
    (
        "all-layer ragged",
        lambda: mk.transfer_rows_all_layers([DEV[0], DEV[1][:1]], DEV, _i(1), _i(2)),
        ValueError,
        "same layer count per role",
    ),
    (
        "load layer id",
        lambda: mk.load_layer_from_page_first(HOST_PF, DEV[0], _i(1), _i(2), 2),
        ValueError,
        r"layer_id must be < host\[0\].shape\[1\] = 2, got 2",
    ),
    (
        "load host range",
        lambda: mk.load_layer_from_page_first(HOST_PF, DEV[0], _i(10), _i(2), 0),
        ValueError,
        "host_indices must index rows of host",
    ),
    (
        "backup layer count",
        lambda: mk.backup_all_layers_to_page_first([d[:1] for d in DEV], HOST_PF, _i(1), _i(2)),
        ValueError,
        "must equal the 1 device layers",
    ),
    # direct
    (
        "direct page size",
        lambda: mk.direct_transfer_rows(DEV, DEV, _i(1, 2), _i(3, 4), 3),
        ValueError,
        "page_size must be a power of two, got 3",
    ),
    (
        "direct whole pages",
        lambda: mk.direct_load_layer_from_page_first_direct(
            HOST_PFD, DEV[0], _i(2, 4), _i(0, 1), 0, 2
        ),
        ValueError,
        "host_indices must hold whole pages of 2 consecutive indices",
    ),
    (
        "direct aligned",
        lambda: mk.direct_load_layer_from_page_first_direct(
            HOST_PFD, DEV[0], _i(3, 4), _i(0, 1), 0, 2
        ),
        ValueError,
        "host_indices pages must start at multiples of page_size 2",
    ),
    (
        "direct host shape",
        lambda: mk.direct_backup_all_layers_to_page_first_direct(
            DEV, HOST_PFD, _i(0, 1, 2, 3), _i(0, 1, 2, 3), 4
        ),
        ValueError,
        r"host\[0\] must be \[pages, 2, 4, \*row\]",
    ),
    (
        "direct backend",
        lambda: mk.direct_transfer_rows(DEV, DEV, _i(1), _i(3), 1, backend="gpu"),  # type: ignore[arg-type]
        ValueError,
        "backend must be one of",
    ),
    # page sizes / allocation
    (
        "alloc page size bool",
        lambda: mk.alloc_decode(_i(1), _i(-1), _i(2), torch.empty(1, dtype=I64), True),
        TypeError,
        "page_size must be an int, got bool",
    ),
    (
        "alloc devices",
        lambda: mk.alloc_decode(_i(1), _i(-1), _i(2).to("meta"), torch.empty(1, dtype=I64), 1),
        ValueError,
        r"free_pages must be a tensor with data \(cpu or a GPU\), got a tensor on the meta device",
    ),
]


@pytest.mark.parametrize(("name", "call", "exc", "match"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(name: str, call: Callable[[], object], exc: type[Exception], match: str) -> None:
    del name
    with pytest.raises(exc, match=match):
        call()


def test_failed_calls_mutate_nothing() -> None:
    kc, vc = torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)
    with pytest.raises(ValueError, match="v must have shape"):
        mk.store_kv(kc, vc, _i(1, 2), K, torch.ones(2, 2, 3))
    assert kc.abs().sum() == 0  # K was valid but must not have been written either
    host = [[torch.zeros(8, 2, 4)], [torch.zeros(8, 2, 4)]]
    with pytest.raises(ValueError, match="dst_indices must index rows"):
        mk.transfer_rows_all_layers([[t[0]] for t in DEV], host, _i(1, 2), _i(3, 8))
    assert all(t.abs().sum() == 0 for r in host for t in r)
