"""Storage page API: flat pages carry SGLang 0.5.23's (layout-dependent) bytes under a named,
versioned format; buffer meta lists SGLang's ranges in SGLang's order."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest
import torch

from mem_cache_pool_host import (
    LAYOUTS,
    PAGE_FORMAT_NAME,
    PAGE_FORMAT_VERSION,
    HostKVCache,
    MHATokenToKVPoolHost,
    MLATokenToKVPoolHost,
    PageFormat,
    convert_flat_page,
)

MakePool = Callable[..., Any]

FP8 = getattr(torch, "float8_e4m3fn", torch.uint8)


def host_row(host: HostKVCache, role: int, layer: int, slot: int) -> torch.Tensor:
    """Independent oracle of where (role, layer, slot) lives in each layout."""
    buf = host.buffers[role]
    if host.layout == "layer_first":
        return buf[layer, slot]
    if host.layout == "page_first":
        return buf[slot, layer]
    return buf[slot // host.page_size, layer, slot % host.page_size]


def expected_flat_page(host: HostKVCache, index: int) -> torch.Tensor:
    """SGLang 0.5.23's flat page, from its host tensor shapes: MHA ``kv_buffer`` is ``(2, L,
    size, H, D)`` (layer_first), ``(2, size, L, H, D)`` (page_first) or ``(2, pages, L, ps, H,
    D)`` (page_first_direct); MLA the same without the leading 2. ``get_data_page`` slices one
    page and flattens it: token-major for page_first, layer-major otherwise."""
    ps, layers = host.page_size, host.layer_num
    if host.layout == "page_first":
        order = [(layer, t) for t in range(ps) for layer in range(layers)]
    else:
        order = [(layer, t) for layer in range(layers) for t in range(ps)]
    parts = [
        host_row(host, r, layer, index + t).reshape(-1)
        for r in range(len(host.roles))
        for layer, t in order
    ]
    return torch.cat(parts)


def make_host(make_pool, kind: str, layout: str, dtype: torch.dtype, ps: int = 4) -> HostKVCache:
    device = make_pool(kind, dtype, page_size=ps, size=16, seed=None)
    cls = MHATokenToKVPoolHost if kind == "mha" else MLATokenToKVPoolHost
    host = cls(device, layout=layout)
    gen = torch.Generator().manual_seed(1)
    for buf in host.buffers:
        raw = buf.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=gen))
    return host


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["mha", "mla"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, FP8])
def test_data_page_matches_the_layout_oracle(
    make_pool, kind: str, layout: str, dtype: torch.dtype
) -> None:
    host = make_host(make_pool, kind, layout, dtype)
    for index in (0, 8, host.size - host.page_size):
        page = host.get_data_page(index)
        assert page.dim() == 1 and page.numel() == host.page_numel
        assert page.dtype == host.store_dtype
        assert same_bytes(page, expected_flat_page(host, index))
        shaped = host.get_data_page(index, flat=False)
        assert shaped.shape == (len(host.roles), *host.page_format.role_shape(0))
        assert same_bytes(shaped.reshape(-1), page)


@pytest.mark.parametrize("src_layout", LAYOUTS)
@pytest.mark.parametrize("dst_layout", LAYOUTS)
def test_flat_page_round_trips_across_layouts(
    make_pool: MakePool, src_layout: str, dst_layout: str
) -> None:
    src = make_host(make_pool, "mha", src_layout, torch.float16)
    dst = make_host(make_pool, "mha", dst_layout, torch.float16)
    neighbour = dst.get_data_page(4)
    page = src.get_data_page(12)
    same_format = src.page_format == dst.page_format
    assert same_format == (src.page_format.tag == dst.page_format.tag)
    assert same_format == ((src_layout == "page_first") == (dst_layout == "page_first"))
    restored = convert_flat_page(page, src.page_format, dst.page_format)
    assert same_bytes(restored, page) == same_format
    dst.set_from_flat_data_page(8, restored)
    assert same_bytes(dst.get_data_page(8), restored)
    for r in range(2):  # the same rows landed, whatever the byte order
        for layer in range(dst.layer_num):
            for t in range(dst.page_size):
                assert same_bytes(host_row(dst, r, layer, 8 + t), host_row(src, r, layer, 12 + t))
    assert same_bytes(dst.get_data_page(4), neighbour)  # nothing else written
    back = convert_flat_page(dst.get_data_page(8), dst.page_format, src.page_format)
    assert same_bytes(back, page)
    src.set_from_flat_data_page(0, src.get_dummy_flat_data_page())
    assert not bool(src.get_data_page(0).view(torch.uint8).any())


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_page_format_names_and_versions_the_bytes(
    make_pool: MakePool, kind: str, layout: str
) -> None:
    host = make_host(make_pool, kind, layout, FP8)
    fmt = host.page_format
    assert (
        (fmt.name, fmt.version)
        == (PAGE_FORMAT_NAME, PAGE_FORMAT_VERSION)
        == (
            "mem-cache-kv-page",
            1,
        )
    )
    assert fmt.order == ("token_major" if layout == "page_first" else "layer_major")
    assert fmt.roles == host.roles and fmt.store_dtype == torch.uint8
    assert fmt.page_numel == host.page_numel == host.get_data_page(0).numel()
    assert fmt.page_bytes == host.get_dummy_flat_data_page().numel()
    rows = "2x8,2x8" if kind == "mha" else "1x24"
    roles = "k,v" if kind == "mha" else "kv"
    assert fmt.tag == (
        f"mem-cache-kv-page/1 order={fmt.order} roles={roles} layers=2 page_size=4 "
        f"rows={rows} dtype=uint8"
    )
    assert PageFormat.from_tag(fmt.tag) == fmt
    for bad in ("mem-cache-kv-page/2" + fmt.tag[19:], fmt.tag.replace("layers=2", "layers=x"), 7):
        with pytest.raises((ValueError, TypeError), match="tag"):
            PageFormat.from_tag(bad)  # type: ignore[arg-type]


def test_page_format_orders_coincide_for_one_token_or_one_layer(make_pool: MakePool) -> None:
    one_token = MHATokenToKVPoolHost(make_pool("mha", page_size=1, size=8), layout="page_first")
    one_layer = MHATokenToKVPoolHost(
        make_pool("mha", page_size=4, size=16, layer_num=1), layout="page_first"
    )
    for host in (one_token, one_layer):
        assert host.page_format.order == "layer_major"
        assert same_bytes(host.get_data_page(0), expected_flat_page(host, 0))


def test_convert_flat_page_rejects_other_data(make_pool: MakePool) -> None:
    a = make_host(make_pool, "mha", "page_first", torch.float16)
    b = make_host(make_pool, "mla", "layer_first", torch.float16)
    page = a.get_data_page(0)
    with pytest.raises(ValueError, match="differ only in order, got different roles"):
        convert_flat_page(page, a.page_format, b.page_format)
    with pytest.raises(ValueError, match="page must hold"):
        convert_flat_page(page[1:], a.page_format, a.page_format)
    with pytest.raises(TypeError, match=r"page must have torch\.float16 elements"):
        convert_flat_page(page.double(), a.page_format, a.page_format)
    with pytest.raises(TypeError, match="dst must be a PageFormat"):
        convert_flat_page(page, a.page_format, "x")  # type: ignore[arg-type]


def test_set_page_validates(make_pool: MakePool) -> None:
    host = make_host(make_pool, "mla", "page_first", FP8)
    page = host.get_dummy_flat_data_page()
    assert page.numel() == host.page_numel and page.dtype == torch.uint8
    host.set_from_flat_data_page(4, page.view(FP8))  # logical fp8 accepted
    with pytest.raises(ValueError, match="elements"):
        host.set_from_flat_data_page(4, page[1:])
    with pytest.raises(TypeError, match="data_page dtype"):
        host.set_from_flat_data_page(4, page.float())
    with pytest.raises(ValueError, match="first slot of a page"):
        host.set_from_flat_data_page(3, page)
    with pytest.raises(ValueError, match="first slot of a page"):
        host.get_data_page(host.size)
    with pytest.raises(TypeError, match="index"):
        host.get_data_page(torch.tensor(4.0))
    with pytest.raises(TypeError, match="index"):
        host.get_data_page(torch.tensor([4, 5]))
    with pytest.raises(ValueError, match="first slot of a page"):
        host.set_from_flat_data_page(torch.tensor(3), page)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_page_buffer_meta_points_at_layout_native_page_bytes(
    make_pool, kind: str, layout: str
) -> None:

    host = make_host(make_pool, kind, layout, torch.float16)
    ps, n_roles, n_layers = host.page_size, len(host.roles), host.layer_num
    indices = torch.cat([torch.arange(12, 16), torch.arange(4, 8)])
    ptrs, sizes = host.get_page_buffer_meta(indices)
    per_page = n_roles * (n_layers if layout == "layer_first" else 1)
    assert len(ptrs) == len(sizes) == 2 * per_page
    assert sum(sizes) == 2 * host.page_numel * host.buffers[0].element_size()
    # SGLang's list order: layer_first k0 v0 k1 v1 ... (per layer, per role), else k v per page
    if layout == "layer_first":
        order = [(r, layer) for layer in range(n_layers) for r in range(n_roles)]
    else:
        order = [(r, None) for r in range(n_roles)]
    k = 0
    for start in (12, 4):
        page_ranges = b"".join(ctypes.string_at(ptrs[k + i], sizes[k + i]) for i in range(per_page))
        flat = host.get_data_page(start).view(torch.uint8).numpy().tobytes()
        # page-major layouts: a page's ranges, concatenated, are its flat page
        assert (page_ranges == flat) == (layout != "layer_first" or kind == "mla")
        for r, layer in order:
            got = ctypes.string_at(ptrs[k], sizes[k])
            if layer is not None:
                rows = [host_row(host, r, layer, start + t) for t in range(ps)]
            elif layout == "page_first":
                rows = [host_row(host, r, l, start + t) for t in range(ps) for l in range(n_layers)]
            else:
                rows = [host_row(host, r, l, start + t) for l in range(n_layers) for t in range(ps)]
            want = torch.cat([x.reshape(-1) for x in rows]).view(torch.uint8).numpy().tobytes()
            assert got == want
            k += 1
    with pytest.raises(ValueError, match="whole pages"):
        host.get_page_buffer_meta([1, 2, 3, 4])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_page_range_table_and_page_ids_give_the_buffer_meta(
    make_pool, kind: str, layout: str
) -> None:
    """The trusted entry storage uses: the table + page ids, checked or trusted, are exactly
    ``get_page_buffer_meta``'s lists; closed -> RuntimeError; an override -> None."""
    host = make_host(make_pool, kind, layout, torch.float16)
    indices = torch.cat([torch.arange(12, 16), torch.arange(4, 8)])
    table = host.page_range_table()
    assert table is not None
    for trusted in (False, True):
        pages = host.page_ids(indices, trusted=trusted)
        assert pages == [3, 1]
        ptrs = [base + p * stride for p in pages for base, stride, _ in table]
        sizes = [n for _, _, n in table] * len(pages)
        assert (ptrs, sizes) == host.get_page_buffer_meta(indices)
    with pytest.raises(ValueError, match="indices"):
        host.page_ids(torch.tensor([1, 2, 3, 4]))
    with pytest.raises(ValueError, match="indices"):
        host.page_ids(torch.cat([indices, indices]))

    class Listed(type(host)):  # type: ignore[misc]
        def get_page_buffer_meta(self, indices: Any) -> tuple[list[int], list[int]]:
            return super().get_page_buffer_meta(indices)

    host.__class__ = Listed
    assert host.page_range_table() is None
    host.close()
    with pytest.raises(RuntimeError, match="closed"):
        host.page_range_table()


