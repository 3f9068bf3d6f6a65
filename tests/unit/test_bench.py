# SPDX-License-Identifier: Apache-2.0
"""bench/ holds together: bench/run.py only dispatches, every bench it names
is a function of the module it names, and the benches share bench/common.py
rather than importing the dispatcher (the import circle issue 38 found)."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def imported_modules(path: Path) -> set[str]:
    """The top-level names of the modules a file imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_every_named_bench_is_a_function_of_its_module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    run = importlib.import_module("run")
    assert len(run.BENCHES) >= 30
    for name, (module, function) in run.BENCHES.items():
        assert (BENCH / f"{module}.py").exists(), name
        assert callable(run.bench(name)), name
    for module in {m for m, _ in run.BENCHES.values()} | {"run", "common"}:
        sys.modules.pop(module, None)  # the next test (or session) imports them afresh


def test_no_bench_imports_the_dispatcher_and_common_imports_no_bench():
    benches = {path.stem for path in BENCH.glob("*.py")}
    importers = [path.name for path in BENCH.glob("*.py") if "run" in imported_modules(path)]
    assert importers == []
    assert imported_modules(BENCH / "common.py") & benches == set()
    assert imported_modules(BENCH / "run.py") & benches == set()  # it names modules; importlib loads them when asked
