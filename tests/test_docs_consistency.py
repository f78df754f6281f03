"""The README, the architecture page, the package READMEs and ``tools/dev run --help`` name the
same six distributions and layers (what each may import: ``packages/*/pyproject.toml``), and the
docs build fails when the architecture page leaves a distribution or a layer out
(``docs/hooks.py``'s ``check_architecture``, run by ``mkdocs build --strict``)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from tools.simulate.options import build_parser

ROOT = Path(__file__).resolve().parent.parent


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOKS = _hooks()
DISTS = HOOKS.distributions()
DOCS = ["README.md", "docs/architecture.md",
        *sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("packages/*/README.md"))]


def _names(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def test_six_distributions() -> None:
    assert len(DISTS) == 6, DISTS
    assert DISTS["mem-cache-storage"] == "mem_cache_storage"


@pytest.mark.parametrize("doc", DOCS)
def test_doc_names_every_distribution(doc: str) -> None:
    text = (ROOT / doc).read_text(encoding="utf-8")
    assert [d for d in DISTS if not _names(d, text)] == []
    for stale in ("four distributions", "five distributions", "five small", "five packages",
                  "all five", "four layers"):
        assert stale not in text.lower(), stale


def test_run_help_names_every_distribution() -> None:
    text = " ".join(build_parser().format_help().split())
    assert [d for d in DISTS if not _names(d, text)] == []


def test_architecture_page_passes_the_hook() -> None:
    HOOKS.check_architecture((ROOT / "docs" / "architecture.md").read_text(encoding="utf-8"))


@pytest.mark.parametrize("drop", ["mem-cache-storage", "mem_cache_refactor"])
def test_hook_fails_when_a_distribution_is_missing(drop: str) -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    with pytest.raises(HOOKS.DocsCheckError, match=drop):
        HOOKS.check_architecture(re.sub(rf"(?<![\w-]){re.escape(drop)}(?![\w-])", "x", text))


def test_hook_fails_when_the_diagram_lacks_a_layer() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    head, diagram, tail = re.split(r"(```text\n.*?```)", text, maxsplit=1, flags=re.DOTALL)
    broken = head + diagram.replace("mem_cache_storage", "storage") + tail
    with pytest.raises(HOOKS.DocsCheckError, match=r"mem_cache_storage \(in the layer diagram\)"):
        HOOKS.check_architecture(broken)


def test_hook_fails_on_a_wrong_count() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    with pytest.raises(HOOKS.DocsCheckError, match="Six distributions"):
        HOOKS.check_architecture(text.replace("Six distributions", "Five distributions"))


def test_layers_come_from_the_pyprojects() -> None:
    layers = HOOKS.layers()
    assert layers["mem-cache-storage"] == {"mem-cache-pool-host", "mem-cache-pool",
                                           "mem-cache-kernels"}
    assert layers["mem-cache-kernels"] == set() and layers["mem-cache-refactor"] == set()


def test_readme_layer_table_matches_the_pyprojects() -> None:
    HOOKS.check_layer_table((ROOT / "README.md").read_text(encoding="utf-8"), "depends on",
                            "README.md")


def test_hook_fails_when_a_layer_dependency_is_missing() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    broken = text.replace("| pool-host, pool, kernels |", "| pool, kernels |", 1)
    assert broken != text
    with pytest.raises(HOOKS.DocsCheckError,
                       match="mem-cache-storage may import kernels, pool, pool-host"):
        HOOKS.check_architecture(broken)


def test_hook_fails_when_a_layer_row_is_missing() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    broken = "\n".join(line for line in text.splitlines()
                       if not line.startswith("| mem-cache-pool-host |"))
    with pytest.raises(HOOKS.DocsCheckError, match="mem-cache-pool-host has no row"):
        HOOKS.check_layer_table(broken, "may import", "docs/architecture.md")


def test_the_build_fails_on_a_broken_architecture_page() -> None:
    from mkdocs.exceptions import PluginError

    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    page = SimpleNamespace(file=SimpleNamespace(src_uri="architecture.md"))
    HOOKS.on_page_markdown(text, page=page)  # the real page builds
    with pytest.raises(PluginError, match="mem_cache_storage"):
        HOOKS.on_page_markdown(text.replace("mem_cache_storage", "storage"), page=page)


def test_package_readmes_state_the_same_stack() -> None:
    """Every package README opens with the same "Part of mem-cache" paragraph (the stack)."""
    paragraphs = {}
    for readme in sorted(ROOT.glob("packages/*/README.md")):
        text = readme.read_text(encoding="utf-8")
        start = text.index("Part of mem-cache: ")
        paragraphs[readme.parent.name] = text[start:text.index("Install", start)]
    assert len(set(paragraphs.values())) == 1, paragraphs
    assert len(paragraphs) == len(DISTS)


def test_dev_help_has_no_stale_count() -> None:
    text = " ".join(subprocess.run([sys.executable, str(ROOT / "tools" / "dev"), "--help"],
                                   capture_output=True, text=True, check=True).stdout.split())
    run_help = " ".join(build_parser().format_help().split())
    for doc in (text, run_help):
        for word in ("four", "five", "seven"):
            assert f"{word} mem-cache" not in doc.lower(), word
            assert f"{word} distributions" not in doc.lower(), word
    assert "all six distributions" in text


def test_one_api_page_per_public_module() -> None:
    pages = HOOKS._package_pages()
    assert sorted(pages.values()) == sorted(DISTS.values())
    for package in pages.values():
        modules = HOOKS.public_modules(package)
        assert modules and all(not m.split(".")[-1].startswith("_") for m in modules)


def test_docs_load_nothing_from_a_cdn() -> None:
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["theme"]["highlightjs"] is False  # the mkdocs theme's highlight.js is a CDN
    assert "css/pygments.css" in config["extra_css"]  # generated by the hook's on_files
    assert any(isinstance(e, dict) and "pymdownx.highlight" in e
               for e in config["markdown_extensions"])
