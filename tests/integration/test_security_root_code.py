# SPDX-License-Identifier: Apache-2.0
"""Root runs no code another local user planted, and writes no file they
chose (issue 40, items 1, 2 and 10). Each test plays the attacker as
`nobody` (setpriv), then runs jitterscope's own code as root the way a user
would, and checks that the attacker's marker never appears while the real
thing still works:

- `jitterscope demo` with a `/tmp/jitterscope-names-0` made by nobody, its
  `jsvictim`/`jshog` links swapped to nobody's script in a loop, started from
  a folder of nobody's holding a `ctypes.py` (what `python -c` would import
  first);
- `up`'s children (`Stack._spawn`) and the collector's symbol helper
  started from a folder holding a planted `jitterscope/` package (`python -m`
  puts the working directory first on sys.path);
- `open_private` on a file nobody made first, on a hard link nobody made to
  a world-writable file of root's, and on nobody's FIFO.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from rich.console import Console

from jitterscope.collector.stacks import UserSymbolsHelper
from jitterscope.common.errors import UnsafeFile
from jitterscope.common.private import open_private, private_dir
from jitterscope.common.settings import load
from jitterscope.up import Stack
from jitterscope.workload import HOG_COMM, VICTIM_COMM, starvation

pytestmark = [pytest.mark.integration]  # acts as root and as nobody: runs as root, as CI does

NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def as_nobody(*command: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([*NOBODY, *command], check=True, cwd="/", timeout=60, **kwargs)


@pytest.fixture
def marker(tmp_path) -> Path:
    """Where the attacker's code writes `id` if it ever runs as root: in
    root's own 0700 temp folder, so nobody cannot write it themselves."""
    return tmp_path / "attacker-ran-as-root"


