"""Hand-worked examples for the request-table, store, move and transfer torch references."""

from __future__ import annotations

import pytest
import torch

import mem_cache_kernels as mk


def _i(*xs: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(xs, dtype=dtype)


def test_write_req_to_token_and_get_last_loc() -> None:
    table = torch.zeros(4, 8, dtype=torch.int32)
    mk.write_req_to_token(
        table, _i(2, 1), _i(2, 0), _i(4, 3), _i(30, 31, 40, 41, 42), prefix_slots=_i(10, 11)
    )
    assert table[2].tolist() == [10, 11, 30, 31, 0, 0, 0, 0]
    assert table[1].tolist() == [40, 41, 42, 0, 0, 0, 0, 0]
    assert table[0].abs().sum() == 0 and table[3].abs().sum() == 0
    last = mk.get_last_loc(table, _i(2, 1, 3), _i(3, 1, 0, dtype=torch.int32))
    assert last.dtype == torch.int64 and last.tolist() == [30, 40, -1]


def test_write_req_to_token_without_prefix_slots_keeps_prefix() -> None:
    table = torch.full((2, 5), 9, dtype=torch.int32)
    mk.write_req_to_token(table, _i(1), _i(2), _i(4), _i(7, 8))
    assert table[1].tolist() == [9, 9, 7, 8, 9]


def test_req_table_bad_input() -> None:
    table = torch.zeros(4, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="out_cache_loc must have sum"):
        mk.write_req_to_token(table, _i(1), _i(0), _i(3), _i(1, 2))
    with pytest.raises(TypeError, match=r"req_to_token must be int32 or int64, got torch\.float32"):
        mk.get_last_loc(table.float(), _i(1), _i(1))
    with pytest.raises(ValueError, match=r"seq_lens must be <= max_len 8"):
        mk.write_req_to_token(table, _i(1), _i(0), _i(9), torch.arange(9))
    with pytest.raises(ValueError, match="req_pool_indices must index rows"):
        mk.get_last_loc(table, _i(4), _i(1))
    assert table.abs().sum() == 0


def test_store_kv_casts_and_skips_negative() -> None:
    k_cache = torch.zeros(6, 2, 3, dtype=torch.bfloat16)
    v_cache = torch.zeros(6, 1, 4, dtype=torch.bfloat16)
    k = torch.arange(12, dtype=torch.float32).view(2, 2, 3)
    v = torch.arange(8, dtype=torch.float32).view(2, 1, 4) + 100
    mk.store_kv(k_cache, v_cache, _i(4, -1), k, v)
    assert torch.equal(k_cache[4], k[0].bfloat16()) and torch.equal(v_cache[4], v[0].bfloat16())
    assert k_cache[[0, 1, 2, 3, 5]].abs().sum() == 0  # the negative loc wrote nothing
    assert v_cache[5].abs().sum() == 0


def test_store_kv_fp8_storage() -> None:
    fp8 = torch.float8_e4m3fn
    k_cache = torch.zeros(5, 1, 4, dtype=torch.uint8)
    v_cache = torch.zeros(5, 1, 4, dtype=torch.uint8)
    k = torch.randn(2, 1, 4, dtype=torch.bfloat16)
    mk.store_kv(k_cache, v_cache, _i(1, 3, dtype=torch.int32), k, -k, dtype=fp8)
    assert torch.equal(k_cache[[1, 3]], k.to(fp8).view(torch.uint8))
    assert torch.equal(v_cache[[1, 3]].view(fp8).float(), (-k).to(fp8).float())
    with pytest.raises(TypeError, match="pass dtype="):
        mk.store_kv(k_cache, v_cache, _i(1), k[:1], k[:1])


def test_mla_set_get_roundtrip() -> None:
    buf = torch.zeros(7, 1, 6, dtype=torch.float16)
    nope = torch.randn(3, 1, 4).half()
    rope = torch.randn(3, 1, 2).half()
    mk.set_mla_kv_buffer(buf, _i(6, 0, 2), nope, rope)
    assert torch.equal(buf[[6, 0, 2]], torch.cat([nope, rope], dim=-1))
    n2, r2 = mk.get_mla_kv_buffer(buf, _i(2, -1, 6), 4)
    assert torch.equal(n2[0], nope[2]) and torch.equal(r2[2], rope[0])
    assert n2[1].abs().sum() == 0 and r2[1].abs().sum() == 0  # negative loc reads zeros
    with pytest.raises(ValueError, match="must be >= 1 and sum to the buffer's 6"):
        mk.set_mla_kv_buffer(buf, _i(1), nope[:1], rope[:1, :, :1])


def test_copy_all_layer_overlapping() -> None:
    a = torch.arange(10 * 3, dtype=torch.float32).view(10, 3)
    b = torch.arange(10, dtype=torch.int16).view(10, 1) * -1
    a0, b0 = a.clone(), b.clone()
    # shift rows 2..5 by one (overlap): tgt 3..6 gets old 2..5
    mk.copy_all_layer_kv_cache([a, b], _i(3, 4, 5, 6, -1), _i(2, 3, 4, 5, 9))
    assert torch.equal(a[3:7], a0[2:6]) and torch.equal(b[3:7], b0[2:6])
    assert torch.equal(a[:3], a0[:3]) and torch.equal(a[7:], a0[7:])


def test_transfers_layer_first_and_page_first() -> None:
    L, slots, rows = 3, 8, 6
    dev_k = [torch.randn(rows, 2, 4) for _ in range(L)]
    dev_v = [torch.randn(rows, 2, 4) for _ in range(L)]
    host_lf_k = torch.zeros(L, slots, 2, 4)
    host_lf_v = torch.zeros(L, slots, 2, 4)
    di, hi = _i(1, 4, 5), _i(7, 0, 3)
    mk.transfer_rows_all_layers([dev_k, dev_v], [list(host_lf_k), list(host_lf_v)], di, hi)
    for layer in range(L):
        assert torch.equal(host_lf_k[layer, hi], dev_k[layer][di])
        assert torch.equal(host_lf_v[layer, hi], dev_v[layer][di])
    back = torch.zeros(rows, 2, 4)
    mk.transfer_rows([host_lf_k[2]], [back], hi, di)
    assert torch.equal(back[di], dev_k[2][di])

    host_pf = [torch.zeros(slots, L, 2, 4), torch.zeros(slots, L, 2, 4)]
    mk.backup_all_layers_to_page_first([dev_k, dev_v], host_pf, di, hi)
    assert torch.equal(host_pf[1][hi, 1], dev_v[1][di])
    out = [torch.zeros(rows, 2, 4), torch.zeros(rows, 2, 4)]
    mk.load_layer_from_page_first(host_pf, out, hi, di, 2)
    assert torch.equal(out[0][di], dev_k[2][di]) and torch.equal(out[1][di], dev_v[2][di])


def test_direct_transfers_coalesce_runs() -> None:
    ps, L = 2, 2
    dev = [[torch.randn(12, 3) for _ in range(L)]]
    host_lf = [[torch.zeros(10, 3) for _ in range(L)]]
    src, dst = _i(2, 3, 4, 5, 8, 9), _i(0, 1, 2, 3, 6, 7)
    mk.direct_transfer_rows(dev, host_lf, src, dst, ps)
    for layer in range(L):
        assert torch.equal(host_lf[0][layer][dst], dev[0][layer][src])
    host_pfd = [torch.zeros(5, L, ps, 3)]
    mk.direct_backup_all_layers_to_page_first_direct(dev, host_pfd, src, dst, ps)
    assert torch.equal(host_pfd[0][1, 0], dev[0][0][4:6])
    assert torch.equal(host_pfd[0][3, 1], dev[0][1][8:10])
    out = [torch.zeros(12, 3)]
    mk.direct_load_layer_from_page_first_direct(host_pfd, out, dst, src, 1, ps)
    assert torch.equal(out[0][src], dev[0][1][src])
    with pytest.raises(ValueError, match="multiple of page_size 2"):
        mk.direct_transfer_rows(dev, host_lf, src[:3], dst[:3], ps)
    assert mk.list_ops()[0].name == "alloc_extend"


def test_direct_negative_indices_skip_rows_and_pages() -> None:
    dev = [[torch.arange(8 * 2, dtype=torch.float32).view(8, 2) + 1]]
    host = [[torch.zeros(8, 2)]]
    mk.direct_transfer_rows(dev, host, _i(0, -1, 2, 3), _i(4, 5, -1, 7), 2)
    assert torch.equal(host[0][0][4], dev[0][0][0]) and torch.equal(host[0][0][7], dev[0][0][3])
    assert host[0][0][[0, 1, 2, 3, 5, 6]].abs().sum() == 0
    pfd = [torch.zeros(3, 1, 2, 2)]
    # page 0 of the device goes to host page 2; the second page pair is skipped (negative)
    mk.direct_backup_all_layers_to_page_first_direct(dev, pfd, _i(0, 1, -1, -1), _i(4, 5, 0, 1), 2)
    assert torch.equal(pfd[0][2, 0], dev[0][0][0:2]) and pfd[0][:2].abs().sum() == 0


@pytest.mark.parametrize("dev_start", [0, 1])  # page-aligned device pages, or not (fallback path)
def test_direct_page_first_roundtrip(dev_start: int) -> None:
    ps, layers = 4, 2
    dev = [[torch.randn(24, 3) for _ in range(layers)], [torch.randn(24, 3) for _ in range(layers)]]
    dev_slots = torch.cat([torch.arange(ps) + dev_start + 4 * p for p in (3, 1, 2)])
    host_slots = torch.cat([torch.arange(ps) + 4 * p for p in (0, 4, 2)])
    host = [torch.zeros(5, layers, ps, 3), torch.zeros(5, layers, ps, 3)]
    mk.direct_backup_all_layers_to_page_first_direct(dev, host, dev_slots, host_slots, ps)
    for r in range(2):
        for layer in range(layers):
            got = host[r][:, layer].reshape(-1, 3)[host_slots]
            assert torch.equal(got, dev[r][layer][dev_slots])
    back = [torch.zeros(24, 3), torch.zeros(24, 3)]
    mk.direct_load_layer_from_page_first_direct(host, back, host_slots, dev_slots, 1, ps)
    assert torch.equal(back[1][dev_slots], dev[1][1][dev_slots])
    assert back[1][[i for i in range(24) if i not in dev_slots.tolist()]].abs().sum() == 0
