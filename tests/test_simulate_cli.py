"""``tools/dev run``'s command line: every bad flag or path is refused before the run with exit
status 2 and one line naming the flag, the value and what is expected; options a mode ignores
are refused naming the mode; ``--help`` documents every option with its default, grouped."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tools.simulate.cli import main
from tools.simulate.logs import GLOG_LINE, filtered_stderr
from tools.simulate.options import build_parser

#: dest -> (bad command line, text the error line must contain). Every option of the parser
#: has an entry (test_every_option_has_a_bad_value_case), so a new option needs one too.
BAD: dict[str, tuple[list[str], str]] = {
    "requests": (["--requests", "0"], "--requests must be positive, got 0"),
    "max_running": (["--max-running", "-3"], "--max-running must be positive, got -3"),
    "mean_turns": (["--mean-turns", "0.5"], "--mean-turns must be >= 1, got 0.5"),
    "arrival_per_step": (["--arrival-per-step", "0"], "--arrival-per-step must be positive"),
    "think_steps": (["--think-steps", "-1"], "--think-steps must be >= 0, got -1"),
    "shared_prefix_tokens": (["--shared-prefix-tokens", "-1"],
                             "--shared-prefix-tokens must be >= 0, got -1"),
    "spec_draft": (["--spec-draft", "-2"], "--spec-draft must be >= 0, got -2"),
    "retract_after": (["--retract-after", "x"], "argument --retract-after: invalid int value"),
    "seed": (["--seed", "-1"], "--seed must be >= 0, got -1"),
    "model": (["--model", "gpt"], "argument --model: invalid choice: 'gpt'"),
    "layers": (["--layers", "0"], "--layers must be positive, got 0"),
    "heads": (["--heads", "0"], "--heads must be positive, got 0"),
    "head_dim": (["--head-dim", "1.5"], "argument --head-dim: invalid int value: '1.5'"),
    "kv_lora_rank": (["--kv-lora-rank", "0"], "--kv-lora-rank must be positive, got 0"),
    "qk_rope_head_dim": (["--qk-rope-head-dim", "-1"], "--qk-rope-head-dim must be positive"),
    "dtype": (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    "page_size": (["--page-size", "12"], "--page-size must be a power of two, got 12"),
    "device_tokens": (["--device-tokens", "16"],
                      "--device-tokens must hold at least 4 pages (64 tokens at page size 16)"),
    "host_tokens": (["--host-tokens", "8"], "--host-tokens must hold at least one page"),
    "host_layout": (["--host-layout", "rows"], "argument --host-layout: invalid choice: 'rows'"),
    "io_backend": (["--io-backend", "dma"], "argument --io-backend: invalid choice: 'dma'"),
    "device": (["--device", "tpu"], "--device must be 'cpu', 'cuda' or 'cuda:N', got 'tpu'"),
    "threads": (["--threads", "0"], "--threads must be positive, got 0"),
    "storage": (["--storage", "s3"], "argument --storage: invalid choice: 's3'"),
    "storage_dir": (["--storage-dir", "{file}"], "--storage-dir {file}: exists and is not a "
                    "directory"),
    "storage_write": (["--storage-write", "never"],
                      "argument --storage-write: invalid choice: 'never'"),
    "storage_capacity_mb": (["--storage-capacity-mb", "-1"],
                            "--storage-capacity-mb must be >= 0 (0: unlimited), got -1"),
    "storage_master": (["--storage", "mooncake", "--storage-master", "nohost"],
                       "--storage-master must be HOST:PORT (port 1-65535), got 'nohost'"),
    "storage_metadata": (["--storage", "mooncake", "--storage-master", "h:1",
                          "--storage-metadata", "ftp://h"],
                         "--storage-metadata must be an http:// or https:// URL, got 'ftp://h'"),
    "faults": (["--faults", "1.5"], "--faults must be a probability in [0, 1], got 1.5"),
    "storage_fault_rate": (["--storage-fault-rate", "2"],
                           "--storage-fault-rate must be a probability in [0, 1], got 2.0"),
    "restart_at": (["--restart-at", "-2"], "--restart-at must be a step >= 0 (or -1: never)"),
    "check_every": (["--check-every", "0"], "--check-every must be positive, got 0"),
    "instances": (["--storage", "mooncake", "--instances", "0"],
                  "--instances must be >= 1, got 0"),
    "routing": (["--routing", "random"], "--routing is an option of the multi-instance mode"),
    "kill_master_at": (["--storage", "mooncake", "--instances", "2", "--kill-master-at", "-5"],
                       "--kill-master-at must be a wave >= 0 (or -1: never), got -5"),
    "segment_mib": (["--storage", "mooncake", "--instances", "2", "--segment-mib", "1"],
                    "--segment-mib must be >= 16, got 1"),
    "json": (["--json", "{missing}/r.json"], "--json {missing}/r.json: folder"),
}
#: flags without a value: nothing to get wrong
NO_VALUE = {"help", "no_progress", "verbose"}


def _one_error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    try:
        rc = main([*argv, "--no-progress"])
    except SystemExit as exc:  # argparse's own errors (type, choice)
        rc = exc.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert rc == 2, (argv, out, err)
    assert out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


def test_every_option_has_a_bad_value_case() -> None:
    dests = {a.dest for a in build_parser()._actions}
    assert dests - NO_VALUE == set(BAD)


@pytest.mark.parametrize("dest", sorted(BAD))
def test_bad_value_is_refused_with_one_line(dest: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    subst = {"file": str(a_file), "missing": str(tmp_path / "missing")}
    argv, expected = BAD[dest]
    line = _one_error_line(capsys, [a.format(**subst) for a in argv])
    assert line.startswith("tools/dev run"), line
    assert expected.format(**subst) in line, line


@pytest.mark.parametrize(("argv", "expected"), [
    # deepseek_v4 and hybrid have a file L3 (their extra host pools go through the v2 path);
    # a Mooncake store is mha/mla's only
    (["--model", "deepseek_v4", "--storage", "mooncake"],
     "--storage mooncake is not available for --model deepseek_v4"),
    (["--model", "hybrid", "--storage", "mooncake"],
     "--storage mooncake is not available for --model hybrid"),
    (["--model", "hybrid", "--storage", "none", "--storage-dir", "/tmp"],
     "--storage-dir /tmp is ignored by --storage none"),
    (["--model", "deepseek_v4", "--restart-at", "5"],
     "--restart-at 5 is ignored by --model deepseek_v4"),
    (["--model", "mla", "--heads", "8"], "--heads 8 is ignored by --model mla"),
    (["--model", "mha", "--kv-lora-rank", "8"], "--kv-lora-rank 8 is ignored by --model mha"),
    (["--storage", "none", "--storage-dir", "/tmp"],
     "--storage-dir /tmp is ignored by --storage none"),
    (["--storage", "none", "--storage-fault-rate", "0.1"],
     "--storage-fault-rate 0.1 is ignored by --storage none"),
    (["--storage-master", "h:1"], "--storage-master h:1 is ignored by --storage file"),
    (["--storage", "mooncake", "--storage-capacity-mb", "5"],
     "--storage-capacity-mb 5 is ignored by --storage mooncake"),
    (["--storage", "mooncake", "--storage-metadata", "http://h:1/m"],
     "--storage-metadata is ignored without --storage-master"),
    (["--kill-master-at", "1"], "--kill-master-at is an option of the multi-instance mode"),
    (["--storage", "mooncake", "--instances", "2", "--kill-master-at", "1",
      "--storage-master", "h:1"], "--kill-master-at is ignored with --storage-master"),
    (["--storage", "mooncake", "--instances", "2", "--storage-dir", "/tmp"],
     "--storage-dir is ignored by the multi-instance mode"),
    (["--storage", "file", "--instances", "2"], "argument --storage: invalid choice: 'file'"),
    (["--storage-dir", "/proc/mem-cache-forbidden"],
     "--storage-dir /proc/mem-cache-forbidden: cannot be created or written"),
    (["--json", "/"], "--json /: is a directory; expected a file path"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_mode_conflicts_are_refused(argv: list[str], expected: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert expected in _one_error_line(capsys, argv)


def test_storage_dir_is_created_and_used(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "new" / "l3"
    out = tmp_path / "r.json"
    rc = main([*_TINY, "--storage-dir", str(target), "--json", str(out), "--restart-at", "99999",
               "--no-progress"])
    text = capsys.readouterr().out
    assert rc == 0
    assert target.is_dir() and any(target.iterdir())  # pages were written there
    doc = json.loads(out.read_text())
    assert doc["storage_backend"] == "file" and doc["storage"]["backend"] == "file"
    # a restart step past the run's end is reported, in the table output and the JSON
    [warning] = doc["warnings"]
    assert warning.startswith("--restart-at 99999: no restart happened, the run ended after")
    assert "warning: --restart-at 99999: no restart happened" in text
    assert "│ L3 storage " in text and "file; directory" in text


_TINY = ["--layers", "2", "--heads", "2", "--head-dim", "16", "--device-tokens", "512",
         "--host-tokens", "256", "--requests", "16", "--max-running", "8", "--think-steps", "4"]


def test_help_is_the_manual(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: tools/dev run [OPTIONS]")
    groups = [g.title for g in parser._action_groups]
    for title in ("workload", "model", "memory", "storage tier (L3)", "faults", "output"):
        assert title in groups and f"\n{title}:\n" in text
    assert any(t and t.startswith("multi-instance") for t in groups)
    for action in parser._actions:
        assert action.help, action.dest
        if action.option_strings and action.default not in (None, False, "==SUPPRESS=="):
            assert f"(default: {action.default})" in " ".join(text.split()), action.dest
    for option in ("--instances", "--routing", "--kill-master-at", "--segment-mib", "--verbose"):
        assert option in text


def test_model_deepseek_v4_report_shows_its_l3_pools(capsys: pytest.CaptureFixture[str]) -> None:
    """deepseek_v4 has a file L3 by default (its c4 records an extra pool); ``--storage none``
    turns it off and the report says so."""
    base = ["--model", "deepseek_v4", "--layers", "2", "--requests", "3",
            "--device-tokens", "1024", "--host-tokens", "1024", "--no-progress"]
    assert main(base) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "L3 storage │ file" in out and "L3 pool deepseek_v4_c4" in out
    assert "store refusals 0" in out
    assert main([*base, "--storage", "none"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--storage none" in out and "L3 pool" not in out


def test_filtered_stderr_drops_glog_lines_only(capfd: pytest.CaptureFixture[str]) -> None:
    glog = b"E1201 20:13:12.892370  5429 transfer_metadata_plugin.cpp:292] GET http://x 404\n"
    assert GLOG_LINE.match(glog)
    with filtered_stderr(verbose=False) as hidden:
        os.write(2, b"WARNING: Logging before InitGoogleLogging() is written to STDERR\n")
        os.write(2, glog)
        os.write(2, b"a line of ours\n")
        print("python stderr", file=sys.stderr)
    assert hidden.dropped == 2
    err = capfd.readouterr().err
    assert "a line of ours" in err and "python stderr" in err
    assert "InitGoogleLogging" not in err and "metadata_plugin" not in err
    with filtered_stderr(verbose=True) as shown:
        os.write(2, glog)
    assert shown.dropped == 0 and "metadata_plugin" in capfd.readouterr().err
