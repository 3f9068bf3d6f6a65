# SPDX-License-Identifier: Apache-2.0
"""Every source file names its license in an SPDX header, and the package
metadata states the same licenses (README "License")."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = "Apache-2.0"
BPF = "GPL-2.0-only OR Apache-2.0"  # the kernel loads them as GPL (BCC's default BPF_LICENSE)


def sources() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in tracked.split()
            if Path(name).suffix in (".py", ".c", ".h", ".inc", ".sh") or name == ".ci/run"]


def spdx(path: Path) -> str | None:
    """The license its header names (on the first line, or the second after a shebang)."""
    for line in path.read_text().splitlines()[:2]:
        if "SPDX-License-Identifier:" in line:
            return line.split("SPDX-License-Identifier:", 1)[1].strip()
    return None


def test_every_source_file_has_an_spdx_header_with_its_part_s_license():
    files = sources()
    assert len(files) > 100, "git ls-files found too few sources: not a checkout?"
    wrong = {str(p.relative_to(ROOT)): spdx(p) for p in files
             if spdx(p) != (BPF if p.suffix in (".c", ".h", ".inc") else PYTHON)}
    assert not wrong, f"add the SPDX header (Python: {PYTHON!r}; bpf/: {BPF!r}): {wrong}"


def test_the_package_metadata_states_both_licenses_and_ships_their_texts():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == f"{PYTHON} AND ({BPF})"
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert "GNU GENERAL PUBLIC LICENSE" in (ROOT / "LICENSES/GPL-2.0-only.txt").read_text()[:200]
    assert set(project["license-files"]) == {"LICENSE", "LICENSES/*.txt"}
