# SPDX-License-Identifier: Apache-2.0
"""Run a test's attacker as an unprivileged user (``nobody``), the way a
local user on a shared host would (issue 40): its argv behind ``setpriv``,
and files it must reach made readable to it."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

NOBODY = 65534  # nobody:nogroup on Debian


def as_nobody(argv: list[str]) -> list[str]:
    """``argv`` run as nobody:nogroup with no supplementary groups."""
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]


def copy_named(program: str, name: str) -> Path:
    """A copy of ``program`` whose file name is ``name`` (the kernel names a
    process after the file it executes), in a fresh folder nobody can read
    and execute; the caller removes ``path.parent``."""
    folder = Path(tempfile.mkdtemp(prefix="jitterscope-test-"))
    os.chmod(folder, 0o755)
    path = folder / name
    shutil.copy(program, path)
    os.chmod(path, 0o755)
    return path
