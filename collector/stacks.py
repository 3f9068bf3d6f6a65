# SPDX-License-Identifier: Apache-2.0
"""Stacks at alarm: addresses from the kernel -> symbolized frames -> StackTrace records.

The run-queue probe (bpf/runq.bpf.c) sends the victim's and the suspect's
kernel and user stacks inside its event (raw addresses, innermost first; why
not BPF_STACK_TRACE ids is said there). The id a record carries is a 64-bit
hash of the process name and the symbolized frames, so the same code path
gets the same id on every host and after every restart: a fleet-wide query
can add up "the stacks that caused the most waiting". Frames are function
names without offsets, for the same reason (a busy loop is caught at many
instruction addresses).

Each distinct stack is published once (a bounded memory of what was sent; the
``stacks`` table is keyed by (host, stack_id), so a re-send after the memory
forgot it replaces, not adds), and before the first event that refers to it.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from typing import Callable

MAX_PROCESSES = 64          # user symbol tables kept (ELF symbols of a process: MBs)
MAX_FRAMES_PER_PROCESS = 8192
MAX_PUBLISHED = 65536       # stack ids already sent
UNKNOWN = "[unknown]"


class _Lru(OrderedDict):
    """An OrderedDict that drops its oldest entry past ``limit`` (calling
    ``on_evict`` with it)."""

    def __init__(self, limit: int, on_evict: Callable | None = None):
        super().__init__()
        self.limit, self.on_evict = limit, on_evict

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.limit:
            old_key, old = self.popitem(last=False)
            if self.on_evict:
                self.on_evict(old_key, old)


class Symbolizer:
    """Addresses -> function names: the kernel's via BCC's ksym, a process's
    via a BCC symbol cache of its own, kept per process (bounded) and freed
    when the process exits (``forget``)."""

    def __init__(self, max_processes: int = MAX_PROCESSES):
        self._processes = _Lru(max_processes, lambda pid, entry: self._free(pid, entry[0]))
        self._kernel: dict[int, str] = {}

    def kernel(self, addrs: list[int]) -> list[str]:
        from bcc import BPF

        if len(self._kernel) > MAX_FRAMES_PER_PROCESS:
            self._kernel.clear()
        out = []
        for addr in addrs:
            name = self._kernel.get(addr)
            if name is None:
                name = self._kernel[addr] = BPF.ksym(addr).decode(errors="replace")
            out.append(name)
        return out

    def user(self, addrs: list[int], pid: int) -> list[str]:
        entry = self._processes.get(pid)
        if entry is None:
            from bcc import SymbolCache

            entry = (SymbolCache(pid), {})
        self._processes.put(pid, entry)
        cache, names = entry
        if len(names) > MAX_FRAMES_PER_PROCESS:
            names.clear()
        out = []
        for addr in addrs:
            name = names.get(addr)
            if name is None:
                name = names[addr] = self._user_frame(cache, addr)
            out.append(name)
        return out

    @staticmethod
    def _user_frame(cache, addr: int) -> str:
        name, _offset, module = cache.resolve(addr, True)
        if name:
            return name.decode(errors="replace")
        if module:  # no symbol (stripped), but the file is known; "[vdso]" is bracketed already
            base = os.path.basename(module.decode(errors="replace"))
            return base if base.startswith("[") else f"[{base}]"
        return UNKNOWN

    @staticmethod
    def _free(pid: int, cache) -> None:
        from bcc.libbcc import lib

        lib.bcc_free_symcache(cache.cache, pid)
        cache.cache = None

    def forget(self, pids: set[int]) -> None:
        for pid in pids & self._processes.keys():
            self._free(pid, self._processes.pop(pid)[0])

    def close(self) -> None:
        self.forget(set(self._processes))


def stack_id(comm: str, kernel: list[str], user: list[str]) -> int:
    """The stable id of a symbolized stack: 63 bits of a hash (the records'
    U64 stops at 2**63 - 1, what every JSON reader takes), never 0 (none)."""
    text = "\0".join([comm, *kernel, "\1", *user]).encode()
    return (int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1) or 1


class StackTable:
    """Stacks as ids, each distinct one published once through
    ``publish(stack_id, pid, comm, kernel, user)``."""

    def __init__(self, publish: Callable[[int, int, str, list[str], list[str]], None],
                 symbolizer: Symbolizer | None = None):
        self._publish = publish
        self.symbolizer = symbolizer or Symbolizer()
        self._published = _Lru(MAX_PUBLISHED)

    def resolve(self, pid: int, comm: str, kernel_addrs, user_addrs) -> int:
        """The stack id of these addresses (innermost first) of ``pid``,
        published if new; 0 when the kernel took neither."""
        if not kernel_addrs and not user_addrs:
            return 0
        kernel = self.symbolizer.kernel(kernel_addrs)
        user = self.symbolizer.user(user_addrs, pid) if user_addrs else []
        ident = stack_id(comm, kernel, user)
        if ident not in self._published:
            self._publish(ident, pid, comm, kernel, user)
        self._published.put(ident, True)
        return ident

    def forget(self, pids: set[int]) -> None:
        self.symbolizer.forget(pids)

    def close(self) -> None:
        self.symbolizer.close()
