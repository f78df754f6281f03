"""How rewrite-imports writes the import statements it creates or shortens, so that the result
needs no hand edits: the repository's line length, isort-like order and wrapping.

* :func:`line_length_for` reads the line length of a file's repository: isort's ``line_length``
  (``.isort.cfg``, ``[tool.isort]``, ``setup.cfg``, ``tox.ini``; ``profile = black`` means 88),
  else ruff's or black's ``line-length``, else 88;
* :func:`from_import` renders ``from module import names`` on one line when it fits, else in the
  vertical hanging-indent form isort's black profile and black itself write (one name per line,
  a trailing comma);
* :func:`arrange_block` merges each created statement into an existing ``from`` import of the
  same module in the same block, or moves it to its isort position in its paragraph of imports
  (``from`` statements ordered by module name, case-insensitively).
"""

from __future__ import annotations

import configparser
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import libcst as cst

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["DEFAULT_LINE_LENGTH", "arrange_block", "from_import", "line_length_for", "name_key"]

#: black's default, and isort's with ``profile = black``
DEFAULT_LINE_LENGTH = 88

_PROFILE_LENGTHS = {"black": 88, "django": 79, "pycharm": 79, "google": 1000, "open_stack": 79,
                    "plone": 79, "attrs": 79, "hug": 100, "wemake": 80}


def _isort_length(section: Any) -> int | None:
    if not section:
        return None
    for key in ("line_length", "line-length"):
        value = section.get(key)
        if value is not None and str(value).strip().isdigit():
            return int(str(value).strip())
    profile = section.get("profile")
    if profile is not None:
        return _PROFILE_LENGTHS.get(str(profile).strip(), DEFAULT_LINE_LENGTH)
    return None


def _from_folder(folder: Path) -> int | None:
    """The line length configured by the files of ``folder``, or None."""
    ini_files = ((".isort.cfg", "settings"), ("setup.cfg", "isort"), ("setup.cfg", "tool:isort"),
                 ("tox.ini", "isort"))
    for name, section in ini_files:
        file = folder / name
        if not file.is_file():
            continue
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read_string(file.read_text(encoding="utf-8", errors="replace"))
        except configparser.Error:
            continue
        if parser.has_section(section):
            found = _isort_length(parser[section])
            if found is not None:
                return found
    data: dict[str, Any] = {}
    if (folder / "pyproject.toml").is_file():
        try:
            data = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            data = {}
    tool = data.get("tool", {}) if isinstance(data.get("tool"), dict) else {}
    found = _isort_length(tool.get("isort"))
    if found is not None:
        return found
    for name in ("ruff.toml", ".ruff.toml"):
        if (folder / name).is_file():
            try:
                ruff = tomllib.loads((folder / name).read_text(encoding="utf-8"))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError):
                continue
            if isinstance(ruff.get("line-length"), int):
                return int(ruff["line-length"])
    for table in (tool.get("ruff"), tool.get("black")):
        if isinstance(table, dict) and isinstance(table.get("line-length"), int):
            return int(table["line-length"])
    return None


_FOLDERS: dict[Path, int | None] = {}


def line_length_for(file: Path, top: Path | None = None) -> int:
    """The import line length of ``file``'s repository: the nearest configuration in a folder
    between the file and ``top`` (the repository top), else :data:`DEFAULT_LINE_LENGTH`."""
    folder = file.resolve().parent
    stop = top.resolve() if top is not None else None
    while True:
        if folder not in _FOLDERS:
            _FOLDERS[folder] = _from_folder(folder)
        found = _FOLDERS[folder]
        if found is not None:
            return found
        if folder in (stop, folder.parent):
            return DEFAULT_LINE_LENGTH
        folder = folder.parent


def name_key(name: str) -> tuple[int, str]:
    """isort's default ``order_by_type``: CONSTANTS, then Classes, then functions."""
    bare = name.split(" as ", maxsplit=1)[0]
    kind = 0 if bare.isupper() and len(bare) > 1 else 1 if bare[:1].isupper() else 2
    return kind, bare.lower()


