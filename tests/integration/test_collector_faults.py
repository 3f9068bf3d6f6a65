# SPDX-License-Identifier: Apache-2.0
"""`kill -9` of the collector: its BPF programs go with it, a restarted
collector never reuses a record key, and everything Kafka acknowledged to the
killed one is stored -- counted against the collector's own sent numbers."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import signal
from pathlib import Path

import pytest

from jitterscope.schemas import topics
from jitterscope.streams.clickhouse import TABLE_OF
from jitterscope.workload import VICTIM_COMM, starvation
from tests.conftest import wait_until

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
SYS_BPF = 321  # x86_64
BPF_PROG_GET_FD_BY_ID = 13


def bpf_programs_of(pid: int) -> set[int]:
    """IDs of the BPF programs a process holds open (from its fdinfo)."""
    ids = set()
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            for line in info.read_text().splitlines():
                if line.startswith("prog_id:"):
                    ids.add(int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return ids


def bpf_program_exists(prog_id: int) -> bool:
    attr = (ctypes.c_uint32 * 4)(prog_id, 0, 0, 0)  # union bpf_attr { prog_id; next_id; open_flags }
    fd = _libc.syscall(SYS_BPF, BPF_PROG_GET_FD_BY_ID, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd >= 0:
        os.close(fd)
        return True
    assert ctypes.get_errno() == errno.ENOENT, os.strerror(ctypes.get_errno())
    return False


def stored(stack, host: str) -> dict[str, int]:
    return {topic: stack.query(f"SELECT count() FROM jitterscope.{TABLE_OF[t]} FINAL WHERE host = {{h:String}}",
                               h=host)[0][0] for topic, t in topics.INPUT_TOPICS.items()}


def last_sent(stack, host: str, started_ns: int) -> dict[str, int]:
    rows = stack.query("SELECT sent_by_topic FROM jitterscope.collector_stats FINAL WHERE host = {h:String} "
                       "AND started_ns = {s:UInt64} ORDER BY seq DESC LIMIT 1", h=host, s=started_ns)
    return {k: int(v) for k, v in rows[0][0].items()} if rows else {}


def test_kill_9_of_the_collector_loses_only_in_flight_events(stack):
    host = stack.env["JITTERSCOPE_HOST"]
    stack.start_worker()
    env = dict(JITTERSCOPE_TARGET_COMMS=f'["{VICTIM_COMM}*"]', JITTERSCOPE_TARGET_RESCAN_S="0.2",
               JITTERSCOPE_HISTOGRAM_INTERVAL_S="1")
    first = stack.start_collector(**env)
    programs = wait_until(lambda: bpf_programs_of(first.popen.pid), 60, "the collector's BPF programs", first)
    with starvation(seconds=4, hogs=2, delay=0.5):
        pass
    # a stats record that counts run-queue events acknowledged by Kafka is stored
    run1 = wait_until(lambda: (rows := stack.query(
        "SELECT started_ns FROM jitterscope.collector_stats FINAL WHERE host = {h:String} "
        "AND sent_by_topic[{t:String}] > 0 ORDER BY seq DESC LIMIT 1", h=host, t=topics.RUNQ)) and rows[0][0],
        90, "stats of the first collector counting sent run-queue events", first)
    os.kill(first.popen.pid, signal.SIGKILL)
    first.popen.wait()
    assert not [p for p in programs if bpf_program_exists(p)], "BPF programs outlived the killed collector"
    sent_by_first = last_sent(stack, host, run1)

    second = stack.start_collector(**env)
    with starvation(seconds=3, hogs=2, delay=0.5):
        pass
    assert second.stop() == 0
    final = __import__("json").loads((stack.data_dir / "collector-final.json").read_text())
    assert final["undelivered"] == 0
    expected = {t: sent_by_first.get(t, 0) + final["sent_by_topic"].get(t, 0) for t in topics.INPUT_TOPICS}
    # A stack's key is its content (host, stack_id): each collector sends each
    # distinct stack once, and both may send the same one (the same workload
    # ran under both), which the table keeps once -- by design.
    expected[topics.STACKS] = max(sent_by_first.get(topics.STACKS, 0), final["sent_by_topic"].get(topics.STACKS, 0))
    assert expected[topics.RUNQ] > 0
    # >=: the first collector also sent records after its last stats record; a
    # reused key would collapse two records into one and make stored < expected
    last: dict[str, int] = {}

    def all_stored():
        last.update(stored(stack, host))
        return all(last[t] >= expected[t] for t in expected) and dict(last)

    try:
        now = wait_until(all_stored, 90, f"stored >= sent {expected}")
    except AssertionError as e:
        raise AssertionError(f"{e}\nlast stored: {last}") from None
    assert now[topics.RUNQ] >= expected[topics.RUNQ]
