# SPDX-License-Identifier: Apache-2.0
"""tests/README.md maps every test file to what it proves: each
tests/**/test_*.py has a row in its tables (by its path under tests/), and
every test file a row names exists, so the map stays current as tests are
added, moved or removed."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
README = TESTS / "README.md"


def files_under_tests() -> set[str]:
    return {p.relative_to(TESTS).as_posix() for p in TESTS.rglob("test_*.py")}


def named() -> set[str]:
    """The files the map's rows name (a row starts with the file's path)."""
    return set(re.findall(r"^\| `([^`]+\.py)` \|", README.read_text(), re.MULTILINE))


def test_every_test_file_is_named_in_the_readme():
    missing = sorted(files_under_tests() - named())
    assert not missing, f"add a line for each to tests/README.md's map: {missing}"


def test_every_test_file_the_readme_names_exists():
    gone = sorted(named() - files_under_tests())
    assert not gone, f"tests/README.md names test files that do not exist: {gone}"
