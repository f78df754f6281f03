"""import-linter contract types for any repository: ``eager_forbidden``.

Register them in the repository's ``.importlinter`` (``[importlinter]`` section; the contract
types live in the ``mem-cache-refactor`` distribution, which must be installed where
``lint-imports`` runs)::

    contract_types =
        eager_forbidden: mem_cache_refactor.contracts.EagerForbiddenContract

``eager_forbidden``: importing any module under ``source_modules`` must not execute an import
of ``forbidden_modules`` (or their descendants), directly or through any chain of modules.

import-linter (via grimp) records every ``import`` statement of a file as the same kind of
graph edge, whether it runs at module import time or inside a function body. This contract is
about import time only: a kernel launcher may import a GPU library inside the function that
needs it, but importing the package must not. It re-parses each module on a path with
:mod:`ast` and follows only the import lines that execute when the module is imported:

* module-level statements, including class bodies and module-level ``try``/``with``/``for``/``if``
  blocks (an ``if`` branch may run, so it counts);
* **not** function or lambda bodies (run on call, not on import);
* **not** the body of ``if TYPE_CHECKING:`` / ``if typing.TYPE_CHECKING:`` (never runs), but its
  ``else:`` branch does count;
* importing ``a.b.c`` first runs the packages ``a`` and ``a.b``: those implicit edges count too;
* a guarded import (``try: import x`` / ``except ImportError:``) runs eagerly: it counts, and its
  hop is shown as ``guarded``.

The graph is read from the files (:mod:`mem_cache_refactor._eager`), not taken from
import-linter's: folders without ``__init__.py`` under a root package (namespace folders, as
SGLang's ``srt/``) are followed, and an external module keeps its full name, so
``sgl_kernel.kvcacheio`` or ``triton.language`` can be forbidden on their own (``from x import y``
counts as loading ``x.y``). External modules are not followed into.

A contract never passes without checking: a source module that is outside the root packages or
cannot be found, an internal forbidden module that cannot be found, and an external forbidden
module that is neither installed nor imported by any module of the root packages break the
contract with a message that names the module and says why.

The edges are followed transitively, through modules of any root package (not only the
sources), and each forbidden module reached is reported with its full chain, one ``file:line``
per hop::

    engine.alloc imports kernel_ext at import time:
      engine.alloc -> engine.alloc.sparse (l.3) -> engine.pool (l.5) -> kernel_ext (l.4)
        python/engine/alloc/__init__.py:3: from engine.alloc.sparse import SparseAllocator
        ...

A chain that is the tail of a longer reported chain is not repeated.

Configuration (INI)::

    [importlinter:contract:no-eager-kernels]
    name = No module imports the kernel extension at import time
    type = eager_forbidden
    source_modules =
        engine.mem_cache
    forbidden_modules =
        kernel_ext
    exempt_modules =
        engine.mem_cache._kernels

``source_modules`` are packages: every module inside them is an entry point; with
``as_packages = False`` only the listed modules themselves are (``import engine.alloc`` must stay
light, while ``engine.alloc.sparse`` may load the kernels when imported on its own).
``exempt_modules`` (and their descendants) are not entry points: they are the implementation
modules that may import the forbidden module eagerly (an entry point that reaches them still
counts).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from typing import Any

from importlinter import Contract, ContractCheck, fields, output

from mem_cache_refactor._eager import (
    EagerChain,
    EagerIndex,
    Hop,
    eager_imports,
    find_chains,
)
from mem_cache_refactor._locate import Locator, unresolved_modules

__all__ = [
    "EagerChain",
    "EagerForbiddenContract",
    "Hop",
    "eager_import_lines",
    "find_eager_chains",
]


def eager_import_lines(source: str) -> set[int]:
    """Return the line numbers of import statements executed when ``source`` is imported.

    A multi-line ``from x import (a, b)`` contributes every line it spans, since tools report
    either its first line or the line of the imported name.
    """
    tree = ast.parse(source)
    lines: set[int] = set()
    for node, _ in eager_imports(tree.body):
        end = node.end_lineno if node.end_lineno is not None else node.lineno
        lines.update(range(node.lineno, end + 1))
    return lines


def find_eager_chains(
    graph: Any,
    sources: Iterable[str],
    forbidden: Iterable[str],
    exempt: Iterable[str],
    *,
    as_packages: bool = True,
) -> list[EagerChain]:
    """For each module under ``sources`` (minus ``exempt``), the shortest import-time chain to
    each module under ``forbidden`` it reaches, read from the files found on ``sys.path``. The
    root packages are the unsquashed top packages of import-linter's ``graph`` and the sources'
    top packages. Chains that are the tail of another, and chains that start by running an
    enclosing package that is an entry point itself, are left out."""
    sources = list(sources)
    roots = {m.split(".")[0] for m in graph.modules if not graph.is_module_squashed(m)}
    roots.update(s.split(".")[0] for s in sources)
    index = EagerIndex(Locator(sys.path, sorted(roots)))
    return find_chains(index, sources, forbidden, exempt, as_packages=as_packages)


class EagerForbiddenContract(Contract):
    """Importing a module under ``source_modules`` must not import ``forbidden_modules`` at
    import time, directly or transitively."""

    type_name = "eager_forbidden"

    source_modules = fields.ListField(subfield=fields.StringField())
    forbidden_modules = fields.ListField(subfield=fields.StringField())
    exempt_modules = fields.ListField(subfield=fields.StringField(), required=False, default=[])
    as_packages = fields.BooleanField(required=False, default=True)

    def check(self, graph: Any, verbose: bool) -> ContractCheck:
        # the base class turns the field declarations into parsed lists of strings
        options: dict[str, list[str]] = {
            name: list(getattr(self, name))
            for name in ("source_modules", "forbidden_modules", "exempt_modules")
        }
        roots = [str(r) for r in self.session_options.get("root_packages", [])]
        index = EagerIndex(Locator(sys.path, roots))
        errors = unresolved_modules(
            index.locator, options["source_modules"], options["forbidden_modules"]
        )
        chains = [] if errors else find_chains(
            index,
            options["source_modules"],
            options["forbidden_modules"],
            options["exempt_modules"],
            as_packages=bool(self.as_packages),
        )
        return ContractCheck(
            kept=not chains and not errors,
            metadata={"errors": errors, "chains": [
                {
                    "source": c.source,
                    "forbidden": c.forbidden,
                    "summary": c.summary(),
                    "hops": [
                        (h.file, h.line_number, h.importer, h.imported, h.line_contents)
                        for h in c.hops
                    ],
                }
                for c in chains
            ]},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        for error in check.metadata.get("errors", []):
            output.print_error(f"Cannot check: {error}", bold=True)
            output.new_line()
        for chain in check.metadata["chains"]:
            output.print_error(
                f"{chain['source']} imports {chain['forbidden']} at import time:", bold=True
            )
            output.indent_cursor()
            output.print_error(chain["summary"], bold=False)
            for file, line, importer, imported, contents in chain["hops"]:
                if line:
                    text = f"  {file}:{line}: {contents}"
                else:
                    text = f"  {file}: importing {importer} runs its package {imported} first"
                output.print_error(text, bold=False)
            output.new_line()
        if check.metadata["chains"]:
            output.print_error(
                "Fix: move the import into the function that needs it, guard it with "
                "`if TYPE_CHECKING:`, or stop re-exporting the module that pulls it in.",
                bold=False,
            )
