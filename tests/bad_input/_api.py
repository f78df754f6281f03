"""The public callables of the four packages, enumerated from the committed API snapshots.

``tests/contracts/api/<package>.json`` lists every public module and name. Functions are taken as
they are; for a public class every public method it has at run time (its own and inherited
ones, since a subclass may override the validation) is a callable of its own, keyed
``"<module>:<Class>.<method>"``. Callables that take no argument besides ``self`` have no caller
input to be hostile about and are listed separately.
"""

from __future__ import annotations

import importlib
import inspect
import json
from functools import cache
from pathlib import Path

__all__ = ["API_DIR", "PACKAGES", "public_callables"]

API_DIR = Path(__file__).resolve().parents[1] / "contracts" / "api"
# the four runtime packages (other snapshots, e.g. the refactor tooling, are not KV-cache APIs)
PACKAGES = ("mem_cache_kernels", "mem_cache_pool", "mem_cache_allocator", "mem_cache_pool_host")


def _takes_input(fn: object, *, method: bool) -> bool:
    try:
        params = list(inspect.signature(fn).parameters.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
    if method and params and params[0].name in ("self", "cls"):
        params = params[1:]
    return bool(params)


@cache
def public_callables() -> dict[str, bool]:
    """``{key: takes_input}`` for every public function and method of the four packages."""
    out: dict[str, bool] = {}
    for package in PACKAGES:
        doc = json.loads((API_DIR / f"{package}.json").read_text())
        for module_name, info in doc["modules"].items():
            module = importlib.import_module(module_name)
            for name, entry in info["names"].items():
                obj = getattr(module, name, None)
                if obj is None:
                    continue
                if entry["kind"] == "function" and callable(obj):
                    key = f"{obj.__module__}:{obj.__qualname__}"
                    out[key] = _takes_input(obj, method=False)
                elif entry["kind"] == "class" and inspect.isclass(obj):
                    if issubclass(obj, BaseException):
                        continue  # exception types: constructed by the packages, not called
                    for attr in dir(obj):
                        if attr.startswith("_"):
                            continue
                        raw = inspect.getattr_static(obj, attr)
                        if isinstance(raw, property) or not callable(getattr(obj, attr)):
                            continue
                        if isinstance(raw, (staticmethod, classmethod)) or inspect.isfunction(raw):
                            key = f"{obj.__module__}:{obj.__qualname__}.{attr}"
                            out[key] = _takes_input(
                                getattr(obj, attr), method=not isinstance(raw, staticmethod)
                            )
    return out
