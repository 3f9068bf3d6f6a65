# SPDX-License-Identifier: Apache-2.0
"""collector/pyruntime.py against live interpreters (ground truth: the child's
own ctypes address of _PyRuntime) and fixture /proc trees."""

from __future__ import annotations

import glob
import os
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jitterscope.collector import pyruntime
from jitterscope.collector.pyruntime import GilSite, NotMeasurable, locate

# The child reports its version, its _PyRuntime address and its libc, then
# waits for a line on stdin (or EOF) to exit.
CHILD = r"""
import ctypes, sys
libc = next(l.split(None, 5)[5].strip() for l in open("/proc/self/maps")
            if l.rstrip().rsplit("/", 1)[-1].startswith(("libc.so.6", "libc-2.")))
addr = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
print("%d.%d %d %s" % (sys.version_info[:2] + (addr, libc)), flush=True)
sys.stdin.readline()
"""


def _interpreters() -> dict[str, str]:
    """The venv's python and any other CPython 3 on this machine -> "3.NN"."""
    found = [sys.executable, *(f"/usr/bin/python3.{n}" for n in range(8, 15))]
    found += [shutil.which(f"python3.{n}") or "" for n in range(8, 15)]
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found += sorted(p for p in glob.glob(f"{pyenv}/versions/3.*/bin/python3.*") if re.search(r"3\.\d+$", p))
    out: dict[str, str] = {}
    for p in found:
        real = os.path.realpath(p) if p else ""
        # ELF only: pyenv's shims are shell scripts that exec one of the others
        if real and os.path.isfile(real) and real not in {os.path.realpath(q) for q in out}:
            with open(real, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    out[p] = subprocess.run([p, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                                            capture_output=True, text=True, timeout=30).stdout.strip()
    return out


_FOUND = _interpreters()
INTERPRETERS = [p for p, v in _FOUND.items() if v in pyruntime.SUPPORTED]


def _readline(proc: subprocess.Popen, deadline_s: float = 20) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], deadline_s)
    assert ready, f"child {proc.args[0]} said nothing within {deadline_s}s"
    return proc.stdout.readline()


def _symbol_size(path: str) -> int | None:
    if shutil.which("nm") is None:
        return None
    out = subprocess.run(["nm", "-D", "-S", path], capture_output=True, text=True, timeout=30).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[3] == "_PyRuntime":
            return int(parts[1], 16)
    return None


@pytest.mark.parametrize("python", INTERPRETERS)
def test_live_interpreter_address_matches_ctypes(python):
    child = subprocess.Popen([python, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        version, addr, libc = _readline(child).split(None, 2)
        site = locate(child.pid)
        assert isinstance(site, GilSite), site
        assert site.pid == child.pid
        assert site.version == version
        assert site.runtime_lo == int(addr)
        size = _symbol_size(os.path.realpath(site.interpreter))
        if size is not None:
            assert site.runtime_hi - site.runtime_lo == size
        assert site.runtime_hi - site.runtime_lo > 0
        assert os.path.exists(site.libc)
        assert os.path.samefile(site.libc, libc.strip())
        # the mapped libc itself (a magic link, root here), never a path the target could swap for a FIFO
        assert site.libc.startswith(f"/proc/{child.pid}/map_files/") and site.libc_magic
    finally:
        child.kill()
        child.wait()


def test_venv_and_debian_python311_are_covered():
    # the two interpreters the collector must handle on this image, when present
    assert "3.11" in {_FOUND[p] for p in INTERPRETERS}
    if os.path.exists("/usr/bin/python3.11"):
        assert any(os.path.realpath(p) == os.path.realpath("/usr/bin/python3.11") for p in INTERPRETERS)


def test_non_python_process_is_not_cpython():
    child = subprocess.Popen(["sleep", "30"])
    try:
        # whether or not ld.so has mapped libc yet, no mapped file is an interpreter
        result = locate(child.pid)
        assert isinstance(result, NotMeasurable)
        assert "not CPython" in result.reason
    finally:
        child.kill()
        child.wait()


def test_missing_pid_is_not_measurable():
    result = locate(2**22 + 12345)  # above pid_max's ceiling: never a live pid
    assert isinstance(result, NotMeasurable)
    assert result.reason == "process exited"


# -- fixture /proc trees -------------------------------------------------------

PID = 4242
LIBC_LINE = "7f0000400000-7f0000428000 r--p 00000000 08:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6\n"


def _fixture(tmp_path: Path, maps: str, files: dict[str, bytes] | None = None) -> Path:
    proc = tmp_path / "proc"
    (proc / str(PID) / "root").mkdir(parents=True)
    (proc / str(PID) / "maps").write_text(maps)
    for path, data in (files or {}).items():
        f = proc / str(PID) / "root" / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
    return proc


@pytest.mark.parametrize("path, reason", [
    ("/usr/bin/python3.13t", "free-threaded CPython 3.13t: no GIL"),
    ("/usr/lib/libpython3.13t.so.1.0", "free-threaded CPython 3.13t: no GIL"),
    ("/opt/py/lib/libpython3.9.so.1.0", "CPython 3.9 is not supported (3.10-3.13)"),
    ("/opt/py/bin/python3.14", "CPython 3.14 is not supported (3.10-3.13)"),
])
def test_name_decides_before_parsing(tmp_path, path, reason):
    # the files do not exist: the name alone must decide
    maps = f"00400000-00500000 r-xp 00000000 08:01 99 {path}\n" + LIBC_LINE
    result = locate(PID, _fixture(tmp_path, maps))
    assert isinstance(result, NotMeasurable)
    assert result.reason.startswith(reason)


def _own_libpython_maps() -> tuple[str, str]:
    """This process's maps and the file that defines its _PyRuntime: its
    libpython (a shared build, the venv's here), else its executable (a
    static build, Debian's /usr/bin/python3.11)."""
    maps = Path("/proc/self/maps").read_text()
    libs = {l.split(None, 5)[5] for l in maps.splitlines() if "/libpython3." in l}
    assert len(libs) <= 1, libs
    return maps, libs.pop() if libs else os.path.realpath("/proc/self/exe")


def test_fixture_copy_of_own_maps_gives_own_address(tmp_path):
    import ctypes

    maps, lib = _own_libpython_maps()
    proc = tmp_path / "proc"
    (proc / str(PID)).mkdir(parents=True)
    # as /proc/PID/root is: a link to the process's root. Not a link per file,
    # which files another process controls are never opened through
    (proc / str(PID) / "root").symlink_to("/")
    (proc / str(PID) / "maps").write_text(maps)
    site = locate(PID, proc)
    assert isinstance(site, GilSite), site
    assert site.runtime_lo == ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
    assert site.interpreter == lib
    assert site.libc.startswith(str(proc / str(PID) / "root") + "/")


def test_deleted_interpreter_is_read_through_map_files(tmp_path):
    import ctypes

    maps, lib = _own_libpython_maps()
    proc = tmp_path / "proc"
    (proc / str(PID) / "root").mkdir(parents=True)  # the path itself is gone
    (proc / str(PID) / "map_files").mkdir()
    lines = []
    for line in maps.splitlines():
        if line.endswith(lib) or "/libc" in line:  # libc too: the root is empty
            (proc / str(PID) / "map_files" / line.split()[0]).symlink_to(line.split(None, 5)[5])
        if line.endswith(lib):
            line += " (deleted)"
        lines.append(line + "\n")
    (proc / str(PID) / "maps").write_text("".join(lines))
    site = locate(PID, proc)
    assert isinstance(site, GilSite), site
    assert site.runtime_lo == ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))


