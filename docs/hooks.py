"""MkDocs hooks of the docs build.

* API reference, one page per public module: ``<!-- api: PACKAGE [members] -->`` in a package's
  page (``docs/api/*.md``) becomes the package's mkdocstrings block (its docstring; with
  ``members`` its own public names too, for the kernels package whose definitions live in
  private modules) and a list of links to one generated page per public submodule at any depth
  (found with ``pkgutil``, so a new module appears without editing anything). The generated
  pages are added to the site (``on_files``) and to the navigation under their package
  (``on_config``).
* The architecture page must name every distribution and import name of ``packages/*`` (and the
  import names inside its layer diagram, the first ``text`` block after ``## Layers``), say how
  many there are, and give each distribution a row in its layer table whose "may import" cell
  names exactly the distribution's mem-cache dependencies (``packages/*/pyproject.toml``): the
  build fails otherwise (``check_architecture``), so a new distribution or a new dependency
  between layers cannot be left out. ``check_layer_table`` is the same check for any such
  table (tests/test_docs_consistency.py runs it on the README's).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path
from typing import Any

import tomllib

ROOT = Path(__file__).resolve().parent.parent
_DIRECTIVE = re.compile(r"^<!-- api: ([\w.]+)( members)? -->$", re.MULTILINE)
_PAGE = re.compile(r"api/(\w+)\.md")


class DocsCheckError(Exception):
    """The docs disagree with the repository (raised as a build error)."""


def distributions() -> dict[str, str]:
    """Distribution name -> import name, from ``packages/*/pyproject.toml``."""
    found = {}
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        name = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["name"]
        [src] = [p.name for p in (pyproject.parent / "src").iterdir()
                 if p.is_dir() and not p.name.startswith((".", "_"))]
        found[name] = src
    return found


def layers() -> dict[str, set[str]]:
    """Distribution name -> the mem-cache distributions it depends on (its ``dependencies`` in
    ``packages/*/pyproject.toml``, versions and markers dropped)."""
    dists = distributions()
    found = {}
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        deps = {re.split(r"[\s<>=!~;\[]", d, maxsplit=1)[0]
                for d in project.get("dependencies", [])}
        found[project["name"]] = deps & set(dists)
    return found


def _short(dist: str) -> str:
    """``mem-cache-pool-host`` -> ``pool-host`` (how the layer tables name a dependency)."""
    return dist.removeprefix("mem-cache-")


def _table_rows(markdown: str, column: str) -> dict[str, str]:
    """Distribution -> its cell in ``column`` of the first markdown table with that header."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and column in cells:
            at = cells.index(column)
            rows = {}
            for row in lines[i + 2:]:
                if not row.lstrip().startswith("|"):
                    break
                values = [c.strip() for c in row.strip().strip("|").split("|")]
                if len(values) > at:
                    rows[values[0].strip("`")] = values[at]
            return rows
    return {}


def check_layer_table(markdown: str, column: str, where: str) -> None:
    """``DocsCheckError`` unless the first table with a ``column`` header has one row per
    distribution whose ``column`` cell names exactly its mem-cache dependencies (short names:
    ``pool-host, pool, kernels``; anything else in the cell, e.g. ``torch``, is ignored)."""
    rows = _table_rows(markdown, column)
    if not rows:
        raise DocsCheckError(f"{where}: no table with a {column!r} column")
    short = sorted((_short(d) for d in distributions()), key=len, reverse=True)
    token = re.compile(rf"(?<![\w-])({'|'.join(map(re.escape, short))})(?![\w-])")
    wrong = []
    for dist, deps in layers().items():
        if dist not in rows:
            wrong.append(f"{dist} has no row")
            continue
        named = set(token.findall(rows[dist]))
        want = {_short(d) for d in deps}
        if named != want:
            wrong.append(f"{dist} may import {', '.join(sorted(want)) or 'none of the others'}, "
                         f"the table says {', '.join(sorted(named)) or 'none'}")
    if wrong:
        raise DocsCheckError(f"{where}, {column!r} column: {'; '.join(wrong)} "
                             "(packages/*/pyproject.toml)")


