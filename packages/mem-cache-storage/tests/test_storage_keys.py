"""Page hashes and the storage key format."""

from __future__ import annotations

import hashlib

import pytest
import torch

from mem_cache_storage import HiCacheStorageConfig, KeySpace, get_hash_str, page_hashes


def test_page_hash_matches_the_documented_format() -> None:
    tokens = [1, 2, 3, 4, 70000, 6, 7, 2**32 - 1]
    first = hashlib.sha256(b"".join(t.to_bytes(4, "little") for t in tokens[:4])).hexdigest()
    second = hashlib.sha256(
        bytes.fromhex(first) + b"".join(t.to_bytes(4, "little") for t in tokens[4:])
    ).hexdigest()
    assert page_hashes(tokens, 4) == [first, second]
    assert get_hash_str(tokens[:4]) == first
    assert get_hash_str(tokens[4:], first) == second
    assert page_hashes(torch.tensor(tokens), 4) == [first, second]


def test_only_full_pages_and_chaining() -> None:
    assert page_hashes(list(range(7)), 4) == page_hashes(list(range(4)), 4)
    assert page_hashes(list(range(3)), 4) == []
    a = page_hashes([9, 9, 9, 9, 1, 2, 3, 4], 4)
    b = page_hashes([8, 9, 9, 9, 1, 2, 3, 4], 4)
    assert a[1] != b[1]  # same page tokens, different prefix: different key
    parent = page_hashes(list(range(4)), 4)[0]
    assert page_hashes(list(range(4, 8)), 4, parent) == page_hashes(list(range(8)), 4)[1:]


@pytest.mark.parametrize("bad", [[-1], [2**32]])
def test_token_range_is_checked(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="token_ids must be in"):
        page_hashes(bad * 4, 4)


def test_storage_keys_separate_models_ranks_and_page_sizes() -> None:
    h = page_hashes(list(range(16)), 16)[0]
    base = HiCacheStorageConfig(tp_rank=0, tp_size=2, model_name="org/Llama 3",
                                extra_config={"model_fingerprint": "rev1"})
    k = KeySpace.from_config(base, 16).storage_key(h)
    assert k.startswith("org-Llama-3.") and k.endswith(f".{h}.tp0-2")
    others = {
        KeySpace.from_config(HiCacheStorageConfig(tp_rank=1, tp_size=2, model_name="org/Llama 3",
                                                  extra_config={"model_fingerprint": "rev1"}),
                             16).storage_key(h),
        KeySpace.from_config(HiCacheStorageConfig(tp_rank=0, tp_size=2, model_name="org/Llama 3",
                                                  extra_config={"model_fingerprint": "rev2"}),
                             16).storage_key(h),
        KeySpace.from_config(base, 32).storage_key(h),
        KeySpace.from_config(HiCacheStorageConfig(tp_rank=0, tp_size=2, model_name="other",
                                                  extra_config={"model_fingerprint": "rev1"}),
                             16).storage_key(h),
    }
    assert k not in others and len(others) == 4
    mla = [KeySpace.from_config(HiCacheStorageConfig(tp_rank=r, tp_size=2, is_mla_model=True,
                                                     pp_rank=1, pp_size=2), 16).storage_key(h)
           for r in (0, 1)]
    assert mla[0] == mla[1] and mla[0].endswith(f"{h}.pp1-2")
    assert all(c.isalnum() or c in "._-" for c in k)


def test_bad_keys_and_configs_are_rejected() -> None:
    ks = KeySpace("m", "", 4)
    with pytest.raises(ValueError, match="key must match"):
        ks.storage_key("../etc/passwd")
    with pytest.raises(ValueError, match="tp_rank must be <= 1, got 2"):
        HiCacheStorageConfig(tp_rank=2, tp_size=2)
    with pytest.raises(ValueError, match="unknown fields"):
        HiCacheStorageConfig.from_any({"tp_rnak": 1})


def test_backend_options_fingerprint_wins() -> None:
    from mem_cache_storage import HiCacheMemory

    cfg = HiCacheStorageConfig(model_name="m", extra_config={"model_fingerprint": "a"})
    from_config = HiCacheMemory(cfg, {"page_size": 4}).storage_key("k")
    from_kwargs = HiCacheMemory(cfg, {"page_size": 4, "model_fingerprint": "b"}).storage_key("k")
    assert from_config == KeySpace.from_config(cfg, 4).storage_key("k")
    assert from_kwargs == KeySpace.from_config(cfg, 4, "b").storage_key("k") != from_config