def test_stride_alignment(make_pool: MakePool) -> None:
    # MHA row = 2 heads x 8 dims x 2 bytes = 32 B; 2 layers; page of 64 tokens = 4 KiB per role
    aligned = MHATokenToKVPoolHost(
        make_pool("mha", torch.float16, page_size=64, size=128, seed=None)
    )
    assert aligned.is_stride_page_aligned(4096)
    small_pages = make_pool("mha", torch.float16, page_size=16, size=64, seed=None)
    small = MHATokenToKVPoolHost(small_pages)
    assert not small.is_stride_page_aligned(4096)
    assert small.is_stride_page_aligned(1024)


def test_from_tag_accepts_only_canonical_tags() -> None:
    fmt = PageFormat.make(
        order="token_major",
        roles=("kv",),
        layer_num=3,
        page_size=1,  # one token: both orders hold the same bytes, the tag says layer_major
        row_shapes=((1, 8),),
        store_dtype=torch.bfloat16,
    )
    assert fmt.order == "layer_major"
    assert PageFormat.from_tag(fmt.tag) == fmt
    for bad in (
        fmt.tag.replace("layer_major", "token_major"),  # not canonical
        fmt.tag.replace("layer_major", "row_major"),  # unknown order
        fmt.tag.replace("dtype=bfloat16", "dtype=nonsense"),
        fmt.tag + " extra",
    ):
        with pytest.raises(ValueError, match="tag"):
            PageFormat.from_tag(bad)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_flat_page_is_sglang_slice_of_its_single_host_tensor(
    make_pool: MakePool, kind: str, layout: str
) -> None:
    # SGLang 0.5.23 keeps one host tensor (MHA: K and V stacked on a leading dim of 2) and its
    # get_data_page(index) slices one page out of it and flattens it:
    #   layer_first kv[..., index:index+ps, ...] (slot dim after the layer dim),
    #   page_first kv[..., index:index+ps, ...] (slot dim first),
    #   page_first_direct kv[..., p:p+1, ...] (page dim first)
    host = make_host(make_pool, kind, layout, torch.bfloat16)
    kv = torch.stack(host.buffers) if kind == "mha" else host.buffers[0]
    lead = (slice(None),) if kind == "mha" else ()
    ps = host.page_size
    for index in (0, 4, host.size - ps):
        if layout == "layer_first":
            page = kv[(*lead, slice(None), slice(index, index + ps))]
        elif layout == "page_first":
            page = kv[(*lead, slice(index, index + ps))]
        else:
            page = kv[(*lead, slice(index // ps, index // ps + 1))]
        assert same_bytes(host.get_data_page(index), page.flatten())
        restored = make_host(make_pool, kind, layout, torch.bfloat16)
        for b in restored.buffers:
            b.zero_()
        restored.set_from_flat_data_page(index, page.flatten().clone())
        assert same_bytes(restored.get_data_page(index), page.flatten())
