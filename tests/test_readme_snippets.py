"""Every ``python`` block of README.md and packages/*/README.md runs as written, on the CPU.

A block is executed in a fresh namespace (it asserts its own results); blocks of one README share
nothing. A block that is illustrative only (it needs a GPU, a second process, an engine's own
class) is opted out by a ``<!-- not-run: REASON -->`` comment on the line before its fence; the
reason is required and the opt-outs are listed by ``test_opt_outs_are_few_and_explained``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
READMES = sorted(["README.md", *(str(p.relative_to(ROOT)) for p in
                                  (ROOT / "packages").glob("*/README.md"))])
_FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
_NOT_RUN = re.compile(r"<!-- not-run: (.+?) -->\s*$")
#: the most opt-outs allowed over all READMEs ("used sparingly")
MAX_OPT_OUTS = 2


def blocks(readme: str) -> list[tuple[int, str, str | None]]:
    """``(line, code, not-run reason or None)`` of every python block of ``readme``."""
    text = (ROOT / readme).read_text(encoding="utf-8")
    found = []
    for m in _FENCE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = _NOT_RUN.search(before)
        found.append((line, m.group(1), reason.group(1) if reason else None))
    return found


CASES = [(readme, line, code) for readme in READMES for line, code, reason in blocks(readme)
         if reason is None]


@pytest.mark.parametrize(("readme", "line", "code"), CASES,
                         ids=[f"{r}:{n}" for r, n, _ in CASES])
def test_readme_python_block_runs(readme: str, line: int, code: str) -> None:
    exec(compile("\n" * (line) + code, f"{readme}", "exec"), {"__name__": "readme_example"})


def test_opt_outs_are_few_and_explained() -> None:
    opted = [(r, n, why) for r in READMES for n, _, why in blocks(r) if why is not None]
    assert len(opted) <= MAX_OPT_OUTS, opted
    assert all(len(why) >= 10 for _, _, why in opted), opted


def test_the_allocator_quick_start_shows_the_whole_cycle() -> None:
    [(_, first, _), *_] = blocks("packages/mem-cache-allocator/README.md")
    for call in ("alloc_extend(", "alloc_decode(", ".free(", "available_size()", '"cpu"'):
        assert call in first, call
