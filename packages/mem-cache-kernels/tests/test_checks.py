"""``mem_cache_kernels.checks``: the one validation layer and its exception rule.

Type mistakes raise ``TypeError``, value mistakes ``ValueError``; every message names the
argument, the expected and the actual value.
"""

from __future__ import annotations

import pytest
import torch

from mem_cache_kernels import checks as c
from mem_cache_kernels import pages as page_math

I32, I64 = torch.int32, torch.int64


@pytest.mark.parametrize("bad", [True, False, 1.0, "3", None, torch.tensor(3)])
def test_check_int_rejects_non_ints_with_type_error(bad: object) -> None:
    with pytest.raises(TypeError, match=rf"^n must be an int, got {type(bad).__name__}$"):
        c.check_int("n", bad)


def test_check_int_bounds_are_value_errors() -> None:
    assert c.check_int("n", 5, minimum=5, maximum=5) == 5
    with pytest.raises(ValueError, match=r"^n must be >= 1, got 0$"):
        c.check_int("n", 0, minimum=1)
    with pytest.raises(ValueError, match=r"^n must be <= 4, got 5$"):
        c.check_int("n", 5, maximum=4)
    assert c.check_optional_int("n", None, minimum=1) is None
    with pytest.raises(TypeError, match="n must be an int, got bool"):
        c.check_optional_int("n", True)


def test_check_bool_accepts_only_bools() -> None:
    assert c.check_bool("flag", False) is False
    with pytest.raises(TypeError, match=r"^flag must be a bool, got int$"):
        c.check_bool("flag", 1)


def test_page_size_and_dtype_and_device_args() -> None:
    assert c.check_page_size(16) == 16
    with pytest.raises(ValueError, match="page_size must be a power of two, got 12"):
        c.check_page_size(12)
    with pytest.raises(TypeError, match="page_size must be an int, got float"):
        c.check_page_size(16.0)
    assert c.check_dtype_arg("dtype", None) is None
    with pytest.raises(TypeError, match=r"dtype must be a torch\.dtype or None, got str"):
        c.check_dtype_arg("dtype", "float16")
    assert c.check_device_arg("device", "cpu") == torch.device("cpu")
    with pytest.raises(TypeError, match=r"device must be a torch\.device or a str, got int"):
        c.check_device_arg("device", 0)
    with pytest.raises(ValueError, match="device must name a torch device"):
        c.check_device_arg("device", "not-a-device")


def test_check_index_type_then_value_mistakes() -> None:
    t = torch.arange(4, dtype=I32)
    assert c.check_index("loc", t, length=4, device=torch.device("cpu")) is t
    with pytest.raises(TypeError, match=r"^loc must be a torch.Tensor, got list$"):
        c.check_index("loc", [1, 2])
    with pytest.raises(TypeError, match=r"^loc must be int32 or int64, got torch.float32$"):
        c.check_index("loc", t.float())
    with pytest.raises(TypeError, match=r"^loc must be int64, got torch.int32$"):
        c.check_index("loc", t, dtypes=(I64,))
    with pytest.raises(ValueError, match=r"^loc must be 1-D, got shape \(2, 2\)$"):
        c.check_index("loc", t.reshape(2, 2))
    with pytest.raises(ValueError, match=r"^loc must have 5 elements, got 4$"):
        c.check_index("loc", t, length=5)
    with pytest.raises(ValueError, match="loc must be a tensor with data"):
        c.check_index("loc", torch.zeros(2, dtype=I64, device="meta"))
    assert c.check_index("loc", torch.zeros(2, dtype=I64, device="meta"), allow_meta=True).is_meta
    with pytest.raises(ValueError, match=r"^loc must be on device meta, got cpu$"):
        c.check_index("loc", t, device=torch.device("meta"))


def test_value_checks_read_cpu_tensors_and_skip_device_ones_unless_full() -> None:
    t = torch.tensor([0, 3, 7], dtype=I64)
    c.check_index_values("loc", t, limit=8)
    with pytest.raises(ValueError, match=r"^loc values must lie in \[1, 8\), got min 0, max 7$"):
        c.check_index_values("loc", t, limit=8, minimum=1)
    with pytest.raises(ValueError, match="loc must not repeat a slot, got 1 repeated entries"):
        c.check_distinct("loc", torch.tensor([2, 2, 3]))
    meta = torch.zeros(3, dtype=I64, device="meta")
    c.check_index_values("loc", meta, limit=0, full=True)  # no data to read: skipped
    c.check_distinct("loc", meta, full=True)


