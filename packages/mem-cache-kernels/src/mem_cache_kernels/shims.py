"""Moved-name shims: keep an old import path working after a definition moved.

When a class or function moves to another module, its old module keeps a PEP 562 module-level
``__getattr__`` that resolves the old name to the object at its new home and emits one
``DeprecationWarning`` naming the new path. This module lives in the lowest package
(``mem_cache_kernels``) and imports nothing but the standard library and the package's argument
checks, so every package can use it without breaking the layering and without importing triton.

Usage at the old location (the whole module body once everything moved out)::

    from __future__ import annotations

    from typing import TYPE_CHECKING

    from mem_cache_kernels.shims import moved_names

    __all__: list[str] = []

    if TYPE_CHECKING:  # the static view: mypy, IDEs and import-linter see the real definition
        from mem_cache_pool.layout import page_count as page_count  # noqa: PLC0414
    else:  # the runtime view: PEP 562 forwarding with a DeprecationWarning
        __getattr__ = moved_names(__name__, {"page_count": "mem_cache_pool.layout"})

Contract:

* ``from old import Name`` and ``old.Name`` return the very object defined in the new module
  (``old.Name is new.Name``) and warn once per attribute access: nothing is cached in the old
  module's namespace, so each access site is reported (the warning filter then decides whether it
  is shown once or every time). ``stacklevel=2`` attributes the warning to the importing module,
  so ``-W error::DeprecationWarning`` (or pytest's ``filterwarnings``) turns a stale internal
  import into an error.
* The new module is imported lazily, on first access: importing the old module costs nothing.
* Any other missing name raises ``AttributeError`` exactly like a normal module.
* Static view: mypy reads the ``if TYPE_CHECKING:`` re-import (``as Name`` marks it as an explicit
  re-export under ``--strict``) and never sees ``__getattr__``, which sits in the ``else:``
  branch. Were ``__getattr__`` visible, mypy would type every attribute of the old module as
  ``Any`` and stop flagging typos such as ``from old import Nmae``. import-linter sees the
  re-import too, so a shim that points upward (to a higher layer) is reported by the ``layers``
  contract: keep shims in the same package as the new home, or move definitions downward only.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from mem_cache_kernels.checks import check_int

__all__ = ["moved_names"]


def moved_names(
    module_name: str, moved: Mapping[str, str], *, stacklevel: int = 2
) -> Callable[[str], Any]:
    """Build a PEP 562 module ``__getattr__`` that forwards moved names to their new module.

    Args:
        module_name: dotted name of the old module (pass ``__name__``).
        moved: maps each moved attribute name to its new home: either ``"new.module"`` (same
            name there) or ``"new.module:NewName"`` (the object was also renamed).
        stacklevel: passed to ``warnings.warn``; 2 attributes the warning to the module that
            accessed the name. Add one per wrapper frame (a ``__getattr__`` that calls the
            returned function passes 3).

    Returns:
        A function to assign to the old module's ``__getattr__``. For a moved name it imports the
        new module, emits one ``DeprecationWarning`` ("``old.Name`` moved to ``new.module.Name``;
        import it from there") and returns the object; for any other name it raises
        ``AttributeError``.

    Raises:
        TypeError: ``module_name`` is not a str, ``moved`` is not a mapping of str to str, or
            ``stacklevel`` is not an int.
        ValueError: ``module_name`` or a target is empty, a name is not an identifier, or
            ``stacklevel`` is < 1.
    """
    if not isinstance(module_name, str):
        raise TypeError(f"module_name must be a str, got {type(module_name).__name__}")
    if not module_name:
        raise ValueError("module_name must be a non-empty dotted module name, got ''")
    check_int("stacklevel", stacklevel, minimum=1)
    if not isinstance(moved, Mapping):
        raise TypeError(f"moved must be a mapping of name -> module, got {type(moved).__name__}")
    table: dict[str, tuple[str, str]] = {}
    for name, target in moved.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"moved name must be an identifier, got {name!r}")
        if not isinstance(target, str):
            raise TypeError(f"moved[{name!r}] must be a str, got {type(target).__name__}")
        if not target or target.startswith(":"):
            raise ValueError(f"moved[{name!r}] must be a non-empty module path, got {target!r}")
        new_module, _, new_name = target.partition(":")
        table[name] = (new_module, new_name or name)

    def __getattr__(name: str) -> Any:
        entry = table.get(name)
        if entry is None:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        new_module, new_name = entry
        warnings.warn(
            f"{module_name}.{name} moved to {new_module}.{new_name}; "
            f"import it from {new_module} (the old path is deprecated)",
            DeprecationWarning,
            stacklevel=stacklevel,
        )
        return getattr(importlib.import_module(new_module), new_name)

    __getattr__.__qualname__ = f"moved_names.<{module_name}>.__getattr__"
    return __getattr__
