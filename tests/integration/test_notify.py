# SPDX-License-Identifier: Apache-2.0
"""Alert notifications from a real pipeline (issue 10, part 6): hogs pinned
with a victim on one CPU -> BPF -> Kafka -> streams worker -> a local HTTP
receiver that gets grouped alerts in Alertmanager's format (and the plain
webhook), then their resolution once the hogs stop. A dead receiver (one
that accepts and never answers, one that refuses) does not slow the stream:
a known burst is stored within the normal deadline while it hangs.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from contextlib import contextmanager
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jitterscope.broker import free_port
from jitterscope.collector.publish import KafkaPublisher
from jitterscope.schemas import events, topics
from jitterscope.workload import HOG_COMM, VICTIM_COMM, last_cpu, starvation
from tests.conftest import records_on_topic, wait_until

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

WINDOW_S, QUIET_S = 2, 3
TOKEN = "hook-token-" + uuid.uuid4().hex[:8]
POSTABLE_KEYS = {"labels", "annotations", "startsAt", "endsAt"}  # Alertmanager API v2 PostableAlert (+generatorURL)


class Receiver:
    """Records every POST (path, headers, JSON body or None for another
    type, time received), and its raw bytes (``raw``: path, body as sent)."""

    def __init__(self):
        self.posts: list[tuple[str, dict, object, float]] = []
        self.raw: list[tuple[str, bytes]] = []
        lock = threading.Lock()
        posts, raw = self.posts, self.raw

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                sent = self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    raw.append((self.path, sent))
                    body = json.loads(sent) if "json" in self.headers.get("Content-Type", "") else None
                    posts.append((self.path, dict(self.headers), body, time.time()))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self, path: str) -> list[bytes]:
        """The raw bodies POSTed to ``path``."""
        return [body for p, body in list(self.raw) if p == path]

    def alertmanager(self) -> list[tuple[dict, float]]:
        return [(a, t) for path, _, body, t in list(self.posts) if path == "/api/v2/alerts" for a in body]

    def close(self):
        self.server.shutdown()


@pytest.fixture(scope="module")
def notified(stack, tmp_path_factory):
    receiver = Receiver()
    token = tmp_path_factory.mktemp("secret") / "token"
    token.write_text(TOKEN)
    worker = stack.start_worker_with(
        JITTERSCOPE_ALERTMANAGER_URL=receiver.url, JITTERSCOPE_WEBHOOK_URL=f"{receiver.url}/hook",
        JITTERSCOPE_WEBHOOK_TOKEN_FILE=str(token), JITTERSCOPE_ALERT_GROUP_WINDOW_S=str(WINDOW_S),
        JITTERSCOPE_ALERT_GROUP_QUIET_S=str(QUIET_S), JITTERSCOPE_RUNQ_ALERT_MS="10")
    stack.start_collector(JITTERSCOPE_TARGET_COMMS=f'["{VICTIM_COMM}*"]', JITTERSCOPE_TARGET_RESCAN_S="0.2")
    yield stack, worker, receiver
    receiver.close()


# A hog that holds its CPU in bursts at real-time priority: every burst makes
# the victim (which wakes every 2-3 ms) wait until it ends, whatever else
# runs there, so alerts repeat many times a window -- the premise of "repeats
# are folded". CFS hogs alone make 10 ms waits rare on this kernel (EEVDF):
# on a quiet box a run could raise one alert, and one alert has nothing to
# fold. Bursts of 30 ms in every 50: real-time throttling (95%) never starts.
_RT_BURSTS = """import ctypes, os, sys, time
ctypes.CDLL(None).prctl(15, {name!r}.encode(), 0, 0, 0)
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    print("fifo", flush=True)
except OSError as exc:
    print("no real-time priority:", exc, flush=True)
end = time.monotonic() + {seconds}
while time.monotonic() < end:
    burst = time.monotonic() + 0.030
    while time.monotonic() < burst:
        pass
    time.sleep(0.020)
