"""MkDocs hook for the docs build: ``<!-- api: PACKAGE [members] -->`` in a page becomes the
package's mkdocstrings block followed by one block per public submodule at any depth (found
with ``pkgutil``, so a new module appears without editing the page). ``members`` renders the
package's own public names too (the kernels package, whose definitions live in private modules);
otherwise the package block shows its docstring only and the classes appear once, in their
modules.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

_DIRECTIVE = re.compile(r"^<!-- api: ([\w.]+)( members)? -->$", re.MULTILINE)


def _expand(m: re.Match[str]) -> str:
    name, members = m.group(1), bool(m.group(2))
    package = importlib.import_module(name)
    lines = [f"::: {name}", "    options:", "      show_submodules: false"]
    if not members:
        lines.append("      members: false")
    found = pkgutil.walk_packages(package.__path__, prefix=f"{name}.")
    for module in sorted(info.name for info in found):
        if any(part.startswith("_") for part in module.split(".")[1:]):
            continue  # private modules, __main__
        lines += ["", f"::: {module}", "    options:", "      heading_level: 2"]
    return "\n".join(lines)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return _DIRECTIVE.sub(_expand, markdown)
