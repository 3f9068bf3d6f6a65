# SPDX-License-Identifier: Apache-2.0
"""`jitterscope doctor` on the kernel log the xid signal reads: where
/dev/kmsg is hidden as systemd's ProtectKernelLogs=yes hides it (an
inaccessible device node bind-mounted over it, in a private mount
namespace), the check fails, says the Xid signal is off and why, and how to
fix it; an installed collector unit with ProtectKernelLogs=yes is named
(systemctl stood in for by a script); and the shipped unit does not hide it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jitterscope.doctor import check_kmsg, check_unit_kmsg

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

HIDDEN = """
set -e
mknod "$1/chr" c 0 0 && chmod 000 "$1/chr"
mount --bind "$1/chr" /dev/kmsg
exec "$2" -c 'import json; from jitterscope.doctor import check_kmsg; c = check_kmsg(); print(json.dumps([c.ok, c.detail, c.fix]))'
"""


# a private mount namespace: needs root, as `make test` runs
def test_a_hidden_kmsg_says_the_xid_signal_is_off(tmp_path):
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", HIDDEN, "sh",
                           str(tmp_path), sys.executable], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ok, detail, fix = json.loads(done.stdout)
    assert not ok and "the Xid signal is off" in detail and "ProtectKernelLogs=yes" in detail + fix, detail
    assert check_kmsg().ok  # here, outside it: readable
    assert not check_kmsg(str(tmp_path / "absent")).ok


def fake_systemctl(tmp_path: Path, monkeypatch, output: str, rc: int = 0) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\nprintf '{output}'\nexit {rc}\n")
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_an_installed_unit_that_hides_kmsg_is_named(tmp_path, monkeypatch):
    fake_systemctl(tmp_path, monkeypatch, "ProtectKernelLogs=yes\\nLoadState=loaded\\n")
    check = check_unit_kmsg()
    assert not check.ok and "ProtectKernelLogs=yes" in check.detail and "the Xid signal is off" in check.detail
    assert "daemon-reload" in check.fix


@pytest.mark.parametrize("output, rc, ok", [
    ("ProtectKernelLogs=no\\nLoadState=loaded\\n", 0, True),
    ("ProtectKernelLogs=no\\nLoadState=not-found\\n", 0, None),  # not installed: nothing to say
    ("", 1, None),  # no systemd here
])
def test_other_units_and_no_systemd(tmp_path, monkeypatch, output, rc, ok):
    fake_systemctl(tmp_path, monkeypatch, output, rc)
    check = check_unit_kmsg()
    assert (check.ok if check else None) == ok


def test_the_shipped_unit_leaves_kmsg_readable():
    unit = (ROOT / "deploy" / "systemd" / "jitterscope-collector.service").read_text()
    directives = [line.strip() for line in unit.splitlines() if not line.lstrip().startswith("#")]
    assert "ProtectKernelLogs=yes" not in directives and "ReadOnlyPaths=/dev/kmsg" in directives
