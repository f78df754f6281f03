"""The storage (L3) page format: the bytes of ``get_data_page(flat=True)``, named and versioned.

A storage tier that persists flat pages records :attr:`PageFormat.tag` (a string) in its page
header; a page may be restored with ``set_from_flat_data_page`` into a pool whose
``page_format.tag`` is equal, or converted first with :func:`convert_flat_page` when only the
byte order differs.

Format ``mem-cache-kv-page``, version 1 (:data:`PAGE_FORMAT_NAME`, :data:`PAGE_FORMAT_VERSION`).
A flat page is one host page (``page_size`` tokens) of every role and every layer of the pool, as
a 1-D tensor of store-dtype elements (fp8 pools store ``uint8``), with no header and no padding.
Roles come one after the other in the pool's role order (``k`` then ``v`` for MHA, ``kv`` for
MLA); inside a role, rows (one token of one layer, the device pool's row shape, C order) come in
one of two orders, which follow the host layout exactly as SGLang 0.5.23's host pools do:

* ``layer_major`` (layouts ``layer_first`` and ``page_first_direct``): for each layer, for each
  token of the page, the row: ``[layer_num, page_size, *row]``.
* ``token_major`` (layout ``page_first``): for each token, for each layer, the row:
  ``[page_size, layer_num, *row]``.

SGLang's MHA host pool keeps K and V in one ``[2, ...]`` tensor and its MLA pool has one role, so
for every layout both implement a flat page is byte for byte SGLang's. When ``page_size == 1`` or
``layer_num == 1`` the two orders hold the same bytes; the format then names itself
``layer_major`` so equal bytes always carry equal tags.

Zero-copy ranges (``get_page_buffer_meta``) relate to the flat page as follows: for the page-major
layouts (``page_first``, ``page_first_direct``) a page's ranges, concatenated in list order, are
exactly its flat page; for ``layer_first`` the ranges are per layer, per role (SGLang's
``k0 v0 k1 v1 ...``), so their concatenation is ``[layer][role][token]`` and differs from the flat
page whenever the pool has two roles and more than one layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from mem_cache_kernels.checks import check_choice, check_int

__all__ = [
    "PAGE_FORMAT_NAME",
    "PAGE_FORMAT_VERSION",
    "PAGE_ORDERS",
    "PageFormat",
    "PageOrder",
    "convert_flat_page",
    "page_order",
]

PAGE_FORMAT_NAME = "mem-cache-kv-page"
PAGE_FORMAT_VERSION = 1
PageOrder = Literal["layer_major", "token_major"]
PAGE_ORDERS: tuple[str, ...] = get_args(PageOrder)


def page_order(layout: str) -> PageOrder:
    """The row order of a flat page from a pool of host layout ``layout`` (before the
    ``page_size == 1`` / ``layer_num == 1`` normalisation of :class:`PageFormat`)."""
    check_choice("layout", layout, ("layer_first", "page_first", "page_first_direct"))
    return "token_major" if layout == "page_first" else "layer_major"


def _shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape)


@dataclass(frozen=True, slots=True, kw_only=True)
class PageFormat:
    """Everything needed to interpret a flat page (see the module docstring).

    Build one with :meth:`make` (it normalises ``order``); ``tag`` is the string a storage tier
    stores, :meth:`from_tag` parses it back.
    """

    order: PageOrder
    roles: tuple[str, ...]
    layer_num: int
    page_size: int
    row_shapes: tuple[tuple[int, ...], ...]
    store_dtype: torch.dtype
    name: str = PAGE_FORMAT_NAME
    version: int = PAGE_FORMAT_VERSION

    @classmethod
    def make(
        cls,
        *,
        order: str,
        roles: tuple[str, ...],
        layer_num: int,
        page_size: int,
        row_shapes: tuple[tuple[int, ...], ...],
        store_dtype: torch.dtype,
    ) -> PageFormat:
        """A format of the current version; ``order`` becomes ``layer_major`` when
        ``page_size == 1`` or ``layer_num == 1`` (both orders hold the same bytes then)."""
        check_choice("order", order, PAGE_ORDERS)
        if not isinstance(roles, tuple) or not all(isinstance(r, str) for r in roles):
            raise TypeError(f"roles must be a tuple of str, got {roles!r}")
        if not isinstance(row_shapes, tuple) or not all(isinstance(s, tuple) for s in row_shapes):
            raise TypeError(f"row_shapes must be a tuple of tuples of ints, got {row_shapes!r}")
        for r, shape in enumerate(row_shapes):
            for i, d in enumerate(shape):
                check_int(f"row_shapes[{r}][{i}]", d, minimum=1)
        for name, value in (("layer_num", layer_num), ("page_size", page_size)):
            check_int(name, value)
        if not isinstance(store_dtype, torch.dtype):
            raise TypeError(f"store_dtype must be a torch.dtype, got {type(store_dtype).__name__}")
        if len(roles) != len(row_shapes) or not roles:
            raise ValueError(
                f"roles and row_shapes must be non-empty and of equal length, got {roles} and "
                f"{row_shapes}"
            )
        for name, value in (("layer_num", layer_num), ("page_size", page_size)):
            check_int(name, value, minimum=1)
        if page_size == 1 or layer_num == 1:
            order = "layer_major"
        return cls(
            order=order,  # type: ignore[arg-type]
            roles=tuple(roles),
            layer_num=layer_num,
            page_size=page_size,
            row_shapes=tuple(tuple(s) for s in row_shapes),
            store_dtype=store_dtype,
        )

    def role_shape(self, role: int) -> tuple[int, ...]:
        """Shape of role number ``role`` inside a page, in this format's order."""
        check_int("role", role, minimum=0, maximum=len(self.roles) - 1)
        row = self.row_shapes[role]
        if self.order == "token_major":
            return (self.page_size, self.layer_num, *row)
        return (self.layer_num, self.page_size, *row)

    @property
    def role_numels(self) -> tuple[int, ...]:
        """Elements of each role's part of a page."""
        out = []
        for role in range(len(self.roles)):
            n = 1
            for d in self.role_shape(role):
                n *= d
            out.append(n)
        return tuple(out)

    @property
    def page_numel(self) -> int:
        """Elements (store dtype) of one flat page."""
        return sum(self.role_numels)

    @property
    def page_bytes(self) -> int:
        """Bytes of one flat page."""
        return self.page_numel * self.store_dtype.itemsize

    @property
    def tag(self) -> str:
        """One-line identity of the format, e.g. ``mem-cache-kv-page/1 order=token_major
        roles=k,v layers=2 page_size=4 rows=2x8,2x8 dtype=bfloat16``. Two pages can be restored
        into each other's pools without conversion iff their tags are equal."""
        dtype = str(self.store_dtype).removeprefix("torch.")
        rows = ",".join(_shape_text(s) for s in self.row_shapes)
        return (
            f"{self.name}/{self.version} order={self.order} roles={','.join(self.roles)} "
            f"layers={self.layer_num} page_size={self.page_size} rows={rows} dtype={dtype}"
        )

    @classmethod
    def from_tag(cls, tag: str) -> PageFormat:
        """Parse a :attr:`tag`; ``ValueError`` naming the tag if it is not one (or another
        format name / version)."""
        if not isinstance(tag, str):
            raise TypeError(f"tag must be a str, got {type(tag).__name__}")
        head, _, rest = tag.partition(" ")
        want = f"{PAGE_FORMAT_NAME}/{PAGE_FORMAT_VERSION}"
        if head != want:
            raise ValueError(f"tag must start with {want!r}, got {tag!r}")
        try:
            fields = dict(item.split("=", 1) for item in rest.split(" "))
            dtype = getattr(torch, fields["dtype"])
            if not isinstance(dtype, torch.dtype):
                raise ValueError(fields["dtype"])
            fmt = cls.make(
                order=fields["order"],
                roles=tuple(fields["roles"].split(",")),
                layer_num=int(fields["layers"]),
                page_size=int(fields["page_size"]),
                row_shapes=tuple(
                    tuple(int(d) for d in s.split("x")) for s in fields["rows"].split(",")
                ),
                store_dtype=dtype,
            )
        except (KeyError, ValueError, AttributeError) as exc:
            raise ValueError(f"tag is not a {want} page format: {tag!r} ({exc})") from None
        if fmt.tag != tag:
            raise ValueError(f"tag is not a canonical {want} page format: {tag!r}")
        return fmt


