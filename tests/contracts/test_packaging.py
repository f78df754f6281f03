""""Installed piecemeal": each wheel installs alone, with only its declared dependencies.

For every distribution: build every wheel from the tree with ``tools/dev wheels`` (the documented
command), create a clean virtual environment, install that one distribution from the fresh wheels
(siblings resolved from the same folder, no index), import it and run a tiny real use. torch is
shared: one "torch base" environment (cached in ``.cache/piecemeal``, keyed by the torch and
numpy versions of this environment, reused across runs; bases of other versions are removed)
holds torch and numpy and nothing of ours, and each clean environment sees it through a ``.pth``
file, so torch is installed once, not once per wheel. The test then checks that exactly the
declared siblings (and nothing else of ours) were installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy
import pytest
import tomllib
import torch

from tests.contracts._modules import DISTS, ROOT, Dist

pytestmark = pytest.mark.slow

CACHE = ROOT / ".cache" / "piecemeal"

#: a tiny real use per distribution, run in its clean environment
SMOKE: dict[str, str] = {
    "mem_cache_kernels": """
        import torch, mem_cache_kernels as k
        out = torch.empty(9, dtype=torch.int64)
        k.alloc_extend(torch.tensor([2]), torch.tensor([11]), torch.tensor([1]),
                       torch.tensor([3, 4]), out, 4)
        assert out.tolist() == [2, 3, 12, 13, 14, 15, 16, 17, 18], out.tolist()
    """,
    "mem_cache_pool": """
        import torch
        from mem_cache_pool import MHATokenToKVPool
        pool = MHATokenToKVPool(size=32, page_size=4, dtype=torch.bfloat16, head_num=2,
                                head_dim=8, layer_num=2, device="cpu")
        k = torch.randn(3, 2, 8).to(torch.bfloat16); v = torch.randn(3, 2, 8).to(torch.bfloat16)
        loc = torch.tensor([4, 5, 9])
        pool.set_kv_buffer(1, loc, k, v)
        assert torch.equal(pool.get_key_buffer(1)[loc], k)
        assert torch.equal(pool.get_value_buffer(1)[loc], v)
    """,
    "mem_cache_allocator": """
        import torch
        from mem_cache_allocator import PagedTokenToKVPoolAllocator
        a = PagedTokenToKVPoolAllocator(64, 4, torch.float16, "cpu", None)
        slots = a.alloc(8)
        assert slots is not None and slots.min().item() >= 4
        a.free(slots)
        assert a.available_size() == 64
    """,
    "mem_cache_pool_host": """
        import torch
        from mem_cache_pool import MHATokenToKVPool
        from mem_cache_pool_host import MHATokenToKVPoolHost
        dev = MHATokenToKVPool(size=32, page_size=4, dtype=torch.float16, head_num=2,
                               head_dim=8, layer_num=2, device="cpu")
        for layer in range(2):
            dev.set_kv_buffer(layer, torch.arange(4, 12), torch.randn(8, 2, 8).half(),
                              torch.randn(8, 2, 8).half())
        host = MHATokenToKVPoolHost(dev, 2.0, 0, 4, "layer_first")
        h = host.alloc(8)
        assert h is not None
        dev_idx = torch.arange(4, 12)
        host.backup_from_device_all_layer(dev, h, dev_idx, "direct")
        before = [dev.get_key_buffer(l)[dev_idx].clone() for l in range(2)]
        target = torch.arange(16, 24)
        for layer in range(2):
            host.load_to_device_per_layer(dev, h, target, layer, "direct")
            assert torch.equal(dev.get_key_buffer(layer)[target], before[layer])
    """,
    "mem_cache_storage": """
        import tempfile, torch
        from mem_cache_pool import MLATokenToKVPool
        from mem_cache_pool_host import MLATokenToKVPoolHost
        from mem_cache_storage import HiCacheStorageConfig, create_backend, page_hashes
        dev = MLATokenToKVPool(size=32, page_size=4, dtype=torch.float16, kv_lora_rank=8,
                               qk_rope_head_dim=8, layer_num=2, device="cpu")
        host = MLATokenToKVPoolHost(dev, 2.0, 0, 4, "page_first")
        src, dst = host.alloc(8), host.alloc(8)
        host.buffers[0][src].copy_(torch.randn(8, 2, 1, 16).half())
        keys = page_hashes(list(range(8)), 4)
        with tempfile.TemporaryDirectory() as d:
            config = HiCacheStorageConfig(is_mla_model=True, model_name="smoke")
            storage = create_backend("file", config, host, storage_dir=d)
            assert storage.batch_set_v1(keys, src) == [True, True]
            assert storage.batch_exists(keys) == 2
            assert storage.batch_get_v1(keys, dst) == [True, True]
        assert torch.equal(host.buffers[0][dst].view(torch.int16),
                           host.buffers[0][src].view(torch.int16))
        memory = create_backend("memory", config, host)  # the pointer-backend base
        assert memory.batch_set_v1(keys, src) == [True, True]
        assert memory.batch_get_v1(keys[::-1], dst) == [True, True]
        assert torch.equal(host.buffers[0][dst[:4]].view(torch.int16),
                           host.buffers[0][src[4:]].view(torch.int16))
    """,
}


def _run(*cmd: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600,
                          **kw)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python*/site-packages"))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    _run(sys.executable, ROOT / "tools" / "dev", "wheels", "--out", out)
    built = sorted(p.name.split("-")[0] for p in out.glob("*.whl"))
    assert built == sorted([*(d.import_name for d in DISTS), "mem_cache_refactor"]), built
    return out


def base_key() -> str:
    """The torch base's dependency set: one cached environment per (torch, numpy) version."""
    return f"torch-{torch.__version__.split('+')[0]}-numpy-{numpy.__version__}"


