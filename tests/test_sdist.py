"""Each distribution's sdist ships tests that run from the unpacked sdist alone, or ships none.

Every distribution under ``packages/`` is built into an sdist with hatchling (pure file copying,
about a second for all six) and checked:

* contents: ``PKG-INFO``, ``pyproject.toml``, ``README.md``, ``LICENSE`` (the repository's),
  ``src/<package>`` with ``py.typed``, optionally ``tests/``, and nothing else at the top; no
  build or cache junk anywhere (``__pycache__``, ``.venv``, ``bench-results``, ``build`` ...);
* shipped tests: every ``.py`` file under the sdist's ``tests/`` imports only the standard
  library, the test runners (pytest, hypothesis), its own distribution, the distributions and
  libraries that distribution declares (runtime and extras) and its sibling test modules; relative
  imports resolve inside the sdist; no string names the repository's ``tools``/``tests`` modules and
  no path climbs out of the sdist from ``__file__``. Tests of the repository's tools (benchmark
  smoke tests, the Mooncake store harness) are excluded in ``[tool.hatch.build.targets.sdist]``,
  and only those: an sdist that ships tests leaves out none that could run from it;
* real runs: every shipped suite collects with pytest inside its unpacked sdist, its ``src`` first
  on the path and the repository neither on the path nor the rootdir, and two of mem-cache-pool's
  test modules run there.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hatchling.builders.sdist import SdistBuilder

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))

#: what may sit at the top of an sdist (``.gitignore``: hatchling ships the VCS ignore file it
#: applied, so that a build from the sdist excludes the same files)
TOP_LEVEL = frozenset(
    {"PKG-INFO", "pyproject.toml", "README.md", "LICENSE", ".gitignore", "src", "tests"}
)
REQUIRED = ("PKG-INFO", "pyproject.toml", "README.md", "LICENSE")
JUNK_DIRS = frozenset(
    {"__pycache__", ".venv", "venv", ".cache", "bench-results", "build", "dist", ".git",
     ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis", ".import_linter_cache"}
)
JUNK_SUFFIXES = (".pyc", ".pyo", ".so", ".egg-info", ".orig", ".rej", ".swp")

#: test runners the shipped tests may import besides the declared requirements
TEST_RUNNERS = frozenset({"pytest", "_pytest", "hypothesis"})
#: requirement name -> import name, where the two differ beyond ``-`` -> ``_``
IMPORT_NAMES = {
    "import-linter": "importlinter",
    "mooncake-transfer-engine": "mooncake",
    "mooncake-transfer-engine-non-cuda": "mooncake",
}
#: names of the repository (not of any distribution): a shipped test must not use them
REPO_NAME = re.compile(r"^(tools[./]|tests\.)\w")
#: the distribution whose shipped tests are run for real, and which of them (small and fast)
RUN_FOR_REAL = "mem-cache-pool"
RUN_FILES = ("tests/test_pool_mha.py", "tests/test_pool_req_to_token.py")


@dataclass(frozen=True, slots=True)
class Sdist:
    name: str
    import_name: str
    root: Path  # the unpacked sdist
    files: tuple[str, ...]  # member paths relative to ``root`` (files only)
    allowed_imports: frozenset[str]  # top-level modules its tests may import


def _requirement_name(req: str) -> str:
    name = re.split(r"[\s\[<>=!~;(]", req.strip(), maxsplit=1)[0].lower()
    return IMPORT_NAMES.get(name, name.replace("-", "_").replace(".", "_"))


def _build(package: Path, out: Path) -> Sdist:
    meta = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    [archive] = SdistBuilder(str(package)).build(directory=str(out), versions=["standard"])
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        assert all(m.isfile() or m.isdir() for m in members), [
            m.name for m in members if not (m.isfile() or m.isdir())
        ]
        if hasattr(tarfile, "data_filter"):  # extraction filters: Python 3.10.12+ / 3.11.4+
            tar.extractall(out, filter="data")
        else:  # an older patch release: members were checked above (plain files and dirs)
            tar.extractall(out)
    [top] = {m.name.split("/", 1)[0] for m in members}
    files = tuple(sorted(m.name.split("/", 1)[1] for m in members if m.isfile()))
    requirements = list(meta.get("dependencies", []))
    for extra in meta.get("optional-dependencies", {}).values():
        requirements.extend(extra)
    import_name = meta["name"].replace("-", "_")
    allowed = {import_name, *TEST_RUNNERS, *map(_requirement_name, requirements)}
    return Sdist(meta["name"], import_name, out / top, files, frozenset(allowed))


@pytest.fixture(scope="module")
def sdists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Sdist]:
    out = tmp_path_factory.mktemp("sdists")
    built = [_build(package, out) for package in PACKAGES]
    return {s.name: s for s in built}


DIST_NAMES = [
    tomllib.loads((p / "pyproject.toml").read_text())["project"]["name"] for p in PACKAGES
]


def test_every_distribution_is_checked() -> None:
    assert {
        "mem-cache-kernels", "mem-cache-pool", "mem-cache-allocator", "mem-cache-pool-host",
        "mem-cache-storage", "mem-cache-refactor",
    } <= set(DIST_NAMES), DIST_NAMES


@pytest.mark.parametrize("name", DIST_NAMES)
def test_sdist_contents(name: str, sdists: dict[str, Sdist]) -> None:
    sdist = sdists[name]
    files = set(sdist.files)
    top = {f.split("/", 1)[0] for f in files}
    assert top <= TOP_LEVEL, f"{name}: unexpected top-level entries {sorted(top - TOP_LEVEL)}"
    missing = [f for f in REQUIRED if f not in files]
    missing += [
        f"src/{sdist.import_name}/{f}"
        for f in ("__init__.py", "py.typed")
        if f"src/{sdist.import_name}/{f}" not in files
    ]
    assert not missing, f"{name}: the sdist lacks {missing}"
    assert (sdist.root / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes(), (
        f"{name}: LICENSE differs from the repository's"
    )
    junk = sorted(
        f for f in files
        if JUNK_DIRS.intersection(f.split("/")) or any(
            part.endswith(JUNK_SUFFIXES) for part in f.split("/")
        )
    )
    assert not junk, f"{name}: junk in the sdist: {junk}"
    packages = {f.split("/")[1] for f in files if f.startswith("src/") and f.count("/") >= 2}
    assert packages == {sdist.import_name}, f"{name}: src holds {sorted(packages)}"


def _is_docstring(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    if not isinstance(parent, ast.Expr):
        return False
    owner = parents.get(parent)
    body = getattr(owner, "body", None)
    return isinstance(body, list) and bool(body) and body[0] is parent


def _climb(node: ast.AST) -> int | None:
    """Directory levels above ``__file__`` reached by ``...parent`` / ``...parents[N]`` chains."""
    uses_file = any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(node))
    levels = 0
    while True:
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            levels += 1
            node = node.value
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "parents" and isinstance(node.slice, ast.Constant)
              and isinstance(node.slice.value, int)):
            levels += node.slice.value + 1
            node = node.value.value
        elif isinstance(node, ast.Attribute):
            node = node.value  # .resolve, .joinpath, .name ...
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            break
    return levels if levels and uses_file else None


def _problems(sdist: Sdist, rel: str) -> list[str]:
    """What in the shipped test file ``rel`` needs more than the sdist and its requirements."""
    path = sdist.root / rel
    tree = ast.parse(path.read_text(), filename=rel)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    siblings = {Path(f).stem for f in sdist.files
                if f.startswith("tests/") and f.endswith(".py")}
    allowed = sdist.allowed_imports | siblings | set(sys.stdlib_module_names) | {"__future__"}
    problems: list[str] = []

    def check_module(module: str, line: int) -> None:
        if module.split(".", maxsplit=1)[0] not in allowed:
            problems.append(f"{rel}:{line}: imports {module}")

    depth = len(Path(rel).parts)  # climbing this many levels from __file__ reaches the root
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check_module(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                check_module(node.module or "", node.lineno)
                continue
            base = path.parent
            for _ in range(node.level - 1):
                base = base.parent
            target = base.joinpath(*(node.module or "").split("."))
            inside = target.resolve().is_relative_to(sdist.root.resolve())
            if not inside or not (target.with_suffix(".py").is_file()
                                  or (target / "__init__.py").is_file()):
                problems.append(f"{rel}:{node.lineno}: relative import "
                                f"{'.' * node.level}{node.module or ''} not in the sdist")
        elif isinstance(node, ast.Call):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if (fname in {"import_module", "__import__"} and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)):
                check_module(node.args[0].value, node.lineno)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and REPO_NAME.match(node.value) and not _is_docstring(node, parents)):
            problems.append(f"{rel}:{node.lineno}: names the repository's {node.value!r}")
        if isinstance(node, (ast.Attribute, ast.Subscript)) and not isinstance(
            parents.get(node), (ast.Attribute, ast.Subscript)
        ):
            levels = _climb(node)
            if levels is not None and levels > depth:
                problems.append(f"{rel}:{node.lineno}: climbs {levels} directories above "
                                "__file__, out of the sdist")
    return problems


@pytest.mark.parametrize("name", DIST_NAMES)
def test_shipped_tests_need_only_the_distribution(name: str, sdists: dict[str, Sdist]) -> None:
    """The rule itself: tests in an sdist run from the sdist alone (or there are none)."""
    sdist = sdists[name]
    shipped = [f for f in sdist.files if f.startswith("tests/")]
    problems = [p for f in shipped if f.endswith(".py") for p in _problems(sdist, f)]
    assert not problems, (
        f"{name}: its sdist ships tests that cannot run from the sdist alone; make them use only "
        f"the distribution, its declared requirements and tests/ modules shipped with them, or "
        f"exclude them in [tool.hatch.build.targets.sdist] of packages/*/pyproject.toml:\n  "
        + "\n  ".join(problems)
    )


@pytest.mark.parametrize("name", DIST_NAMES)
def test_only_repository_bound_tests_are_left_out(name: str, sdists: dict[str, Sdist]) -> None:
    """An sdist that ships tests ships all of them except those that need the repository (and the
    helpers only those use): an exclude pattern must not silently drop a test that could run."""
    sdist = sdists[name]
    if not any(f.startswith("tests/") for f in sdist.files):
        return  # this distribution ships no tests at all: the other half of the rule
    package = next(p for p in PACKAGES if p.name == name)
    in_repo = tuple(sorted(
        p.relative_to(package).as_posix() for p in (package / "tests").rglob("*.py")
        if "__pycache__" not in p.parts
    ))
    left_out = [f for f in in_repo if f not in sdist.files]
    repo_view = Sdist(name, sdist.import_name, package, in_repo, sdist.allowed_imports)
    bound = [f for f in left_out if _problems(repo_view, f)]
    helpers_of_bound = {
        f for f in left_out
        if any(Path(f).name in (package / b).read_text() for b in bound)
    }
    runnable = sorted(set(left_out) - set(bound) - helpers_of_bound)
    assert not runnable, (
        f"{name}: its sdist leaves out tests that need nothing from the repository: {runnable} "
        "(narrow the exclude in its pyproject.toml)"
    )


def test_the_scan_catches_a_test_that_needs_the_repository(
    sdists: dict[str, Sdist], tmp_path: Path
) -> None:
    """The checker itself can fail: the three ways a repository-bound test shows up."""
    pool = sdists[RUN_FOR_REAL]
    root = tmp_path / "sdist"
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "test_bound.py").write_text(
        "import subprocess, sys\n"
        "from pathlib import Path\n"
        "from tools.bench import allocator as bench_allocator\n"
        "import mem_cache_allocator\n"
        "from .helpers import make\n"
        "ROOT = Path(__file__).resolve().parents[3]\n"
        "subprocess.run([sys.executable, '-m', 'tools.bench.host'], cwd=ROOT)\n"
    )
    fake = Sdist(pool.name, pool.import_name, root, ("tests/test_bound.py",),
                 pool.allowed_imports)
    found = "\n".join(_problems(fake, "tests/test_bound.py"))
    for needle in ("imports tools", "imports mem_cache_allocator", "relative import .helpers",
                   "climbs 4 directories", "'tools.bench.host'"):
        assert needle in found, (needle, found)


def _pytest_in(sdist: Sdist, *args: str) -> subprocess.Popen[str]:
    """pytest inside the unpacked sdist: the sdist's ``src`` first on the path (siblings come from
    the environment), the sdist the rootdir and working directory, nothing of the repository."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(sdist.root / "src")
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--import-mode=importlib", "--rootdir", str(sdist.root), *args],
        cwd=sdist.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


@pytest.mark.slow
def test_shipped_suites_collect_and_one_runs_from_the_unpacked_sdist(
    sdists: dict[str, Sdist],
) -> None:
    """Every shipped suite collects inside its unpacked sdist (each test module and conftest
    imports), and two modules of mem-cache-pool's run there (the whole suites take minutes: the
    import scan above covers what the test bodies reach)."""
    run = sdists[RUN_FOR_REAL]
    missing = [f for f in RUN_FILES if f not in run.files]
    assert not missing, f"{RUN_FOR_REAL}: pick other RUN_FILES, {missing} are gone"
    procs = {
        f"collect {s.name}": _pytest_in(s, "--collect-only", "tests")
        for s in sdists.values() if any(f.startswith("tests/") for f in s.files)
    }
    procs[f"run {RUN_FOR_REAL}"] = _pytest_in(run, *RUN_FILES)
    failures = []
    for what, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        ok = proc.returncode == 0 and re.search(r"\b\d+ (passed|tests? collected)\b", out)
        if not ok or re.search(r"\b(failed|errors?)\b", out.splitlines()[-1] if out else ""):
            failures.append(f"{what} (rc {proc.returncode}):\n{out[-3000:]}")
    assert not failures, "\n\n".join(failures)