def from_import(module: str, names: Sequence[str], indent: str, line_length: int) -> cst.ImportFrom:
    """``from module import names`` as isort (black profile) writes it at ``indent``."""
    one_line = f"from {module} import {', '.join(names)}"
    if len(indent) + len(one_line) <= line_length:
        text = one_line
    else:
        # the lines inside the parentheses are relative: libcst adds the block's indentation
        inner = "".join(f"    {n},\n" for n in names)
        text = f"from {module} import (\n{inner})"
    stmt = cst.parse_statement(text + "\n")
    assert isinstance(stmt, cst.SimpleStatementLine)
    node = stmt.body[0]
    assert isinstance(node, cst.ImportFrom)
    return node


def _single_from(line: cst.CSTNode) -> cst.ImportFrom | None:
    if not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1:
        return None
    node = line.body[0]
    if isinstance(node, cst.ImportFrom) and not node.relative and node.module is not None:
        return node
    return None


def _module_text(node: cst.ImportFrom) -> str:
    return cst.Module(body=[]).code_for_node(node.module) if node.module is not None else ""


def _alias_texts(node: cst.ImportFrom) -> list[str] | None:
    if isinstance(node.names, cst.ImportStar):
        return None
    out = []
    for alias in node.names:
        text = cst.Module(body=[]).code_for_node(alias.name)
        if alias.asname is not None:
            text += " as " + cst.Module(body=[]).code_for_node(alias.asname.name)
        out.append(text)
    return out


def _is_import_line(line: cst.CSTNode) -> bool:
    return isinstance(line, cst.SimpleStatementLine) and all(
        isinstance(s, (cst.Import, cst.ImportFrom)) for s in line.body
    )


def _leading(line: cst.BaseStatement) -> Sequence[cst.EmptyLine]:
    return line.leading_lines if isinstance(
        line, (cst.SimpleStatementLine, cst.BaseCompoundStatement)) else ()


def arrange_block(
    body: Sequence[cst.BaseStatement], created: list[cst.SimpleStatementLine], indent: str,
    line_length: int,
) -> list[cst.BaseStatement]:
    """``body`` (the statements of one block, at ``indent``) with each line of ``created``
    merged into another ``from`` import of its module, or moved to its isort position in its
    paragraph of import lines (see the module docstring)."""
    lines = list(body)
    ours = [line for line in lines if any(line is c for c in created)]
    for line in ours:
        node = _single_from(line)
        index = next((i for i, x in enumerate(lines) if x is line), None)
        if node is None or index is None:
            continue
        module, names = _module_text(node), _alias_texts(node)
        if names is None:
            continue
        # merge into another `from module import ...` of the same block (no comments in it)
        target = next(
            (i for i, x in enumerate(lines)
             if x is not line and (other := _single_from(x)) is not None
             and _module_text(other) == module and _alias_texts(other) is not None
             and "#" not in cst.Module(body=[]).code_for_node(other)),
            None,
        )
        if target is not None:
            existing = _single_from(lines[target])
            assert existing is not None
            merged = sorted(dict.fromkeys([*(_alias_texts(existing) or []), *names]),
                            key=name_key)
            lines[target] = lines[target].with_changes(
                body=[from_import(module, merged, indent, line_length)]
            )
            leading = _leading(line)
            del lines[index]
            if leading and index < len(lines):
                lines[index] = lines[index].with_changes(leading_lines=leading)
            continue
        # move it to its isort position within its paragraph of import lines
        start = index
        while start > 0 and not _leading(lines[start]) and _is_import_line(lines[start - 1]):
            start -= 1
        end = index + 1
        while end < len(lines) and _is_import_line(lines[end]) and not _leading(lines[end]):
            end += 1
        key = module.lower()
        rest = [x for x in lines[start:end] if x is not line]
        position = len(rest)
        for j, other_line in enumerate(rest):
            other = _single_from(other_line)
            if other is not None and _module_text(other).lower() > key:
                position = j
                break
        else:
            froms = [j for j, x in enumerate(rest) if _single_from(x) is not None]
            position = froms[-1] + 1 if froms else len(rest)
        head_lines = _leading(lines[start])
        moved = line.with_changes(leading_lines=[])
        rest = [x.with_changes(leading_lines=[]) if x is lines[start] else x for x in rest]
        rest.insert(position, moved)
        rest[0] = rest[0].with_changes(leading_lines=head_lines)
        lines[start:end] = rest
    return lines