@pytest.fixture(scope="module")
def torch_base() -> Path:
    """A virtual environment holding torch and numpy (the versions of this env) and nothing of
    ours; reused while the versions stay, bases of other versions are removed."""
    key = base_key()
    for stale in CACHE.glob("torch-*"):
        if stale.name != key:
            shutil.rmtree(stale, ignore_errors=True)
    base = CACHE / key
    marker = base / ".complete"
    if not marker.exists():
        _run(sys.executable, "-m", "venv", "--clear", base)
        _run(base / "bin" / "python", "-m", "pip", "install", "-q",
             f"torch=={torch.__version__.split('+')[0]}", f"numpy=={numpy.__version__}")
        marker.write_text(key)
    return _site_packages(base)


def test_sibling_pins_are_exact_and_versions_shared() -> None:
    versions: set[str] = set()
    for dist in DISTS:
        meta = tomllib.loads((ROOT / "packages" / dist.name / "pyproject.toml").read_text())
        project = meta["project"]
        versions.add(project["version"])
        deps = project["dependencies"]
        assert any(re.fullmatch(r"torch\s*>=\s*[\d.]+", d) for d in deps), deps
        for sib in dist.siblings:
            assert f"{sib}=={project['version']}" in deps, (dist.name, deps)
        ours = {d.split("=")[0] for d in deps if d.startswith("mem-cache-")}
        assert ours == set(dist.siblings), (dist.name, ours)
    assert len(versions) == 1, versions


