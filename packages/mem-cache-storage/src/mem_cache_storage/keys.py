"""Storage keys: chained SHA-256 page hashes (here) plus a model fingerprint prefix and a rank
suffix (applied by the backends: :class:`mem_cache_storage.backend.KeySpace`).

**Page hash** (computed by the engine/controller; backends never hash): for page ``i`` of a
token sequence, ``SHA-256(parent || t_0 || ... || t_{ps-1})`` as 64 lowercase hex characters,
where ``parent`` is the 32 raw bytes of page ``i-1``'s hash (nothing for the first page) and each
token id is 4 bytes little-endian (unsigned). Only full pages are hashed, so a hash names the
whole prefix up to and including its page: equal hashes mean equal prefixes. This matches
SGLang's ``get_hash_str``, so hashes computed by either side agree.

**Storage key** (applied by every backend of this package to the key it is given)::

    {model}.{fingerprint}.{key}[.tp{tp_rank}-{tp_size}][.pp{pp_rank}-{pp_size}][.cp{cp_rank}-{cp_size}]

* ``model``: ``model_name`` with every character outside ``[A-Za-z0-9_-]`` replaced by ``-``
  (at most 48 characters; ``model`` when unnamed), for people reading a directory listing;
* ``fingerprint``: the first 16 hex characters of
  ``SHA-256("mem-cache-storage/key/v1" NUL model_name NUL model_fingerprint NUL page_size)``, where
  ``model_fingerprint`` is the weights/config id the engine passes in
  ``extra_config["model_fingerprint"]``: another model, other weights or another page size
  never share a key;
* ``key``: what the caller passed (normally a page hash; ``[A-Za-z0-9_.-]``, 1-128 characters);
* ``.tp{r}-{n}`` for non-MLA models only (MLA KV is identical on every TP rank, so rank 0 writes
  and every rank reads the same key); ``.pp{r}-{n}`` when ``pp_size > 1``; ``.cp{r}-{n}`` when
  ``attn_cp_size > 1``.

The alphabet of a storage key is ``[A-Za-z0-9_.-]``, so it is a valid file name and object key.

**Key scheme ``sglang``** (``extra_config["key_scheme"] = "sglang"``): the names SGLang 0.5.23's
file backend gives its pages, so an SGLang instance and an engine on this package share one
directory (see each backend for the page layout)::

    {key}_{model}[_{pp_size}_{pp_rank}][_cp{cp_rank}_{cp_size}]                       (MLA)
    {key}_{model}_{tp_rank}_{tp_size}[_{pp_size}_{pp_rank}][_cp{cp_rank}_{cp_size}]   (others)

with ``model`` the ``model_name`` with ``/`` replaced by ``-`` (no fingerprint: SGLang keys on
the model name alone, so the engine must pass the name SGLang uses, and a weights change needs a
new name or a new directory). Keys of a Mamba state (ending ``.mamba``) always take the TP suffix.

**Namespaces** (tenant isolation): :func:`page_hashes` takes ``extra_key`` / ``cache_salt``
(SGLang's request fields: a LoRA id, a tenant salt). When either is given the chain starts from
:func:`namespace_seed` instead of nothing, exactly as SGLang's ``get_storage_hash_str`` does, so
two namespaces never share a page hash and the default (no namespace) keeps SGLang's hashes.
"""

from __future__ import annotations

import array
import hashlib
import sys
from collections.abc import Sequence

import torch

from mem_cache_kernels.checks import check_index, check_int

__all__ = ["HASH_HEX_LEN", "get_hash_str", "namespace_seed", "page_hashes"]

HASH_HEX_LEN = 64
_U32 = 1 << 32
_U32_CODE = next(c for c in "IL" if array.array(c).itemsize == 4)
_TOKEN_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)


def _parent(prior_hash: object) -> bytes:
    """The raw bytes of ``prior_hash`` (``b""`` for ``None``)."""
    if prior_hash is None:
        return b""
    if not isinstance(prior_hash, str):
        raise TypeError(f"prior_hash must be a hex str or None, got {type(prior_hash).__name__}")
    try:
        return bytes.fromhex(prior_hash)
    except ValueError:
        raise ValueError(f"prior_hash must be a hex string, got {prior_hash!r}") from None


def _token_bytes(token_ids: Sequence[int] | torch.Tensor) -> bytes:
    """Token ids as 4-byte little-endian unsigned ints (``ValueError`` outside [0, 2**32))."""
    if not isinstance(token_ids, torch.Tensor):
        if isinstance(token_ids, (str, bytes)) or not isinstance(token_ids, Sequence):
            raise TypeError(
                f"token_ids must be a tensor or a sequence of ints, got {type(token_ids).__name__}"
            )
        values = list(token_ids)
        token_ids = torch.tensor(values) if values else torch.empty(0, dtype=torch.int64)
    t = check_index("token_ids", token_ids, dtypes=_TOKEN_DTYPES).detach().to("cpu", torch.int64)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= _U32):
        raise ValueError(
            f"token_ids must be in [0, 2**32), got values in [{int(t.min())}, {int(t.max())}]"
        )
    words = array.array(_U32_CODE, t.tolist())
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
        words.byteswap()
    return words.tobytes()


def get_hash_str(token_ids: Sequence[int] | torch.Tensor, prior_hash: str | None = None) -> str:
    """SHA-256 hex of one page: the parent page's hash bytes, then each token (see module)."""
    h = hashlib.sha256(_parent(prior_hash))
    h.update(_token_bytes(token_ids))
    return h.hexdigest()


def namespace_seed(extra_key: str | None = None, cache_salt: str | None = None) -> str | None:
    """The hash a namespaced chain starts from (``None`` without a namespace): SHA-256 of
    ``"sglang-cache-namespace-v1"`` then, for ``extra_key`` and ``cache_salt`` in turn, ``00``
    when absent or ``01`` + its UTF-8 length (8 bytes little endian) + its UTF-8 bytes (SGLang's
    ``storage_namespace_seed``: absent, empty and joined parts all differ)."""
    if extra_key is None and cache_salt is None:
        return None
    digest = hashlib.sha256(b"sglang-cache-namespace-v1")
    for name, part in (("extra_key", extra_key), ("cache_salt", cache_salt)):
        if part is None:
            digest.update(b"\x00")
            continue
        if not isinstance(part, str):
            raise TypeError(f"{name} must be a str or None, got {type(part).__name__}")
        encoded = part.encode("utf-8")
        digest.update(b"\x01" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.hexdigest()


def page_hashes(
    token_ids: Sequence[int] | torch.Tensor, page_size: int, prior_hash: str | None = None,
    *, extra_key: str | None = None, cache_salt: str | None = None,
) -> list[str]:
    """Chained hashes of every *full* page of ``token_ids`` (a trailing partial page has none).
    ``extra_key`` / ``cache_salt`` put the chain in a namespace (see the module docstring); they
    apply only to a chain's start (``prior_hash is None``), as SGLang's do."""
    check_int("page_size", page_size, minimum=1)
    if prior_hash is None:
        prior_hash = namespace_seed(extra_key, cache_salt)
    parent = _parent(prior_hash)
    data = _token_bytes(token_ids)
    step = 4 * page_size
    out: list[str] = []
    for start in range(0, len(data) - step + 1, step):
        h = hashlib.sha256(parent)
        h.update(data[start : start + step])
        parent = h.digest()
        out.append(h.hexdigest())
    return out
