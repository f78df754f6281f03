"""Every command of the repository and of mem-cache-refactor answers bad input as the project's
rule says: exit status 2 and one line on stderr naming the flag (no usage dump, no traceback)."""

from __future__ import annotations

import importlib

import pytest

#: module -> the positional arguments it needs before an option is looked at
COMMANDS = {
    "tools.bench.allocator": [],
    "tools.bench.host": [],
    "tools.bench.kernels": [],
    "tools.bench.sglang": [],
    "tools.bench.sglang_step": [],
    "tools.bench.soak": [],
    "tools.bench.storage": [],
    "tools.bench.suite": [],
    "tools.gpu_check._cli": [],
    "tools.module_chain": [],
    "tools.mooncake.store": ["serve"],
    "tools.sglang_ref.parity": [],
    "tools.simulate.cli": [],
    "mem_cache_refactor.api_snapshot": ["check"],
    "mem_cache_refactor.griffe_check": [],
    "mem_cache_refactor.move_check.core": ["HEAD~1", "HEAD"],
    "mem_cache_refactor.rewrite_imports": ["a.b", "a.c", "."],
}


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_an_unknown_flag_is_one_line_and_exit_2(
    module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        main([*COMMANDS[module], "--no-such-flag"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--no-such-flag" in err, err
    assert "usage:" not in err and "Traceback" not in err


@pytest.mark.parametrize(("module", "argv", "flag"), [
    ("tools.bench.sglang", ["--rounds", "0"], "--rounds"),
    ("tools.bench.sglang_step", ["--page-sizes", "x"], "--page-sizes"),
    ("mem_cache_refactor.move_check.core", ["a", "b", "--min-blame", "101"], "--min-blame"),
])
def test_a_bad_value_is_one_line_naming_the_flag(
    module: str, argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err, err