"""


@contextmanager
def rt_bursts(seconds: float):
    """The bursting hog on the victims' CPU; yields whether it got real-time priority."""
    cpu = last_cpu()
    hog = subprocess.Popen([sys.executable, "-c", _RT_BURSTS.format(name=HOG_COMM, seconds=seconds)],
                           stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    try:
        yield hog.stdout.readline().strip() == "fifo"
    finally:
        hog.kill()
        hog.wait()


def repeats_within(times_ns: list[int], window_s: float) -> bool:
    """Three alerts of a group raised within ``window_s``: then at least two
    share an announcement (announcements are a window apart), so fewer
    notifications than alerts go out."""
    return any(times_ns[i + 2] - times_ns[i] < window_s * 1e9 for i in range(len(times_ns) - 2))


def seconds(ts: str) -> float:
    return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def test_grouped_alerts_reach_alertmanager_and_resolve_when_the_hogs_stop(notified):
    stack, worker, receiver = notified
    with rt_bursts(seconds=7.5) as bursting, starvation(seconds=6, hogs=3, delay=1.0) as victim:
        pass

    def ours():
        return [(a, t) for a, t in receiver.alertmanager() if a["labels"].get("pid") == str(victim.pid)]

    def resolved(a, t):  # endsAt in the past = resolved
        return seconds(a["endsAt"]) <= t + 1

    def by_group(posted) -> dict[str, list]:
        """label set (the group's identity) -> its posts in the order received"""
        groups: dict[str, list] = {}
        for a, t in sorted(posted, key=lambda p: p[1]):
            groups.setdefault(json.dumps(a["labels"], sort_keys=True), []).append((a, t))
        return groups

    def all_resolved():  # the victim has exited: every group ends with its resolution
        posted = ours()
        groups = by_group(posted)
        return posted if groups and all(resolved(*g[-1]) for g in groups.values()) else None

    posted = wait_until(all_resolved, 90, "firing and resolved alerts for the victim at the receiver", worker)
    for a, _ in posted:
        assert POSTABLE_KEYS <= set(a) and {"summary", "remedy", "count", "worst_ms"} <= set(a["annotations"])
        assert a["labels"]["alertname"] == "runq_starvation" and a["labels"]["comm"] == VICTIM_COMM
        assert a["labels"]["host"] == stack.env["JITTERSCOPE_HOST"] and a["labels"]["severity"]
    assert any(a["labels"].get("suspect") == HOG_COMM for a, _ in posted), "a hog named as suspect"

    # grouped: an episode of a group (up to its resolution; a group quiet for QUIET_S and firing again
    # is a new one) is one first announcement, at most one more per window, then one resolution
    episodes = []
    for group in by_group(posted).values():
        episode = []
        for a, t in group:
            episode.append((a, t))
            if resolved(a, t):
                episodes.append(episode)
                episode = []
        assert not episode, "every episode ends with its resolution"
    for episode in episodes:
        firing = [t for a, t in episode[:-1]]
        assert firing and not any(resolved(a, t) for a, t in episode[:-1]), episode
        assert len(firing) <= math.ceil((max(firing) - min(firing)) / WINDOW_S) + 2, episode
    # nothing lost: the resolutions count every alert the store holds for the victim
    resolved_count = sum(int(e[-1][0]["annotations"]["count"]) for e in episodes)
    stored = wait_until(lambda: (n := stack.query(
        "SELECT countIf(evidence['state'] != 'resolved'), countIf(evidence['state'] = 'resolved') "
        "FROM jitterscope.alerts FINAL WHERE pid = {pid:UInt32}", pid=victim.pid)[0]) == [resolved_count,
                                                                                          len(episodes)] and n,
        30, f"{resolved_count} alerts and {len(episodes)} resolutions stored", worker)
    firing_posts = len(posted) - len(episodes)
    assert firing_posts <= stored[0], "each announcement carries at least one new alert"
    # folded: where the kernel gave a group repeats within a window (by the time the worker raised
    # them, less a margin for the moment it grouped them), they were not each sent
    raised: dict[tuple, list[int]] = {}
    for kind, suspect, at in stack.query(
            "SELECT kind, suspect_comm, toUnixTimestamp64Nano(raised) FROM jitterscope.alerts FINAL "
            "WHERE pid = {pid:UInt32} AND evidence['state'] != 'resolved' ORDER BY 3", pid=victim.pid):
        raised.setdefault((kind, suspect), []).append(int(at))
    repeated = any(repeats_within(times, WINDOW_S - 0.5) for times in raised.values())
    assert repeated or not bursting, f"real-time bursts made no repeats: {raised}"
    if repeated:
        assert firing_posts < stored[0], "repeats were folded, not each sent"

    # the alerts topic carries the same grouped stream, and its readers (`up`) can decode every record
    on_topic = [a for a in alerts_on_topic(stack) if a.pid == victim.pid]
    assert len(on_topic) == len(posted)
    assert sum(a.evidence["state"] == "resolved" for a in on_topic) == len(episodes)

    hook = [(h, body) for path, h, body, _ in list(receiver.posts) if path == "/hook"]
    items = [i for _, body in hook for i in body["alerts"] if i["alert"]["pid"] == victim.pid]
    assert len(items) == len(posted) and {i["state"] for i in items} == {"firing", "resolved"}
    assert all(h["Authorization"] == f"Bearer {TOKEN}" for h, _ in hook)
    assert TOKEN not in worker.text(), "the token is never logged"
    print(f"\n[measured] victim: {stored[0]} alerts stored in {len(by_group(posted))} group(s), "
          f"{len(episodes)} episode(s); {firing_posts} firing + {len(episodes)} resolved notifications")


def alerts_on_topic(stack) -> list[events.Alert]:
    return records_on_topic(stack.broker.bootstrap_servers, topics.ALERTS, events.Alert)


def burst(stack, host: str, victims: int = 200, per_victim: int = 10) -> float:
    """Seconds from sending ``victims`` x ``per_victim`` alerting run-queue
    waits (distinct victims: each its own alert group) to all of them stored."""
    publisher = KafkaPublisher(stack.broker.bootstrap_servers, host)
    publisher.check_reachable()
    now = time.time_ns()
    head = lambda seq: dict(host=host, boot_id="burst", seq=seq, ts_ns=now + seq)  # noqa: E731
    publisher.send(topics.TOPOLOGY, [events.Topology(**head(1), cpus=[0, 1], numa_nodes=[])])
    publisher.send(topics.PROCESSES, [events.ProcessInfo(**head(1 + v), pid=1000 + v, comm="engine", cmdline="",
                                                         cgroup="/", cpus_allowed=[0], serving_group=1000 + v)
                                      for v in range(victims)])  # serving: their waits are announced
    publisher.flush()
    wait_until(lambda: stack.query("SELECT count() FROM jitterscope.processes WHERE host = {h:String}",
                                   h=host)[0][0] == victims, 60, "the burst's processes stored")
    waits = [events.RunqEvent(**head(10_000 + i), pid=1000 + i % victims, tid=1000 + i % victims, comm="engine",
                              cpu=0, wait_ns=15_000_000, suspect_pid=7, suspect_tid=7, suspect_comm="tar")
             for i in range(victims * per_victim)]
    started = time.monotonic()
    publisher.send(topics.RUNQ, waits)
    assert publisher.flush() == 0
    publisher.close()
    wait_until(lambda: stack.query("SELECT count() FROM jitterscope.runq_events FINAL WHERE host = {h:String}",
                                   h=host)[0][0] == len(waits), 60, f"{len(waits)} runq events stored")
    return time.monotonic() - started


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_a_dead_receiver_does_not_slow_the_stream(notified):
    stack, worker, receiver = notified
    live_s = burst(stack, f"live-{uuid.uuid4().hex[:6]}")

    hung = socket.socket()  # accepts connections and never answers
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    accepted = []
    threading.Thread(target=lambda: [accepted.append(hung.accept()) for _ in iter(int, 1)], daemon=True).start()
    refused = free_port()  # nothing listens there
    worker.stop()
    worker = stack.start_worker_with(
        JITTERSCOPE_ALERTMANAGER_URL=f"http://127.0.0.1:{hung.getsockname()[1]}",
        JITTERSCOPE_WEBHOOK_URL=f"http://127.0.0.1:{refused}/hook", JITTERSCOPE_NOTIFY_QUEUE_MAX="10",
        JITTERSCOPE_NOTIFY_TIMEOUT_S="60", JITTERSCOPE_ALERT_GROUP_WINDOW_S=str(WINDOW_S),
        JITTERSCOPE_ALERT_GROUP_QUIET_S=str(QUIET_S))
    try:
        dead_s = burst(stack, f"dead-{uuid.uuid4().hex[:6]}")
        assert accepted, "the worker did reach the hung receiver"
        dropped = wait_until(lambda: metric(stack.web_port, "jitterscope_streams_notifications_dropped_total"
                                                            '{target="alertmanager"}'), 30, "dropped count", worker)
        assert dropped > 0 and metric(stack.web_port, "jitterscope_streams_notifications_sent_total") == 0
        assert metric(stack.web_port, 'jitterscope_streams_notifications_dropped_total{target="webhook"}') > 0
        print(f"\n[measured] burst of 2000 alerting waits stored in {live_s:.1f} s with a live receiver, "
              f"{dead_s:.1f} s with a hung one ({dropped:.0f} alertmanager notifications dropped)")
    finally:
        worker.stop()
        hung.close()
