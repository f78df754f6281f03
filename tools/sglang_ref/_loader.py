"""Import SGLang's modules from the unpacked wheel, standing in only for what is not installed.

Three mechanisms, each as narrow as it can be:

1. ``sglang`` itself is registered as a bare package over the unpacked tree, so that
   ``sglang/__init__.py`` (the frontend language, IPython and friends) never runs.
2. :data:`STUBBED_INTERNAL`: SGLang modules replaced by stand-ins because importing them drags in
   the HTTP/OpenAI protocol stack (pydantic models over types we stand in for). Neither is on a
   memory path.
3. A third-party package that SGLang's own code imports and that is not installed (``sgl_kernel``,
   ``transformers``, ``flashinfer``, ...) becomes a permissive stand-in module: attribute access,
   calls, subclassing, indexing and comparison all succeed and mean nothing. The finder only
   answers imports made *from files under the SGLang tree* and only after every real finder
   declined, so nothing of ours or of the test process is ever shadowed. :func:`stubbed_externals`
   lists what was stood in for, for the test reports.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tools.sglang_ref._wheel import ensure_wheel

STUBBED_INTERNAL = frozenset({
    "sglang.srt.entrypoints.openai.protocol",
    "sglang.srt.parser.reasoning_parser",
})
# Never stood in for: if these are missing the run is meaningless.
_REAL_ONLY = frozenset({"sglang", "torch", "numpy", "triton", "mem_cache_kernels", "mem_cache_pool",
                        "mem_cache_allocator", "mem_cache_pool_host", "mem_cache_storage", "tools",
                        "tests"})

_stubbed: set[str] = set()


class _StubBase:
    """Base class a stand-in turns into when SGLang subclasses it."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        pass

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return _Stand(name)


class _Stand:
    """A value that accepts every use and means nothing (see the module docstring)."""

    def __init__(self, name: str = "?") -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and isinstance(args[0], types.FunctionType):
            return args[0]  # used as a decorator: keep the function
        return _Stand(self._name + "()")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stand(f"{self._name}.{name}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (_StubBase,)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __or__(self, other: Any) -> Any:
        return self

    __ror__ = __or__

    def __getitem__(self, key: Any) -> Any:
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __contains__(self, key: Any) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)

    def __int__(self) -> int:
        return 0

    def __index__(self) -> int:
        return 0

    def __float__(self) -> float:
        return 0.0

    def __lt__(self, other: Any) -> bool:
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *args: Any) -> None:
        return None

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> Any:
        from pydantic_core import core_schema  # type: ignore[import-not-found]

        return core_schema.any_schema()

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


class _StandModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stand(f"{self.__name__}.{name}")


class _StandLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _InternalFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: answers only the names in :data:`STUBBED_INTERNAL`."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in STUBBED_INTERNAL:
            return importlib.machinery.ModuleSpec(fullname, _StandLoader(), is_package=True)
        return None


class _MissingFinder(importlib.abc.MetaPathFinder):
    """Last on ``sys.meta_path``: a missing third-party import made by SGLang's own files."""

    def __init__(self, tree: Path) -> None:
        self._prefix = str(tree) + "/"

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        top = fullname.split(".", maxsplit=1)[0]
        if top in _REAL_ONLY:
            return None
        if top not in _stubbed and not self._imported_by_sglang():
            return None
        _stubbed.add(top)
        return importlib.machinery.ModuleSpec(fullname, _StandLoader(), is_package=True)

    def _imported_by_sglang(self) -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if not (name.startswith("<frozen") or "importlib" in name):
                return name.startswith(self._prefix)
            frame = frame.f_back  # type: ignore[assignment]
        return False


_installed: Path | None = None


def _install() -> Path:
    global _installed
    if _installed is not None:
        return _installed
    tree = ensure_wheel()
    deps = tree.parent / "deps"
    if str(deps) not in sys.path:
        sys.path.append(str(deps))  # after the venv: never shadows an installed package
    existing = sys.modules.get("sglang")
    if existing is not None and not str(getattr(existing, "__file__", None) or "").startswith(
            str(tree)) and list(getattr(existing, "__path__", [])) != [str(tree / "sglang")]:
        raise RuntimeError(f"another sglang is already imported ({existing!r}); the reference "
                           f"run needs the {tree.name} tree")
    if existing is None:
        package = types.ModuleType("sglang")
        package.__path__ = [str(tree / "sglang")]
        package.__file__ = None
        sys.modules["sglang"] = package
    sys.meta_path.insert(0, _InternalFinder())
    sys.meta_path.append(_MissingFinder(tree))
    _installed = tree
    return tree


def load(*modules: str) -> list[types.ModuleType]:
    """Import SGLang modules (``"sglang.srt.mem_cache.radix_cache"``, ...) from the wheel's tree.

    Fetches the wheel on first use (:func:`tools.sglang_ref.ensure_wheel`). Returns the modules in
    the order given. Raises :class:`tools.sglang_ref.WheelUnavailable` when the wheel cannot be
    had, ``ValueError`` for a name outside ``sglang``.
    """
    for name in modules:
        if not isinstance(name, str) or not name.startswith("sglang."):
            raise ValueError(f"modules must be names under 'sglang.', got {name!r}")
    _install()
    return [importlib.import_module(name) for name in modules]


def stubbed_externals() -> list[str]:
    """Top-level third-party packages stood in for so far (sorted)."""
    return sorted(_stubbed)