@pytest.fixture
def nobodys_dir():
    """A fresh folder under /tmp that nobody made and owns."""
    path = Path(tempfile.gettempdir()) / f"jitterscope-attacker-{os.getpid()}-{os.urandom(4).hex()}"
    as_nobody("mkdir", "-m", "0755", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def plant(folder: Path, files: dict[str, str]) -> None:
    """Files written by nobody (mode 0755: executable scripts too)."""
    for name, text in files.items():
        target = folder / name
        as_nobody("mkdir", "-p", str(target.parent))
        as_nobody("sh", "-c", 'cat > "$1" && chmod 0755 "$1"', "-", str(target), input=text.encode())


def python_payload(marker: Path, what: str) -> str:
    return f"import os\nos.system('(echo {what}; id) >> {marker}')\n"


# --- 1: demo's named Python --------------------------------------------------

def test_demo_runs_no_link_or_module_another_user_planted(marker, nobodys_dir):
    names = Path("/tmp/jitterscope-names-0")  # the folder the demo used to share, under the README's /tmp
    if names.is_symlink() or names.exists():
        shutil.rmtree(names) if names.is_dir() and not names.is_symlink() else names.unlink()
    as_nobody("mkdir", "-m", "0777", str(names))
    plant(names, {"payload": f"#!/bin/sh\n(echo a planted link; id) >> {marker}\n"})
    # `python -c` imports from its cwd first: the demo started from nobody's folder
    plant(nobodys_dir, {"ctypes.py": python_payload(marker, "ctypes.py in the cwd")})
    swapper = subprocess.Popen([*NOBODY, "sh", "-c", (
        "cd \"$1\" || exit 1; while :; do for n in jsvictim jshog; do "
        "ln -sfn payload .$n.new && mv -fT .$n.new $n; done; done"), "-", str(names)],
        cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        env = {**os.environ, "TMPDIR": "/tmp", "COLUMNS": "500"}
        demo = subprocess.run([str(Path(sys.executable).parent / "jitterscope"), "demo", "--seconds", "2",
                               "--hogs", "1"], cwd=nobodys_dir, env=env, capture_output=True, text=True,
                              timeout=120)
        assert not marker.exists(), f"nobody's code ran as root: {marker.read_text()}"
        assert demo.returncode == 0, demo.stdout + demo.stderr
        assert f"{VICTIM_COMM} (pid" in demo.stdout and f"1 {HOG_COMM}" in demo.stdout, demo.stdout
        with _cwd(nobodys_dir), starvation(1, hogs=1, delay=0.5) as victim:
            # named from its first instruction, and the exe is this Python, not the payload
            assert Path(f"/proc/{victim.pid}/comm").read_text().strip() == VICTIM_COMM
            assert os.path.realpath(f"/proc/{victim.pid}/exe") == os.path.realpath(sys.executable)
        assert victim.returncode == 0
    finally:
        swapper.kill()
        swapper.wait()
        shutil.rmtree(names, ignore_errors=True)
    assert not marker.exists(), f"nobody's code ran as root: {marker.read_text()}"


@contextmanager
def _cwd(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


# --- 2: `python -m` children -------------------------------------------------

def planted_package(folder: Path, marker: Path) -> None:
    payload = python_payload(marker, "a planted jitterscope/")
    plant(folder, {"jitterscope/__init__.py": payload, "jitterscope/cli/__init__.py": payload,
                   "jitterscope/cli/__main__.py": payload, "jitterscope/collector/__init__.py": payload,
                   "jitterscope/collector/stacks.py": payload})


def test_up_children_import_nothing_from_the_callers_directory(marker, nobodys_dir, tmp_path):
    planted_package(nobodys_dir, marker)
    settings = load(data_dir=private_dir(tmp_path / "data"))
    stack = Stack(settings, Console(file=open(os.devnull, "w")))
    with _cwd(nobodys_dir):  # `cd /tmp && jitterscope up`
        stack._spawn("probe", ["--version"], "127.0.0.1:9")  # what `up` runs for the worker and collector
    child = stack.children["probe"]
    assert child.wait(120) == 0
    log = (settings.data_dir / "probe.log").read_text()
    assert log.startswith("jitterscope "), log  # the real CLI answered
    assert not marker.exists(), f"nobody's code ran as root: {marker.read_text()}"


def test_symbol_helper_imports_nothing_from_the_collectors_directory(marker, nobodys_dir):
    planted_package(nobodys_dir, marker)
    helper = UserSymbolsHelper(timeout_s=60)
    try:
        with _cwd(nobodys_dir):  # the collector's cwd is the one `up` was started in
            helper.start()
        getpid = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
        names = helper.resolve(os.getpid(), [getpid])
    finally:
        helper.close()
    assert names is not None and len(names) == 1, "the real helper did not answer"
    assert not marker.exists(), f"nobody's code ran as root: {marker.read_text()}"


# --- 10: open_private ---------------------------------------------------------

def test_open_private_refuses_a_file_another_user_made_first(nobodys_dir):
    target = nobodys_dir / "report.html"
    plant(nobodys_dir, {"report.html": "nobody's text\n"})
    before = target.stat()
    for append in (False, True):
        with pytest.raises(UnsafeFile, match="belongs to another user .*remove it or choose another path"):
            open_private(target, append=append)
    after = target.stat()
    assert target.read_text() == "nobody's text\n"
    assert (after.st_uid, stat.S_IMODE(after.st_mode)) == (before.st_uid, stat.S_IMODE(before.st_mode))


def test_open_private_refuses_a_hard_link_to_another_file(nobodys_dir):
    # a world-writable file of root's: protected_hardlinks lets nobody link it (they may read and write it)
    root_dir = Path(tempfile.mkdtemp(prefix="jitterscope-victim-"))
    try:
        os.chmod(root_dir, 0o755)
        victim = root_dir / "victim"
        victim.write_text("root's data\n")
        os.chmod(victim, 0o666)
        as_nobody("ln", str(victim), str(nobodys_dir / "report.html"))
        with pytest.raises(UnsafeFile, match="hard links.*remove it or choose another path"):
            open_private(nobodys_dir / "report.html")
        assert victim.read_text() == "root's data\n"
        assert stat.S_IMODE(victim.stat().st_mode) == 0o666
    finally:
        shutil.rmtree(root_dir)


def test_open_private_refuses_a_fifo_at_once(nobodys_dir):
    fifo = nobodys_dir / "collector.log"
    as_nobody("mkfifo", "-m", "0666", str(fifo))

    def stuck(*_):
        raise TimeoutError("open_private blocked on a FIFO")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(10)
    try:
        for append in (False, True):
            with pytest.raises(UnsafeFile, match="FIFO.*remove it or choose another path"):
                open_private(fifo, append=append)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
