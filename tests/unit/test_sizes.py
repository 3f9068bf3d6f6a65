# SPDX-License-Identifier: Apache-2.0
"""The house's size rule (CONTRIBUTING.md): no product file is longer than
500 lines, and no function longer than 60. A file or function past it does
too much: split it along what it does."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("bpf", "collector", "streams", "schemas", "reports", "common", "cli")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 500, 60


def product_files(suffixes=(".py", ".c", ".h")):
    return sorted(p for d in PRODUCT for p in (ROOT / d).rglob("*") if p.suffix in suffixes)


def test_no_product_file_is_longer_than_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in product_files()
            if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, long


def test_no_function_is_longer_than_60_lines():
    long = {f"{p.relative_to(ROOT)}:{node.lineno} {node.name}": node.end_lineno - node.lineno + 1
            for p in product_files((".py",)) for node in ast.walk(ast.parse(p.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}
    assert not long, long


def test_the_rule_sees_the_files_it_guards():
    names = {p.name for p in product_files()}
    assert {"agent.py", "attribution.py", "runq.bpf.c", "signals.py"} <= names
