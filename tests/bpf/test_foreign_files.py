# SPDX-License-Identifier: Apache-2.0
"""A local user cannot freeze the collector with a FIFO, a huge sparse file
or a misleading path where it expects a binary, a libc or a perf map (issue
40, item 3; common/untrusted.py).

The attack, for real, as ``nobody``: a copy of CPython and of libc in a
folder named ``a<newline>b``, run from there. /proc/PID/maps prints that
newline as the text ``\\012``, and a folder literally named ``a\\012b`` holds
FIFOs ``python3.11`` and ``libc.so.6`` where the path read from maps points.
Before the fix the collector's main thread blocked in open() on them for
good. Each call below runs in a thread with a generous deadline, and the
FIFOs are checked never to have been opened. A FIFO swapped in after a
check (a race) is covered by opening without blocking where the collector
opens (below) and, in the symbol helper, by its deadline and its memory of
refused processes (tests/unit/collector/test_user_symbols.py).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from jitterscope.collector import pyruntime
from jitterscope.collector.probes import blocked
from jitterscope.collector.probes.blocked import BlockedProbe, BlockedSignal
from jitterscope.collector.stacks import UNKNOWN, Symbolizer, UserSymbolsHelper, refusal
from tests.conftest import wait_until
from tests.unit.collector.probes.test_probe_decoding import fake_context

pytestmark = pytest.mark.bpf

NOBODY = 65534  # nobody:nogroup on Debian
DEADLINE_S = 30.0  # far above any honest answer; a blocked open() never returns
PYTHON = "/usr/bin/python3.11"  # Debian's: a static build, the executable defines _PyRuntime

# The attacker's process: says its _PyRuntime address, then waits for stdin to close.
CHILD = r"""
import ctypes, sys
print(ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime")), flush=True)
sys.stdin.read()
"""


def as_nobody(argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]


def bounded(fn, *args):
    """``fn(*args)`` within DEADLINE_S, in a thread: a call that blocks fails
    the test instead of hanging it."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn(*args)
        except BaseException as e:  # handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    t.start()
    t.join(DEADLINE_S)
    assert not t.is_alive(), f"{fn.__name__} still blocked after {DEADLINE_S} s"
    if "error" in out:
        raise out["error"]
    return out["value"], time.monotonic() - started


def _libc_path() -> str:
    return next(line.split(None, 5)[5] for line in Path("/proc/self/maps").read_text().splitlines()
                if line.rstrip().rsplit("/", 1)[-1].startswith(("libc.so.6", "libc-2.")))


class Planted:
    """The attack's folder (nobody's) and its FIFOs, each with a writer
    waiting in a non-blocking poll, so a reader that opened one is seen."""

    def __init__(self, base: Path):
        self.base = base
        self.real = base / "a\nb"
        self.fake = base / "a\\012b"  # the literal text maps prints for the folder above
        self.fifos = [self.fake / "python3.11", self.fake / "libc.so.6"]

    def opened(self) -> list[str]:
        """The FIFOs some reader has open now (a writer's non-blocking open succeeds only then)."""
        found = []
        for fifo in self.fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                found.append(str(fifo))
            except OSError:  # ENXIO: no reader
                pass
        return found


@contextmanager
def planted_interpreter():
    """(the attacker's running process, Planted, its own _PyRuntime address)."""
    if not os.path.exists(PYTHON):
        pytest.fail(f"{PYTHON} (Debian's static CPython 3.11, with python3-bpfcc) is missing: run `make setup`")
    base = Path(tempfile.mkdtemp(prefix="jitterscope-fifo-"))
    os.chmod(base, 0o755)
    p = Planted(base)
    child = None
    try:
        for folder in (p.real, p.fake):
            folder.mkdir()
        shutil.copy(PYTHON, p.real / "python3.11")
        shutil.copy(_libc_path(), p.real / "libc.so.6")
        for fifo in p.fifos:
            os.mkfifo(fifo)
        for path in (base, p.real, p.fake, *p.real.iterdir(), *p.fifos):
            os.chown(path, NOBODY, NOBODY)
        env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(p.real)}
        child = subprocess.Popen(as_nobody([str(p.real / "python3.11"), "-c", CHILD]), env=env, cwd="/",
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        address = int(child.stdout.readline())
        maps = Path(f"/proc/{child.pid}/maps").read_text()
        assert f"{p.fake}/python3.11" in maps and f"{p.fake}/libc.so.6" in maps, "the premise: maps misleads"
        yield child, p, address
    finally:
        if child:
            child.kill()
            child.wait()
        shutil.rmtree(base)


def test_locating_the_gil_reads_the_mapped_files_never_the_fifos():
    with planted_interpreter() as (child, planted, address):
        site, took = bounded(pyruntime.locate, child.pid)
        assert isinstance(site, pyruntime.GilSite), site
        assert site.runtime_lo == address  # the right file: the one the process runs
        assert site.libc_magic and site.libc.startswith(f"/proc/{child.pid}/map_files/")
        assert os.path.samefile(site.libc, planted.real / "libc.so.6")
        assert planted.opened() == [] and took < DEADLINE_S


def test_without_map_files_the_fifos_make_it_not_measurable_at_once():
    """The systemd unit gives neither CAP_SYS_ADMIN nor CAP_CHECKPOINT_RESTORE:
    map_files/ is closed, only the misleading path is left."""
    with planted_interpreter() as (child, planted, _address):
        code = ("import sys; from jitterscope.collector import pyruntime; "
                f"print(pyruntime.locate({child.pid}))")
        # root, less the two capabilities that open map_files/ (a root exec's permitted set is the bounding set)
        run = subprocess.run(["setpriv", "--bounding-set=-sys_admin,-checkpoint_restore", "--",
                              sys.executable, "-P", "-c", code], capture_output=True, text=True,
                             timeout=DEADLINE_S)
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith("NotMeasurable("), run.stdout
        assert "not a regular file (a FIFO)" in run.stdout and "Operation not permitted" in run.stdout, run.stdout
        assert planted.opened() == []


def test_the_blocked_signal_sets_up_the_planted_process_promptly():
    with planted_interpreter() as (child, planted, _address):
        signal = BlockedSignal()
        signal.open(fake_context(own={os.getpid(): "collector"}))
        try:
            _, took = bounded(signal.set_targets, None, {child.pid: 1})
            assert signal.gil_status[child.pid].startswith("measured: CPython 3.11"), signal.gil_status
            assert signal.probe.gil_watched() == {child.pid}
            assert planted.opened() == [] and took < DEADLINE_S
        finally:
            signal.close()


def test_a_libc_swapped_for_a_fifo_after_locating_is_refused_not_opened(tmp_path):
    """Between locate() and the uprobe, the target can swap its libc's path
    for a FIFO: the probe opens it without blocking, refuses it, and hands
    libbcc only /proc/self/fd/N of what it checked."""
    fifo = tmp_path / "libc.so.6"
    os.mkfifo(fifo)
    site = pyruntime.GilSite(os.getpid(), "3.11", 0x1000, 0x2000, str(fifo), PYTHON)
    with BlockedProbe(threshold_ns=1_000_000) as probe:
        probe.open(lambda _e: None)
        with pytest.raises(OSError, match="not a regular file"):
            bounded(probe.watch_gil, site)
        assert probe.gil_watched() == set() and probe._bpf.uprobe_fds == {}


# -- the symbol helper -------------------------------------------------------------------


@contextmanager
def nobody_process():
    proc = subprocess.Popen(as_nobody(["sleep", "600"]))
    try:
        # setpriv runs as root until it drops to nobody: a check of the process's uid before then
        # (a busy CI box) saw uid 0
        wait_until(lambda: _uid(proc.pid) == NOBODY, 30, "the process running as nobody")
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _uid(pid: int) -> int | None:
    """The process's real uid (None once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("Uid:"))


@contextmanager
def perf_map(pid: int, make):
    """/tmp/perf-PID.map made by ``make(path)``, nobody's, as the process's own user would."""
    path = Path(f"/tmp/perf-{pid}.map")
    make(path)
    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
    try:
        yield path
    finally:
        path.unlink()


def _sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(64 << 30)  # 64 GB of zeros, no blocks: one endless line to libbcc's getline()


def _rss_kb(pid: int) -> int:
    return next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if line.startswith("VmRSS:"))


@pytest.mark.parametrize("make, why", [(os.mkfifo, "not a regular file (a FIFO)"),
                                       (_sparse, f"{64 << 30} bytes, more than")])
def test_a_perf_map_that_is_not_a_sane_file_costs_one_prompt_refusal(make, why):
    helper = UserSymbolsHelper()
    symbolizer = Symbolizer(helper=helper)
    try:
        symbolizer.warm()
        with nobody_process() as victim, perf_map(victim.pid, make):
            names, took = bounded(symbolizer.user, [0x401000, 0x402000], victim.pid)
            assert names == [UNKNOWN, UNKNOWN]
            assert why in helper.refused[victim.pid] and helper.refusals == 1
            assert took < 5, f"{took:.1f} s for a refusal"
            assert helper.restarts == 0 and _rss_kb(helper.pid) < 512 * 1024  # it read none of it
            # later events with the same suspect: no helper call at all
            _, again = bounded(symbolizer.user, [0x403000], victim.pid)
            assert helper.refusals == 1 and again < 0.1
            symbolizer.forget({victim.pid})
            assert victim.pid not in helper.refused
    finally:
        symbolizer.close()


def test_a_perf_map_of_another_user_is_refused():
    with nobody_process() as victim, perf_map(victim.pid, lambda p: p.write_text("1000 10 f\n")) as path:
        os.chown(path, 1234, 1234)
        assert "owned by uid 1234" in refusal(victim.pid)
        os.chown(path, NOBODY, NOBODY)
        assert refusal(victim.pid) is None  # its own, small, regular: libbcc may read it


def test_the_symbol_helper_refuses_the_planted_interpreter_promptly():
    helper = UserSymbolsHelper()
    symbolizer = Symbolizer(helper=helper)
    try:
        symbolizer.warm()
        with planted_interpreter() as (child, planted, _address):
            names, took = bounded(symbolizer.user, [0x401000], child.pid)
            assert names == [UNKNOWN] and "not a regular file (a FIFO)" in helper.refused[child.pid]
            assert planted.opened() == [] and took < 5 and helper.restarts == 0
        assert "getpid" in symbolizer.user([ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value],
                                           os.getpid())[0]  # an honest process still gets its names
    finally:
        symbolizer.close()

