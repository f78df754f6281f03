"""The worked examples of the DeepSeek-V4 / HiSparse README sections run as they stand.

Every ``python`` block between a ``## `` heading that names DeepSeek-V4 and the next ``## ``
heading is executed in a fresh namespace (the blocks assert their own results).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
READMES = [
    "packages/mem-cache-kernels/README.md",
    "packages/mem-cache-pool/README.md",
    "packages/mem-cache-allocator/README.md",
    "packages/mem-cache-pool-host/README.md",
]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _deepseek_v4_blocks(text: str) -> list[str]:
    blocks: list[str] = []
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        if "DeepSeek-V4" in section.splitlines()[0]:
            blocks.extend(_BLOCK.findall(section))
    return blocks


@pytest.mark.parametrize("readme", READMES)
def test_deepseek_v4_readme_examples_run(readme: str) -> None:
    blocks = _deepseek_v4_blocks((ROOT / readme).read_text(encoding="utf-8"))
    assert blocks, f"{readme}: no python example in a DeepSeek-V4 section"
    for code in blocks:
        exec(compile(code, readme, "exec"), {"__name__": "readme_example"})


def test_blocks_are_found_only_in_the_named_sections() -> None:
    text = "## Other\n```python\nraise SystemExit\n```\n## DeepSeek-V4 x\n```python\nx = 1\n```\n"
    assert _deepseek_v4_blocks(text) == ["x = 1\n"]