def convert_flat_page(page: torch.Tensor, src: PageFormat, dst: PageFormat) -> torch.Tensor:
    """Reorder a flat page of format ``src`` into format ``dst`` (a new tensor).

    The formats must describe the same data (roles, layers, page size, row shapes, store dtype
    and format version); only the row order may differ. ``ValueError`` otherwise or when
    ``page`` does not hold ``src.page_numel`` elements; ``TypeError`` when its elements are not
    ``src.store_dtype``'s item size.
    """
    for name, fmt in (("src", src), ("dst", dst)):
        if not isinstance(fmt, PageFormat):
            raise TypeError(f"{name} must be a PageFormat, got {type(fmt).__name__}")
    if not isinstance(page, torch.Tensor):
        raise TypeError(f"page must be a torch.Tensor, got {type(page).__name__}")
    same = ("name", "version", "roles", "layer_num", "page_size", "row_shapes", "store_dtype")
    diff = [f for f in same if getattr(src, f) != getattr(dst, f)]
    if diff:
        raise ValueError(
            f"src and dst must differ only in order, got different {', '.join(diff)}: "
            f"{src.tag!r} vs {dst.tag!r}"
        )
    if page.element_size() != src.store_dtype.itemsize:
        raise TypeError(
            f"page must have {src.store_dtype} elements ({src.store_dtype.itemsize} bytes), got "
            f"{page.dtype} ({page.element_size()} bytes)"
        )
    if page.numel() != src.page_numel:
        raise ValueError(f"page must hold {src.page_numel} elements, got {page.numel()}")
    flat = page.reshape(-1)
    if flat.dtype != src.store_dtype:
        flat = flat.view(src.store_dtype)
    if src.order == dst.order:
        return flat.clone()
    parts = []
    offset = 0
    for role, n in enumerate(src.role_numels):
        part = flat[offset : offset + n].view(src.role_shape(role)).transpose(0, 1)
        parts.append(part.reshape(-1))
        offset += n
    return torch.cat(parts)