def _names(name: str, text: str) -> bool:
    """``name`` occurs in ``text`` as a whole name (``mem-cache-pool`` not inside
    ``mem-cache-pool-host``)."""
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def check_architecture(markdown: str) -> None:
    """``DocsCheckError`` naming every distribution or import name the architecture page (or its
    layer diagram) leaves out, a layer table row that is missing or names other dependencies
    (:func:`check_layer_table`), and a count of distributions that is not the real one."""
    dists = distributions()
    missing = [n for pair in dists.items() for n in pair if not _names(n, markdown)]
    layers = markdown.split("## Layers", 1)[-1]
    diagram = re.search(r"```text\n(.*?)```", layers, re.DOTALL)
    if diagram is None:
        raise DocsCheckError("docs/architecture.md: no ```text layer diagram after ## Layers")
    missing += [f"{imp} (in the layer diagram)" for imp in dists.values()
                if not _names(imp, diagram.group(1))]
    if missing:
        raise DocsCheckError(f"docs/architecture.md does not name: {', '.join(missing)} "
                             f"(packages/ holds {len(dists)} distributions)")
    check_layer_table(layers, "may import", "docs/architecture.md")
    words = {4: "Four", 5: "Five", 6: "Six", 7: "Seven", 8: "Eight"}
    word = words.get(len(dists), str(len(dists)))
    if f"{word} distributions" not in layers.split("```", 1)[0]:
        raise DocsCheckError(f"docs/architecture.md: the Layers section must say "
                             f"'{word} distributions' (packages/ holds {len(dists)})")


def public_modules(package: str) -> list[str]:
    """The public submodules of ``package`` at any depth, sorted (``__main__`` excluded)."""
    found = pkgutil.walk_packages(importlib.import_module(package).__path__,
                                  prefix=f"{package}.")
    return sorted(info.name for info in found
                  if not any(part.startswith("_") for part in info.name.split(".")[1:]))


def _package_pages() -> dict[str, str]:
    """Package page (``api/pool.md``) -> package import name, from the pages' directives."""
    pages = {}
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        m = _DIRECTIVE.search(page.read_text(encoding="utf-8"))
        if m:
            pages[f"api/{page.name}"] = m.group(1)
    return pages


def _module_page(module: str) -> str:
    return f"api/{module.split('.', maxsplit=1)[0]}/{module}.md"


def _expand(m: re.Match[str]) -> str:
    name, members = m.group(1), bool(m.group(2))
    lines = [f"::: {name}", "    options:", "      show_submodules: false"]
    if not members:
        lines.append("      members: false")
    lines += ["", "## Modules", ""]
    lines += [f"* [`{module}`](../{_module_page(module)})" for module in public_modules(name)]
    return "\n".join(lines)


def on_config(config: Any, **kwargs: Any) -> Any:
    """Nest each package page's module pages under it in the navigation."""
    pages = _package_pages()

    def expand(entries: list[Any]) -> list[Any]:
        out: list[Any] = []
        for entry in entries:
            if isinstance(entry, dict):
                [(title, target)] = entry.items()
                if isinstance(target, list):
                    out.append({title: expand(target)})
                elif target in pages:
                    modules = [{module.removeprefix(pages[target] + "."): _module_page(module)}
                               for module in public_modules(pages[target])]
                    out.append({title: [{"overview": target}, *modules]})
                else:
                    out.append(entry)
            else:
                out.append(entry)
        return out

    config["nav"] = expand(config["nav"])
    return config


#: wide code blocks wrap instead of scrolling sideways
_EXTRA_CSS = ".highlight pre, pre code { white-space: pre-wrap; word-break: break-word; }\n"


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    """Add one generated page per public module, and the Pygments stylesheet (served locally:
    the site loads nothing from the network)."""
    from mkdocs.structure.files import File
    from pygments.formatters import HtmlFormatter

    css = HtmlFormatter(style="default").get_style_defs(".highlight") + "\n" + _EXTRA_CSS
    files.append(File.generated(config, "css/pygments.css", content=css))

    for package in _package_pages().values():
        for module in public_modules(package):
            content = (f"# `{module}`\n\n::: {module}\n    options:\n"
                       "      show_root_heading: false\n      heading_level: 2\n")
            files.append(File.generated(config, _module_page(module), content=content))
    return files


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri == "architecture.md":
        try:
            check_architecture(markdown)
        except DocsCheckError as exc:
            from mkdocs.exceptions import PluginError

            raise PluginError(str(exc)) from None
    return _DIRECTIVE.sub(_expand, markdown)