@pytest.mark.parametrize("dist", DISTS, ids=lambda d: d.import_name)
def test_wheel_installs_alone(dist: Dist, wheels: Path, torch_base: Path,
                              tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    # no pip/setuptools inside: this env's pip drives the install (`pip --python`), so the
    # clean env holds nothing but what the wheel pulls in
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    (_site_packages(venv) / "_torch_base.pth").write_text(str(torch_base) + "\n")
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_NO"))}
    pip = (sys.executable, "-m", "pip", "--python", py)
    _run(*pip, "install", "-q", "--no-index", "--find-links", wheels, dist.name, env=env)
    listing = json.loads(_run(*pip, "list", "--path", _site_packages(venv),
                              "--format", "json", env=env).stdout)
    installed = {p["name"] for p in listing if p["name"].startswith("mem-cache-")}
    assert installed == {dist.name, *dist.siblings}
    probe = textwrap.dedent(SMOKE[dist.import_name]) + textwrap.dedent(
        """
        import sys
        assert "triton" not in sys.modules
        print("smoke ok")
        """
    )
    assert "smoke ok" in _run(py, "-c", probe, env=env, cwd=tmp_path).stdout


def test_allocator_numpy_extra_installs_from_the_wheels(wheels: Path, torch_base: Path,
                                                        tmp_path: Path) -> None:
    """The README's install line: ``pip install --find-links dist "mem-cache-allocator[numpy]"``
    installs the allocator, its two siblings and numpy (here from the torch base), and the CPU
    hot path then runs in numpy with no "Failed to initialize NumPy" from torch."""
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    (_site_packages(venv) / "_torch_base.pth").write_text(str(torch_base) + "\n")
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_NO"))}
    pip = (sys.executable, "-m", "pip", "--python", py)
    _run(*pip, "install", "-q", "--no-index", "--find-links", wheels,
         "mem-cache-allocator[numpy]", env=env)
    probe = textwrap.dedent(SMOKE["mem_cache_allocator"]) + textwrap.dedent("""
        from mem_cache_allocator import page_allocator
        assert page_allocator._np is not None
        print("numpy ok")
    """)
    proc = _run(py, "-c", probe, env=env, cwd=tmp_path)
    assert "numpy ok" in proc.stdout
    assert "Failed to initialize NumPy" not in proc.stderr, proc.stderr


def test_refactor_tools_install_without_torch_and_check_another_repository(
    tmp_path: Path,
) -> None:
    """mem-cache-refactor: its wheel installs into a clean environment that has no torch (and
    nothing else of ours), and its console scripts check a repository that is not ours."""
    from tests.tools._engine import MC, NEW, OLD, engine_repo, moved_files

    out = tmp_path / "wheel"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", out, ROOT / "packages" / "mem-cache-refactor")
    [wheel] = out.glob("mem_cache_refactor-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_NO"))}
    pip = (sys.executable, "-m", "pip", "--python", venv / "bin" / "python")
    _run(*pip, "install", "-q", wheel, env=env)
    listing = json.loads(_run(*pip, "list", "--path", _site_packages(venv), "--format", "json",
                              env=env).stdout)
    names = {p["name"].lower() for p in listing}
    assert "mem-cache-refactor" in names and "import-linter" in names and "libcst" in names
    assert not {n for n in names if n == "torch" or n.startswith("mem-cache-")} - {
        "mem-cache-refactor"
    }, names

    # an engine repository (python/<pkg> layout, its own tools/ folder): the split leaves one
    # importer on the old path and re-exports a module that loads the kernel extension
    repo, _ = engine_repo(tmp_path / "engine")
    repo.write(moved_files(keep_chunk_cache=True, reexport=True))
    repo.commit("move the sparse allocators")
    proc = subprocess.run(
        [str(venv / "bin" / "move-check"), "HEAD~1", "HEAD", "--allow-removal", OLD],
        cwd=repo.root, capture_output=True, text=True, timeout=300, env=env, check=False,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{MC}/chunk_cache.py:21: still imports {OLD}.SparseTokenAllocator" in proc.stdout
    assert (f"engine.srt.mem_cache.allocator -> {NEW} (l.4) -> {OLD} (l.4) "
            "-> kernel_ext.kvio (l.5)") \
        in proc.stdout
    rewrite = subprocess.run(
        [str(venv / "bin" / "rewrite-imports"), f"{OLD}.SparseTokenAllocator",
         f"{NEW}.SparseTokenAllocator", "--check"],
        cwd=repo.root, capture_output=True, text=True, timeout=120, env=env, check=False,
    )
    assert rewrite.returncode == 1, rewrite.stdout + rewrite.stderr
    assert f"{MC}/chunk_cache.py" in rewrite.stdout
    probe = "import sys, mem_cache_refactor.move_check, mem_cache_refactor.contracts; " \
            "print(sorted({m.split('.')[0] for m in sys.modules} & " \
            "{'torch', 'triton', 'mem_cache_kernels', 'mem_cache_pool', 'mem_cache_allocator'}))"
    loaded = _run(venv / "bin" / "python", "-c", probe, env=env, cwd=tmp_path).stdout
    assert loaded.strip() == "[]"