def test_debug_enabled_reads_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(c.DEBUG_ENV_VAR, raising=False)
    assert not c.debug_enabled()
    assert c.debug_enabled(True)
    for off in ("", "0"):
        monkeypatch.setenv(c.DEBUG_ENV_VAR, off)
        assert not c.debug_enabled()
    monkeypatch.setenv(c.DEBUG_ENV_VAR, "1")
    assert c.debug_enabled()


def test_same_device_treats_an_unindexed_device_as_any_index() -> None:
    assert c.same_device(torch.device("cuda"), torch.device("cuda:1"))
    assert not c.same_device(torch.device("cuda:0"), torch.device("cuda:1"))
    assert not c.same_device(torch.device("cpu"), torch.device("cuda"))


def test_describe_shows_at_most_sixteen_values() -> None:
    assert c.describe(torch.tensor([1, 2])) == "[1, 2] (2 total)"
    assert c.describe(torch.arange(20)).endswith(", ...] (20 total)")


@pytest.mark.parametrize("ps", [1, 4, 64])
@pytest.mark.parametrize("bs", [3, c.SMALL_BATCH + 5])  # list path and vectorised path
def test_extend_counts_both_paths_agree_with_the_formula(ps: int, bs: int) -> None:
    g = torch.Generator().manual_seed(bs * 100 + ps)
    pre = torch.randint(0, 300, (bs,), generator=g)
    seq = pre + torch.randint(0, 300, (bs,), generator=g)
    pages, tokens = page_math.extend_counts(pre.to(I32), seq, ps)
    expect = sum(-(-q // ps) - -(-p // ps) for p, q in zip(pre.tolist(), seq.tolist()))
    assert (pages, tokens) == (expect, int((seq - pre).sum()))
    seq[bs - 1] = pre[bs - 1] - 1
    with pytest.raises(ValueError, match=rf"requests \[{bs - 1}\] \(1 total\) have prefix_lens="):
        page_math.extend_counts(pre, seq, ps)
    with pytest.raises(ValueError, match="p_cpu must satisfy 0 <= p_cpu <= s_cpu"):
        page_math.extend_counts(pre, seq, ps, names=("p_cpu", "s_cpu"))


@pytest.mark.parametrize("numpy", [True, False])
@pytest.mark.parametrize("ps", [1, 2, 16])
@pytest.mark.parametrize("bs", [3, c.SMALL_BATCH + 5])  # list path and vectorised path
def test_decode_counts_every_path_agrees_with_the_formula(
    bs: int, ps: int, numpy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not numpy:
        monkeypatch.setattr(c, "_np", None)
    seq = torch.randint(1, 200, (bs,), generator=torch.Generator().manual_seed(bs + ps))
    expect = sum(1 for q in seq.tolist() if (q - 1) % ps == 0)
    assert page_math.decode_counts(seq.to(I32), ps) == page_math.decode_counts(seq, ps) == expect
    seq[bs - 2] = 0
    with pytest.raises(ValueError, match=rf"^lens must be >= 1 .* requests \[{bs - 2}\] "):
        page_math.decode_counts(seq, ps, name="lens")
    assert page_math.decode_counts(seq[:0], ps) == 0


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.int64])
@pytest.mark.parametrize("n", [1, 2, 31, 32, 33, 100])
def test_host_bounds_equals_aminmax(dtype: torch.dtype, n: int) -> None:
    """Both readings (lists up to 32 entries, one reduction above) give aminmax's ints, for
    contiguous, strided and 2-D tensors."""
    g = torch.Generator().manual_seed(n)
    lo, hi = (0, 255) if dtype == torch.uint8 else (-128, 128)
    t = torch.randint(lo, hi, (2 * n,), generator=g).to(dtype)
    if dtype == torch.int64:
        t[0] = -(2**40)
        t[-1] = 2**40
    for view in (t[:n], t[::2], t.view(2, n)):
        want = tuple(int(x) for x in torch.aminmax(view))
        got = c.host_bounds(view)
        assert got == want and all(type(x) is int for x in got), (n, dtype)
