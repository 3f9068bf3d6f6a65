# SPDX-License-Identifier: Apache-2.0
"""Where a running CPython keeps its GIL, so a uprobe on libc's
``pthread_cond_timedwait`` (take_gil's timed wait) can be filtered to the
GIL's own condition variable.

In CPython 3.10 and 3.11 the GIL is ``_PyRuntime.ceval.gil``; in 3.12 and 3.13
the main interpreter's GIL is ``_PyRuntime._main_interpreter._gil``. Either
way its condition variable lies inside the exported data object
``_PyRuntime``, so "cond address in [runtime_lo, runtime_hi)" is the filter
for every supported version without per-version struct offsets.
(Sub-interpreters with their own GIL, 3.12+, are heap-allocated and fall
outside: only the main interpreter is measured.)

The address comes from the ELF dynamic symbol table of the mapped file that
defines ``_PyRuntime`` (the executable, or libpython in a shared build) plus
that file's load bias, read from /proc/PID/maps. Files are opened through
/proc/PID/root so containers' own mount namespaces are honoured.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple

from jitterscope.common import untrusted

SUPPORTED = ("3.10", "3.11", "3.12", "3.13")
_MAX_READ = 64 << 20  # per file: a dynsym or dynstr bigger than this is not a sane interpreter
_MAX_LIBC = 256 << 20  # libbcc reads all of libc's symbols: a bigger "libc" is not one (glibc's: ~2 MB)
_SYMBOL = b"_PyRuntime"
# python3.11, python3.13t, python3.11d; libpython3.11.so.1.0, libpython3.13t.so.1.0.
# abiflags: t = free-threaded (no GIL), d = debug.
_NAME = re.compile(r"^(?:python(3\.\d+)([a-z]*)|libpython(3\.\d+)([a-z]*)\.so(?:\..*)?)$")
_LIBC = re.compile(r"^(?:libc\.so\.6|libc-2\.\d+\.so)$")


@dataclass(frozen=True)
class GilSite:
    pid: int
    version: str          # "3.11", from the interpreter's file name
    runtime_lo: int       # absolute virtual address of _PyRuntime in the target
    runtime_hi: int       # runtime_lo + symbol size
    libc: str             # /proc/PID/map_files/<range> of its libc, or /proc/PID/root/<path from maps>
    interpreter: str      # the mapped file that defines _PyRuntime (path as the target sees it)
    libc_magic: bool = False  # libc is a map_files magic link (followed), not a path the target controls

    def open_libc(self) -> BinaryIO:
        """Process ``pid``'s libc, opened as a file it controls and checked
        (common/untrusted.py). Hand libbcc ``/proc/self/fd/N`` of it, never
        ``libc``: between a check of the path and libbcc's own open() the
        target could put a FIFO there. Raises OSError."""
        return untrusted.open_file(self.libc, magic_link=self.libc_magic, max_size=_MAX_LIBC)


@dataclass(frozen=True)
class NotMeasurable:
    pid: int
    reason: str


class _Map(NamedTuple):
    start: int
    end: int
    offset: int
    inode: int
    path: str
    deleted: bool
    range: str            # "start-end" as written in maps
    perms: str = ""       # "rw-p"


class _Elf(NamedTuple):
    loads: tuple[tuple[int, int, int], ...]   # PT_LOAD (p_offset, p_vaddr, p_filesz)
    symbol: tuple[int, int] | None            # _PyRuntime (st_value, st_size)


def locate(pid: int, proc: Path = Path("/proc")) -> GilSite | NotMeasurable:
    """The GIL site of process ``pid``, or why it cannot be measured. Never raises
    for a process that exits or a file that is not a sane ELF."""
    try:
        return _locate(pid, proc)
    except (ProcessLookupError, FileNotFoundError):
        return NotMeasurable(pid, "process exited")
    except OSError as e:
        return NotMeasurable(pid, f"cannot read /proc/{pid}: {e.strerror or e}")


def _locate(pid: int, proc: Path) -> GilSite | NotMeasurable:
    maps = _read_maps(proc / str(pid) / "maps")
    if not maps:
        return NotMeasurable(pid, "no memory mappings (process exited, a zombie or a kernel thread)")
    problems: list[str] = []
    seen: set[str] = set()
    # Maps order puts the executable first: if it defines _PyRuntime (a static
    # build, or a copy relocation) that copy is the live one, not libpython's.
    for m in maps:
        name = _NAME.match(os.path.basename(m.path))
        if name is None or m.path in seen:
            continue
        seen.add(m.path)
        version, flags = name.group(1, 2) if name.group(1) else name.group(3, 4)
        # Decided by name, before any parsing: a free-threaded build has no GIL,
        # and the GIL-inside-_PyRuntime layout is only known to hold for 3.10-3.13.
        if "t" in flags:
            return NotMeasurable(pid, f"free-threaded CPython {version}{flags}: no GIL ({m.path})")
        if version not in SUPPORTED:
            return NotMeasurable(pid, f"CPython {version} is not supported ({SUPPORTED[0]}-{SUPPORTED[-1]}): {m.path}")
        try:
            elf = _open_elf(proc, pid, m)
        except (OSError, ValueError, struct.error) as e:
            problems.append(f"{m.path}: {e}")
            continue
        if elf.symbol is None:
            problems.append(f"stripped: no dynamic symbol _PyRuntime in {m.path}")
            continue
        value, size = elf.symbol
        bias = _load_bias(elf, [x for x in maps if x.path == m.path], maps)
        if bias is None:
            problems.append(f"{m.path}: no mapping of it matches its PT_LOAD segments")
            continue
        lo = bias + value
        libc = next((x for x in maps if _LIBC.match(os.path.basename(x.path))), None)
        if libc is None:
            return NotMeasurable(pid, "no libc mapped (static binary)")
        found = _libc(proc, pid, libc)
        if isinstance(found, str):
            return NotMeasurable(pid, found if (proc / str(pid)).exists() else "process exited")
        return GilSite(pid, version, lo, lo + size, found[0], m.path, found[1])
    if not (proc / str(pid)).exists():
        return NotMeasurable(pid, "process exited")
    if problems:
        return NotMeasurable(pid, "; ".join(problems))
    return NotMeasurable(pid, "not CPython (no _PyRuntime in any mapped file)")


def _read_maps(path: Path) -> list[_Map]:
    out = []
    for line in path.read_text(errors="surrogateescape").splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        rng, perms, offset, _dev, inode = parts[:5]
        # anonymous mappings are kept (path ""): _PyRuntime may sit in one (.bss)
        p = parts[5] if len(parts) == 6 and parts[5].startswith("/") else ""
        deleted = p.endswith(" (deleted)")
        if deleted:
            p = p[: -len(" (deleted)")]
        start, end = (int(x, 16) for x in rng.split("-"))
        out.append(_Map(start, end, int(offset, 16), int(inode), p, deleted, rng, perms))
    return out


def _rooted(proc: Path, pid: int, path: str) -> Path:
    return proc / str(pid) / "root" / path.lstrip("/")


def _map_file(proc: Path, pid: int, m: _Map) -> Path:
    # named "%lx-%lx": maps pads a low address with zeros (00400000), map_files/ does not
    return proc / str(pid) / "map_files" / f"{m.start:x}-{m.end:x}"


def _libc(proc: Path, pid: int, m: _Map) -> tuple[str, bool] | str:
    """(the path a uprobe on the target's libc goes through, whether it is a
    magic link), or why none is safe. map_files/ first: it is the
    mapped file itself, which cannot be a FIFO; the path from maps only if
    that is unreadable (no CAP_SYS_ADMIN/CAP_CHECKPOINT_RESTORE) and it opens
    as a regular file of a sane size."""
    errors = []
    for path, magic in ((_map_file(proc, pid, m), True), (_rooted(proc, pid, m.path), False)):
        if magic or not m.deleted:
            try:
                untrusted.stat_file(path, magic_link=magic, max_size=_MAX_LIBC)
                return str(path), magic
            except OSError as e:
                errors.append(f"{path}: {e.strerror or e}")
    return "libc: " + "; ".join(errors)


def _open_elf(proc: Path, pid: int, m: _Map) -> _Elf:
    # The path through the target's root is what it mapped unless the file was
    # replaced since (an upgrade: maps then says "(deleted)", or the inode
    # differs); map_files/ always names the mapped file itself but needs
    # CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE, so it is the fallback.
    # Both are opened as files another process controls (common/untrusted.py):
    # the maps text is ambiguous (a newline in a name reads as "\012", so the
    # rooted path may name a FIFO the target planted), map_files is not.
    sources = [] if m.deleted else [(_rooted(proc, pid, m.path), False)]
    sources.append((_map_file(proc, pid, m), True))
    fallback, errors = None, []
    try:
        for src, magic in sources:
            try:
                f = untrusted.open_file(src, magic_link=magic)
            except OSError as e:
                errors.append(f"{src}: {e.strerror or e}")
                continue
            if os.fstat(f.fileno()).st_ino == m.inode:
                with f:
                    return _parse_cached(f)
            if fallback is None:
                fallback = f  # opened but not the mapped inode: the best we have
            else:
                f.close()
        if fallback is None:
            raise OSError("cannot open: " + "; ".join(errors))
        return _parse_cached(fallback)
    finally:
        if fallback is not None:
            fallback.close()


_cache: dict[tuple[int, int, int, int], _Elf] = {}
_CACHE_MAX = 32  # distinct interpreter files on one host; many processes share each


def _parse_cached(f) -> _Elf:
    st = os.fstat(f.fileno())
    key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
    elf = _cache.get(key)
    if elf is None:
        elf = _parse(f, st.st_size)
        if len(_cache) >= _CACHE_MAX:
            del _cache[next(iter(_cache))]  # oldest first
        _cache[key] = elf
    return elf


def _read(f, offset: int, size: int, file_size: int) -> bytes:
    if size > _MAX_READ or offset < 0 or offset + size > file_size:
        raise ValueError(f"truncated or corrupt ELF (wants {size} bytes at {offset}, file is {file_size})")
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("truncated ELF")
    return data


def _parse(f, file_size: int) -> _Elf:
    """PT_LOAD segments and _PyRuntime from .dynsym: only the ELF, program and
    section headers and the two dynamic-symbol sections are read."""
    ident = _read(f, 0, 16, file_size)
    if ident[:4] != b"\x7fELF":
        raise ValueError("not an ELF file")
    if ident[4] != 2:
        raise ValueError("not a 64-bit ELF")
    e = {1: "<", 2: ">"}.get(ident[5])
    if e is None:
        raise ValueError("bad ELF byte order")
    (_type, _mach, _ver, _entry, phoff, shoff, _flags, _ehsize,
     phentsize, phnum, shentsize, shnum, _shstrndx) = struct.unpack(e + "HHIQQQIHHHHHH", _read(f, 16, 48, file_size))
    if phentsize != 56 or (shnum and shentsize != 64):
        raise ValueError("unexpected ELF header sizes")

    loads = []
    for p_type, _pf, p_offset, p_vaddr, _pa, p_filesz, _memsz, _align in struct.iter_unpack(
            e + "IIQQQQQQ", _read(f, phoff, 56 * phnum, file_size)):
        if p_type == 1:  # PT_LOAD
            loads.append((p_offset, p_vaddr, p_filesz))

    sections = list(struct.iter_unpack(e + "IIQQQQIIQQ", _read(f, shoff, 64 * shnum, file_size)))
    symbol = None
    for _n, sh_type, _fl, _addr, sh_offset, sh_size, sh_link, _info, _al, _entsize in sections:
        if sh_type != 11 or sh_link >= len(sections):  # SHT_DYNSYM
            continue
        strtab = sections[sh_link]
        names = _read(f, strtab[4], strtab[5], file_size)
        at = names.find(b"\0" + _SYMBOL + b"\0")
        if at < 0:
            break
        syms = _read(f, sh_offset, sh_size - sh_size % 24, file_size)
        for st_name, st_info, _other, st_shndx, st_value, st_size in struct.iter_unpack(e + "IBBHQQ", syms):
            # defined (not SHN_UNDEF) data object: a mere reference to it does not count
            if st_name == at + 1 and st_shndx != 0 and st_info & 0xF == 1:
                symbol = (st_value, st_size)
                break
        break
    return _Elf(tuple(loads), symbol)


def _load_bias(elf: _Elf, file_maps: list[_Map], all_maps: list[_Map]) -> int | None:
    """How far the file was moved from its link-time addresses (0 for a non-PIE
    executable). A mapping made for a PT_LOAD segment starts at the page holding
    p_vaddr and its file offset is p_offset rounded down to a page, so a
    mapping whose offset is exactly that gives the bias. A bias is kept only if
    every segment is mapped where it puts it and _PyRuntime (mutable data)
    then lands in a writable mapping: the same file can also be mapped whole,
    read-only, by a reader of its symbols (BCC's libelf does so in a process
    that resolves stacks), which matches the first segment alone."""
    page = mmap.PAGESIZE
    value = elf.symbol[0]
    placed = {(m.start, m.offset) for m in file_maps}
    for p_offset, p_vaddr, _filesz in elf.loads:
        for m in file_maps:
            if m.offset != p_offset & ~(page - 1):
                continue
            bias = m.start - (p_vaddr & ~(page - 1))
            whole = all((bias + (v & ~(page - 1)), o & ~(page - 1)) in placed for o, v, size in elf.loads if size)
            if whole and any(x.start <= bias + value < x.end and "w" in x.perms for x in all_maps):
                return bias
    return None
