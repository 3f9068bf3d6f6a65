# SPDX-License-Identifier: Apache-2.0
"""The direction of imports between jitterscope's parts (docs/architecture.md,
the parts and the way data walks).

The parts live in top-level folders that install as sub-packages through
pyproject.toml's [tool.setuptools.package-dir] (collector/ is
jitterscope.collector). Import-graph tools do not apply that mapping, so they
cannot see these edges; this test reads every import with ``ast``, applies the
mapping, and fails on a forbidden direction:

- no part imports the front door (``cli/``, the ``jitterscope`` package itself: cli, up, query, ...);
- data walks one way: bpf -> collector -> (Kafka) -> streams -> (ClickHouse)
  -> reports, with records and pure functions over them in schemas and
  errors, logging and settings in common; collector and streams never import
  each other;
- schemas imports no other part; common only schemas (the settings name the
  catalogue's probes).

Imports inside functions count too. Tests, bench/ and examples/ may import
anything; the front door may import every part.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRONT_DOOR = "jitterscope"

#: part -> the parts it may import (itself always). Anything under
#: ``jitterscope.`` that is not a mapped part is the front door.
ALLOWED: dict[str, set[str]] = {
    "common": {"schemas"},  # settings name the catalogue's probes (schemas/signals.py)
    "schemas": set(),
    "bpf": set(),
    "collector": {"common", "schemas", "bpf"},
    "streams": {"common", "schemas"},
    "reports": {"common", "schemas"},  # the tables streams writes are named in schemas/signals.py
}


def package_dirs() -> dict[str, Path]:
    """jitterscope.<part> -> its folder, from pyproject.toml."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    mapping = config["tool"]["setuptools"]["package-dir"]
    return {package: ROOT / folder for package, folder in mapping.items()}


def part_of(module: str, parts: dict[str, Path]) -> str | None:
    """'jitterscope.collector.probes.base' -> 'collector'; a front-door module
    (or the bare package) -> FRONT_DOOR; outside jitterscope -> None."""
    if module != FRONT_DOOR and not module.startswith(FRONT_DOOR + "."):
        return None
    for package in parts:
        if package != FRONT_DOOR and (module == package or module.startswith(package + ".")):
            return package.removeprefix(FRONT_DOOR + ".")
    return FRONT_DOOR


def module_name(path: Path, package: str, folder: Path) -> str:
    relative = path.relative_to(folder).with_suffix("")
    names = [n for n in relative.parts if n != "__init__"]
    return ".".join([package, *names])


def imported_modules(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, module) for every import in ``source``; relative imports are
    resolved against ``module``, and ``from pkg import name`` yields
    ``pkg.name`` (name may be a module), so ``from jitterscope import cli`` is
    seen as jitterscope.cli."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*"]
    return found


def violations(source: str, module: str, part: str, parts: dict[str, Path], is_package: bool = False,
               where: str = "<source>") -> list[str]:
    bad: dict[tuple[int, str], str] = {}
    for line, target in imported_modules(source, module, is_package):
        other = part_of(target, parts)
        if other is None or other == part:
            continue
        # `from jitterscope import collector` also names the bare package;
        # only the longer name says what is imported.
        if target == FRONT_DOOR:
            continue
        if other == FRONT_DOOR or other not in ALLOWED[part]:
            bad.setdefault((line, other), f"{where}:{line}: {part} imports {target} ({other})")
    return sorted(bad.values())


def part_files() -> list[tuple[str, str, Path, Path]]:
    """(part, package, folder, file) for every .py file of every part."""
    files = []
    for package, folder in package_dirs().items():
        if package == FRONT_DOOR:
            continue
        part = package.removeprefix(FRONT_DOOR + ".")
        files += [(part, package, folder, path) for path in sorted(folder.rglob("*.py"))]
    return files


def test_every_mapped_part_has_a_rule():
    parts = {p.removeprefix(FRONT_DOOR + ".") for p in package_dirs() if p != FRONT_DOOR}
    assert parts == set(ALLOWED), "a part was added or removed: give it a line in ALLOWED"


def test_the_scan_sees_every_part():
    seen = {part for part, *_ in part_files()}
    assert seen == set(ALLOWED)
    assert len(part_files()) > 30


def test_no_part_imports_against_the_direction_of_the_data():
    parts = package_dirs()
    bad = []
    for part, package, folder, path in part_files():
        module = module_name(path, package, folder)
        bad += violations(path.read_text(), module, part, parts, is_package=path.name == "__init__.py",
                          where=str(path.relative_to(ROOT)))
    assert not bad, "forbidden imports:\n" + "\n".join(bad)


@pytest.mark.parametrize("part, source", [
    ("collector", "from jitterscope.streams import rules"),
    ("collector", "def f():\n    from jitterscope.streams.app import StreamsWorker"),
    ("streams", "import jitterscope.collector.topology"),
    ("streams", "from jitterscope import collector"),
    ("reports", "from jitterscope.collector.topology import read_topology"),
    ("schemas", "from jitterscope.common import errors"),
    ("common", "from jitterscope.streams import clickhouse"),
    ("collector", "from jitterscope import cli"),
    ("streams", "from jitterscope.up import Stack"),
    ("reports", "import jitterscope.query"),
    ("reports", "from jitterscope.streams.clickhouse import TABLE_OF"),
    ("collector", "from ...jitterscope.cli import main"),  # nonsense, but still the front door
    ("streams", "from ..collector import agent"),  # relative, resolved through the mapping
])
def test_the_checker_catches(part, source):
    parts = package_dirs()
    assert violations(source, f"jitterscope.{part}.x", part, parts), source


@pytest.mark.parametrize("part, source", [
    ("collector", "from jitterscope.schemas.topology import cpu_list\nfrom jitterscope.common import errors"),
    ("streams", "from jitterscope.schemas import events, topics\nfrom . import clickhouse"),
    ("reports", "from jitterscope.schemas.signals import DATABASE, TABLE_OF"),
    ("schemas", "from jitterscope.schemas import events\nimport msgspec"),
    ("common", "import pydantic\nfrom jitterscope.common import errors"),
])
def test_the_checker_allows(part, source):
    assert violations(source, f"jitterscope.{part}.x", part, package_dirs()) == []
