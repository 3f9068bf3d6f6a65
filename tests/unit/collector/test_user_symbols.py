# SPDX-License-Identifier: Apache-2.0
"""User-stack symbols come from a helper process (collector/stacks.py), so
libbcc 0.26's stray close() can never hit the collector's BPF maps: the
names are right, the helper is another process that counts as jitterscope's
own, and a helper that dies or hangs costs only "[unknown]" frames, never
the collector. Uses the real libbcc on this process's own libc."""

from __future__ import annotations

import ctypes
import os
import signal
import time

import pytest

from jitterscope.collector.stacks import UNKNOWN, Symbolizer, UserSymbolsHelper, helper_pids


@pytest.fixture
def getpid_address():
    libc = ctypes.CDLL("libc.so.6")
    return ctypes.cast(libc.getpid, ctypes.c_void_p).value


@pytest.fixture
def symbolizer():
    s = Symbolizer()
    yield s
    s.close()


def test_names_come_from_a_helper_process_that_is_jitterscopes_own(symbolizer, getpid_address):
    names = symbolizer.user([getpid_address, getpid_address + 1, 0x10], os.getpid())
    assert names[0] == names[1] and "getpid" in names[0], names
    assert names[2] == UNKNOWN  # no mapping there
    helper = symbolizer.helper.pid
    assert helper and helper != os.getpid()
    assert helper in helper_pids()  # the agent counts it among its own processes
    symbolizer.close()
    assert helper not in helper_pids()


def test_a_killed_helper_is_replaced_and_costs_no_frames(symbolizer, getpid_address):
    symbolizer.user([getpid_address], os.getpid())
    first = symbolizer.helper.pid
    os.kill(first, signal.SIGKILL)
    os.waitid(os.P_PID, first, os.WEXITED | os.WNOWAIT)  # dead before the next request
    names = symbolizer.user([getpid_address + 2], os.getpid())
    assert "getpid" in names[0]
    assert symbolizer.helper.pid not in (None, first)
    assert symbolizer.helper.restarts == 1


def test_a_helper_that_does_not_answer_gives_unknown_frames_not_a_stuck_collector(getpid_address):
    helper = UserSymbolsHelper(timeout_s=1.0)
    symbolizer = Symbolizer(helper=helper)
    try:
        symbolizer.user([getpid_address], os.getpid())
        os.kill(helper.pid, signal.SIGSTOP)
        # one wait, not two: a process whose files block libbcc (a FIFO swapped in
        # after the helper's check, issue 40) would block a replacement just the same
        t = time.monotonic()
        assert symbolizer.user([getpid_address + 3], os.getpid()) == [UNKNOWN]
        assert time.monotonic() - t < 5
        assert helper.restarts == 1 and helper.pid is None
        assert "no answer within 1 s" in helper.refused[os.getpid()] and helper.refusals == 1
        # ... and that process is not asked about again (no helper started) until it exits
        assert symbolizer.user([getpid_address + 4], os.getpid()) == [UNKNOWN] and helper.pid is None
        symbolizer.forget({os.getpid()})
        helper.timeout_s = 60.0  # a fresh helper's start (Python, BCC) takes seconds on a busy box
        assert "getpid" in symbolizer.user([getpid_address + 3], os.getpid())[0]  # not remembered as unknown
        assert helper.refused == {}
    finally:
        symbolizer.close()


def test_forgotten_processes_leave_the_helper_too(symbolizer, getpid_address):
    symbolizer.user([getpid_address], os.getpid())
    symbolizer.forget({os.getpid()})
    assert "getpid" in symbolizer.user([getpid_address], os.getpid())[0]  # a fresh cache in the helper


def test_a_helper_whose_owner_is_dropped_unclosed_ends_with_it(getpid_address):
    import gc

    symbolizer = Symbolizer()
    symbolizer.user([getpid_address], os.getpid())
    proc = symbolizer.helper._proc
    del symbolizer
    gc.collect()
    assert proc.poll() is not None  # reaped, not left running beside the collector
    assert proc.pid not in helper_pids()


def test_a_helper_is_the_collector_s_own_from_its_start():
    own: dict[int, str] = {}
    helper = UserSymbolsHelper(own=own)
    symbolizer = Symbolizer(helper=helper)
    try:
        symbolizer.user([0x1000], os.getpid())  # any frame starts the helper
        assert own == {helper.pid: "collector"}
    finally:
        symbolizer.close()


def test_warming_starts_the_helper_and_loads_kernel_symbols_before_any_stack(getpid_address):
    own: dict[int, str] = {}
    symbolizer = Symbolizer(helper=UserSymbolsHelper(own=own))
    try:
        symbolizer.warm()  # what the first stack of a storm would otherwise wait for
        assert symbolizer.helper.pid and own == {symbolizer.helper.pid: "collector"}
        started = symbolizer.helper.pid
        assert "getpid" in symbolizer.user([getpid_address], os.getpid())[0]
        assert symbolizer.helper.pid == started  # the first stack used the warm helper
    finally:
        symbolizer.close()
