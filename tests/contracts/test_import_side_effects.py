"""Rule 2 at run time: importing a package or any public module never imports triton.

Static analysis (lint-imports) cannot see ``importlib.import_module`` or PEP 562 ``__getattr__``
re-exports, so these tests import for real, each in a fresh interpreter:

* per package: ``python -c "import pkg"`` and inspect ``sys.modules``;
* per public module: one interpreter per package imports torch (allowed everywhere), then forks one
  child per module, so each module is imported into a pristine ``sys.modules`` without paying the
  torch import again; a meta-path tripwire names the file that tried to import triton;
* with ``sys.modules["triton"] = None`` (triton "not installed") every package and public module
  still imports, and the kernels run through their torch path.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.contracts._modules import (
    BACKEND_CLIENTS,
    DISTS,
    FORBIDDEN_ON_IMPORT,
    Dist,
    public_modules,
)

_FORK_PROBE = textwrap.dedent(
    """
    import json, os, sys, traceback
    import torch  # allowed everywhere; imported once before forking

    FORBIDDEN = {forbidden!r}

    def _hit(name):
        return any(name == f or name.startswith(f + ".") for f in FORBIDDEN)

    class Tripwire:
        def find_spec(self, name, path=None, target=None):
            if _hit(name):
                # the innermost frame of our own code names the offending import statement
                ours = [f for f in traceback.extract_stack()[:-1]
                        if "/mem_cache_" in f.filename and "importlib" not in f.filename]
                where = ours[-1] if ours else traceback.extract_stack()[-2]
                raise ImportError(f"eager import of {{name}} at {{where.filename}}:"
                                  f"{{where.lineno}}: {{(where.line or '').strip()}}")
            return None

    results = {{}}
    for module in {modules!r}:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            sys.meta_path.insert(0, Tripwire())
            try:
                __import__(module)
                msg = json.dumps(sorted(m for m in sys.modules if _hit(m)))
            except ImportError as exc:
                msg = json.dumps([str(exc)])
            except BaseException as exc:
                msg = json.dumps(["import failed: " + "".join(traceback.format_exception(exc))])
            os.write(w, msg.encode())
            os.close(w)
            os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        results[module] = json.loads(data.decode())
    print(json.dumps(results))
    """
)


def _run(code: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise AssertionError(f"probe failed (exit {proc.returncode}):\n{proc.stderr}")
    return proc.stdout


@pytest.mark.parametrize("dist", DISTS, ids=lambda d: d.import_name)
def test_package_import_is_free_of_triton(dist: Dist) -> None:
    code = (
        "import sys, json\n"
        f"import {dist.import_name}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if any("
        f"m == f or m.startswith(f + '.') for f in {FORBIDDEN_ON_IMPORT!r}))))"
    )
    assert json.loads(_run(code)) == [], f"import {dist.import_name} imported triton code"


@pytest.mark.parametrize("dist", DISTS, ids=lambda d: d.import_name)
def test_every_public_module_import_is_free_of_triton(dist: Dist) -> None:
    modules = public_modules(dist)
    assert dist.import_name in modules
    code = _FORK_PROBE.format(forbidden=FORBIDDEN_ON_IMPORT, modules=modules)
    results: dict[str, list[str]] = json.loads(_run(code).strip().splitlines()[-1])
    offenders = {m: leaked for m, leaked in results.items() if leaked}
    assert not offenders, "modules importing triton at import time:\n" + "\n".join(
        f"  import {m}: {'; '.join(leaked)}" for m, leaked in offenders.items()
    )


@pytest.mark.parametrize("dist", DISTS, ids=lambda d: d.import_name)
def test_every_module_imports_without_triton_installed(dist: Dist) -> None:
    modules = public_modules(dist)
    code = (
        "import sys, importlib\n"
        "sys.modules['triton'] = None  # as if triton were not installed\n"
        f"for m in {modules!r}:\n"
        "    importlib.import_module(m)\n"
        "print('ok')\n"
    )
    assert _run(code).strip() == "ok"


def test_storage_modules_import_no_backend_client() -> None:
    """Importing any storage module (the kit included) imports no backend client library, nor
    the allocator; a tripwire names the import statement that tried."""
    dist = next(d for d in DISTS if d.import_name == "mem_cache_storage")
    modules = public_modules(dist)
    assert {"mem_cache_storage.file", "mem_cache_storage.testing"} <= set(modules)
    forbidden = (*BACKEND_CLIENTS, "mem_cache_allocator")
    code = _FORK_PROBE.format(forbidden=forbidden, modules=modules)
    results: dict[str, list[str]] = json.loads(_run(code).strip().splitlines()[-1])
    offenders = {m: leaked for m, leaked in results.items() if leaked}
    assert not offenders, "storage modules importing a backend client:\n" + "\n".join(
        f"  import {m}: {'; '.join(leaked)}" for m, leaked in offenders.items()
    )


def test_storage_tripwire_catches_a_client_import(tmp_path: Path) -> None:
    """The probe above can fail: a module importing a backend client at import time is named."""
    pkg = tmp_path / "mem_cache_probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import redis\n")
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + _FORK_PROBE.format(
        forbidden=BACKEND_CLIENTS, modules=["mem_cache_probe_pkg"]
    )
    results: dict[str, list[str]] = json.loads(_run(code).strip().splitlines()[-1])
    assert results["mem_cache_probe_pkg"], results
    assert "eager import of redis" in results["mem_cache_probe_pkg"][0]


def test_kernels_use_torch_path_without_triton() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules['triton'] = None
        import torch
        import mem_cache_kernels as k
        seq = torch.tensor([5, 7]); last = torch.tensor([3, 5])
        free = torch.tensor([4, 5], dtype=torch.int64)
        out = torch.empty(2, dtype=torch.int64)
        k.alloc_decode(seq, last, free, out, 4)
        assert out.tolist() == [16, 6], out.tolist()
        try:
            k.alloc_decode(seq, last, free, out, 4, backend="triton")
        except RuntimeError as exc:
            assert "triton" in str(exc)
        else:
            raise SystemExit("backend='triton' without triton must fail clearly")
        print('ok')
        """
    )
    assert _run(code).strip() == "ok"
