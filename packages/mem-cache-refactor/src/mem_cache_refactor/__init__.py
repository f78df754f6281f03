"""mem-cache-refactor: refactor-safety tools that work on any Python repository.

* ``move-check REF_A REF_B``: checks the classes and functions moved between two git refs
  (:mod:`mem_cache_refactor.move_check`);
* ``rewrite-imports OLD NEW [paths]``: rewrites the import sites of a moved name or module
  (:mod:`mem_cache_refactor.rewrite_imports`);
* ``api-snapshot check|update``: committed public-API snapshots
  (:mod:`mem_cache_refactor.api_snapshot`);
* ``griffe-check``: griffe's breaking-change check against the merge base
  (:mod:`mem_cache_refactor.griffe_check`, needs the ``griffe`` extra);
* import-linter contract types for any repository's ``.importlinter``
  (:mod:`mem_cache_refactor.contracts`).

Nothing here imports torch or any ``mem_cache_*`` runtime package.
"""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