def test_no_libc_is_a_static_binary(tmp_path):
    maps, lib = _own_libpython_maps()
    proc = tmp_path / "proc"
    (proc / str(PID)).mkdir(parents=True)
    # as /proc/PID/root is: a link to the process's root. Not a link per file,
    # which files another process controls are never opened through
    (proc / str(PID) / "root").symlink_to("/")
    (proc / str(PID) / "maps").write_text("".join(l + "\n" for l in maps.splitlines() if "/libc" not in l))
    result = locate(PID, proc)
    assert result == NotMeasurable(PID, "no libc mapped (static binary)")


LIB = "/opt/py/lib/libpython3.11.so.1.0"


@pytest.mark.parametrize("content, reason", [
    (b"", "truncated"),
    (b"\x7fELF\x02\x01\x01" + b"\0" * 9 + b"\x03\x00", "truncated"),  # header cut short
    (b"garbage " * 4096, "not an ELF file"),
    (b"\x7fELF\x01\x01\x01" + b"\0" * 100, "not a 64-bit ELF"),
])
def test_bad_elf_is_not_measurable(tmp_path, content, reason):
    maps = f"7f1000000000-7f1000001000 r--p 00000000 08:01 77 {LIB}\n" + LIBC_LINE
    result = locate(PID, _fixture(tmp_path, maps, {LIB: content}))
    assert isinstance(result, NotMeasurable)
    assert LIB in result.reason and reason in result.reason


def test_truncated_copy_of_real_libpython_is_not_measurable(tmp_path):
    _, lib = _own_libpython_maps()
    head = Path(lib).read_bytes()[: 1 << 20]  # headers intact, section table and dynsym cut off
    maps = f"7f1000000000-7f1000001000 r--p 00000000 08:01 77 {LIB}\n" + LIBC_LINE
    result = locate(PID, _fixture(tmp_path, maps, {LIB: head}))
    assert isinstance(result, NotMeasurable)
    assert "truncated" in result.reason


def test_elf_without_the_symbol_is_stripped(tmp_path):
    # a real, valid ELF (sleep) under an interpreter's name: no _PyRuntime in its dynsym
    sleep = shutil.which("sleep")
    maps = f"7f1000000000-7f1000001000 r--p 00000000 08:01 77 {LIB}\n" + LIBC_LINE
    result = locate(PID, _fixture(tmp_path, maps, {LIB: Path(sleep).read_bytes()}))
    assert result == NotMeasurable(PID, f"stripped: no dynamic symbol _PyRuntime in {LIB}")


def test_empty_maps_and_missing_pid_in_fixture(tmp_path):
    proc = _fixture(tmp_path, "")
    assert "no memory mappings" in locate(PID, proc).reason
    assert locate(PID + 1, proc) == NotMeasurable(PID + 1, "process exited")


def test_a_reader_s_whole_file_mapping_of_the_interpreter_is_not_its_load():
    """BCC's libelf maps an ELF it reads symbols from whole and read-only into
    the reading process (the collector, the test runner): that mapping has the
    first segment's offset, and must not give the load bias."""
    import ctypes
    import mmap

    _maps, lib = _own_libpython_maps()
    with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as _whole:
        assert sum(lib in line for line in Path("/proc/self/maps").read_text().splitlines()) > 1
        site = locate(os.getpid())
    assert isinstance(site, GilSite), site
    assert site.runtime_lo == ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
