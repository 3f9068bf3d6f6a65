# SPDX-License-Identifier: Apache-2.0
"""`jitterscope up`: the whole single-host stack, supervised.

Starts the embedded broker (unless a Kafka is given), the streams pipeline in
two processes -- its judge stage (the alert rules, nothing else on its loop)
and its attribute-store stage (requests joined with kernel evidence, and
ClickHouse), streams/stages.py -- and the collector as child processes,
prints each alert as it arrives, and on Ctrl-C (or --duration) stops them in
the order that loses nothing: the collector first (it flushes and writes what
Kafka acknowledged, per topic, to collector-final.json), then the judge once
its /metrics say it has read that many records of each topic it reads (it
writes what it published to judge-final.json), then the store once it has
stored (or dead-lettered) at least that many records of every topic and the
judge's alert rows (a fleet's attribution stage, run apart, leaves its own
final file, counted the same way) -- or drain_timeout_s passed -- then the broker,
which keeps data in memory only.
Counts, not a fixed wait: a worker that lags under a storm needs minutes,
an idle one none.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from rich.console import Console

from jitterscope.alert_lines import format_alert
from jitterscope.common import errors
from jitterscope import topic_admin
from jitterscope.broker import EmbeddedBroker, free_port, wait_for_port
from jitterscope.collector.pacing import confine
from jitterscope.common import kafka_auth, ports
from jitterscope.common.logs import printable
from jitterscope.common.private import open_private, private_dir
from jitterscope.query import dial_host
from jitterscope.schemas import batches, events, topics
from jitterscope.common.settings import FINAL_FILE, Settings, default_data_dir, to_env
# what `up` reads on its stages' /metrics (cli/stage_metrics.py), named here as before
from jitterscope.stage_metrics import (ACCOUNTED, ALERT_DELAY, DECODED, alert_delay_line,  # noqa: F401
                                       histogram_quantile, parse_accounted, parse_histograms, parse_per_topic)

#: what the judge and attribution stages published, written as each exits (streams/app.py's
#: STAGE_FINAL_FILES: the front door imports no streams module, which a collector-only install lacks)
STAGE_FINAL_FILES = {"judge": "judge-final.json", "attribute": "attribute-final.json"}
JUDGE_FINAL_FILE = STAGE_FINAL_FILES["judge"]
POLL_S = 0.5
#: without the collector's final counts (it crashed), the worker is taken as
#: done once its counts stood still this long: longer than a sink flush and
#: an insert under load
QUIET_S = 5.0
#: how long `up` waits for the collector's probes before it says "watching"
#: anyway (a first BPF compile on a busy 2-core box takes a minute)
COLLECTOR_START_S = 300.0
#: how long `up` waits for the worker to read the collector's first records
#: before it says "watching" anyway
WORKER_READS_S = 60.0
#: the old fixed wait, for a worker that cannot say what it stored
BLIND_DRAIN_S = 3.0


def niced(nice: int) -> list[str]:
    """The argv prefix that starts a process at niceness ``nice`` ([] for 0): coreutils' nice sets it before
    the exec, so every thread the process starts has it (a renice after the start misses threads already made)."""
    return ["nice", "-n", str(nice)] if nice else []


# -- drain on stop: pure parts ------------------------------------------------

def read_final(path: Path) -> dict | None:
    """The collector's final counts, or None when it left none (crashed,
    killed) or they are unreadable."""
    try:
        final = json.loads(path.read_text())
        return {**final, "sent_by_topic": {str(t): int(n) for t, n in final["sent_by_topic"].items()},
                "undelivered": int(final.get("undelivered", 0)), "spooled": int(final.get("spooled", 0))}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def self_cost_line(path: Path) -> str | None:
    """The collector's cost on this host over its last run, from its final
    file (collector/selfcost.py), as one line; None when it left none."""
    from jitterscope.collector.selfcost import format_cost

    try:
        cost = json.loads(path.read_text()).get("self_cost")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(cost, dict):
        return None
    try:
        return format_cost(cost)
    except (TypeError, ValueError):
        return None


def unstored(sent: dict[str, int], accounted: dict[str, int]) -> dict[str, int]:
    """Per topic, records Kafka acknowledged that the worker has not stored
    yet. ``>=`` is done: a shared Kafka may hold records of earlier runs."""
    return {t: n - accounted.get(t, 0) for t, n in sorted(sent.items()) if accounted.get(t, 0) < n}



def has_earlier_store(s: Settings) -> bool:
    """Whether the embedded store already holds jitterscope's database: a
    store outlives the checkout that made it (/var/lib/jitterscope), and
    queries and reports then read the earlier runs' records too."""
    return s.clickhouse_url is None and (s.data_dir / "clickhouse" / "metadata" / "jitterscope.sql").exists()

class Quiet:
    """Done when counts stood still for ``quiet_s`` (times passed in, for tests)."""

    def __init__(self, quiet_s: float):
        self.quiet_s = quiet_s
        self.last: dict | None = None
        self.since = 0.0

    def settled(self, counts: dict, now: float) -> bool:
        if counts != self.last:
            self.last, self.since = dict(counts), now
            return False
        return now - self.since >= self.quiet_s


class Stack:
    def __init__(self, settings: Settings, console: Console):
        self.settings = settings
        self.console = console
        self.children: dict[str, subprocess.Popen] = {}
        self.broker: EmbeddedBroker | None = None
        self.delay_line: str | None = None  # the worker's alert delay, read as it stops

    def _spawn(self, name: str, args: list[str], bootstrap: str, nice: int = 0) -> None:
        # this process's tree (broker, worker, collector) is jitterscope's own: never a victim, a labelled suspect
        # (a literal, not dict(**...): to_env names every setting, own_tree_pid too, and these override it)
        env = {**os.environ, **to_env(self.settings), "JITTERSCOPE_BOOTSTRAP_SERVERS": bootstrap,
               "JITTERSCOPE_OWN_TREE_PID": str(os.getpid())}
        env.pop("JITTERSCOPE_CONFIG", None)  # everything is resolved into the env already
        log = os.fdopen(open_private(self.settings.data_dir / f"{name}.log", append=True), "ab")
        # -P: `python -m` puts the caller's working directory first on sys.path, and a jitterscope/cli/ planted
        # there (cd /tmp && jitterscope up) ran as root. The cwd stays the caller's: relative paths in the
        # settings (--data-dir data) are passed through as given, and with -P it is no longer an import path.
        self.children[name] = subprocess.Popen(
            [*niced(nice), sys.executable, "-P", "-m", "jitterscope.cli", *args], env=env, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)

    def _wait_for_collector(self, timeout_s: float = COLLECTOR_START_S) -> None:
        """Until the collector's probes are loaded and its OTLP receiver
        listens (it opens once they are): "watching" printed before that sent
        a user's first spans into a refused connection and missed the first
        waits. Without a receiver, its log's start line says it."""
        s, deadline = self.settings, time.monotonic() + timeout_s
        log = s.data_dir / "collector.log"
        host = "127.0.0.1" if s.otlp_bind in ("", "0.0.0.0", "::") else s.otlp_bind
        while time.monotonic() < deadline:
            self._check_children()
            if s.otlp_port:
                try:
                    with socket.create_connection((host, s.otlp_port), timeout=0.5):
                        return
                except OSError:
                    pass
            elif "collector started" in log.read_text(errors="replace"):
                return
            time.sleep(0.1)
        self.console.print(f"the collector is still starting after {timeout_s:.0f} s (compiling BPF); see {log}",
                           style="yellow", markup=False)

    def _wait_for_worker_reading(self, timeout_s: float = WORKER_READS_S) -> None:
        """Until the worker has read the collector's topology (its first
        record): a worker still joining its group or finding its offsets held
        every record behind that, and a storm in the first second after
        "watching" had its first alerts 0.3-0.7 s late (bench/alert_delay.py)."""
        waiting = {p for name, p, _family in self._stages() if p and name in self.children}
        deadline = time.monotonic() + timeout_s
        while waiting and time.monotonic() < deadline:
            self._check_children()
            for port in list(waiting):  # the judge (alerts), the attribution and the store alike
                text = self._metrics(timeout=2, port=port)
                if text and (parse_per_topic(text, DECODED) or {}).get(topics.TOPOLOGY, 0) > 0:
                    waiting.discard(port)
            if not waiting:
                return
            time.sleep(0.1)
        self.console.print(f"the streams worker has not read the collector's first records after {timeout_s:.0f} s; "
                           f"alerts wait until it does; see {self.settings.data_dir / 'streams.log'}",
                           style="yellow", markup=False)

    def _check_children(self) -> None:
        for name, proc in self.children.items():
            if proc.poll() is not None:
                tail = (self.settings.data_dir / f"{name}.log").read_text(errors="replace").strip().splitlines()[-5:]
                raise errors.JitterscopeError(
                    f"{name} exited with status {proc.returncode}; last lines of "
                    f"{self.settings.data_dir / (name + '.log')}:\n  " + "\n  ".join(map(printable, tail)))

    def listeners(self) -> list[ports.Listener]:
        """Every port this stack's processes listen on (0: off, or any free one)."""
        s = self.settings
        broker = [] if s.bootstrap_servers else [ports.broker_listener(s.broker_port)]
        return [*broker, *ports.judge_listeners(s), *ports.attribute_listeners(s), *ports.streams_listeners(s),
                *ports.collector_listeners(s)]

    def _stages(self) -> list[tuple[str, int, str]]:
        """The streams processes in the order they stop (name, web port, what
        their drain counts): the judge and the attribution stage first, so
        that once stopped they have published everything the store then stores."""
        s = self.settings
        return [("judge", s.judge_web_port, DECODED), ("streams", s.streams_web_port, ACCOUNTED)]

    def start(self) -> str:
        s = self.settings
        confine(s.own_cpus)  # jitterscope's own CPUs: the broker, worker and collector it starts inherit them
        # all of them before anything starts: a second `up` on this host (or
        # anything else on a port of ours) is one line per port, not a worker
        # and a collector that die with a traceback after "watching"
        ports.require_free(*self.listeners())
        if s.up_stages:  # `up` reads the stages' /metrics (their drain): any free port, never a fixed one
            s = self.settings = s.model_copy(update={"judge_web_port": s.judge_web_port or free_port()})
        earlier = has_earlier_store(s)
        private_dir(s.data_dir)  # the store and the query token live here
        with self.console.status("starting jitterscope") as status:
            if s.bootstrap_servers:
                bootstrap = s.bootstrap_servers
                status.update(f"checking Kafka at {bootstrap}")
                topic_admin.create(s)
                topic_admin.require(s)  # an existing topic with another partition count: say so now
            else:
                status.update("starting the embedded broker")
                self.broker = EmbeddedBroker(s.broker_port, s.data_dir / "broker.log", s.kafka_partitions).start()
                bootstrap = self.broker.bootstrap_servers
            status.update("starting the streams judge, store and ClickHouse")
            # the judge apart: nothing the store or attribution do can stall an alert (streams/stages.py). The
            # attribution shares the store's process: on one host a third process decoding every record again
            # made jitterscope's own processes the demo's main culprit (a fleet runs `--stage attribute` apart)
            if s.up_stages:
                self._spawn("judge", ["streams", "--stage", "judge"], bootstrap)
            # attribution and storing wait well; with up_stages, the judge's alerts never wait behind them
            self._spawn("streams", ["streams", "--stage", "attribute-store" if s.up_stages else "all"], bootstrap,
                        s.up_background_nice if s.up_stages else 0)
            for name, port, _family in self._stages():
                if port and name in self.children:
                    wait_for_port(port, 60, self.children[name])
            status.update("starting the collector (compiling BPF)")
            # an earlier run's counts would make the drain compare against them
            for stale in (FINAL_FILE, *STAGE_FINAL_FILES.values()):
                (s.data_dir / stale).unlink(missing_ok=True)
            self._spawn("collector", ["collector"], bootstrap)
            self._wait_for_collector()
            status.update("waiting for the streams worker to read the collector's first records")
            self._wait_for_worker_reading()
        target = "all processes" if not s.filters_targets else f"pids {s.target_pids} comms {s.target_comms}"
        spans = f"request spans to http://{s.otlp_bind}:{s.otlp_port}/v1/traces; " if s.otlp_port else ""
        self.console.print(
            f"jitterscope up: watching {target} on {s.host} for run-queue waits >= {s.runq_alert_ms:g} ms "
            f"and {', '.join(s.hardware_probes) or 'no hardware sources'}; {spans}"
            f"Kafka {bootstrap}; logs in {s.data_dir}. Ctrl-C stops.", soft_wrap=True)
        if earlier:
            self.console.print(f"note: the store in {s.data_dir} has earlier runs' records too, and queries and "
                               f"reports read them all; --data-dir DIR starts an empty one", soft_wrap=True)
        return bootstrap

    def _alert_consumer(self, bootstrap: str):
        from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, TopicPartition

        from jitterscope.collector.publish import client_logger

        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"jitterscope-up-{os.getpid()}",
                             "enable.auto.commit": False, **kafka_auth.librdkafka_config(self.settings),
                             "logger": client_logger(),  # a broker that goes away: a line a minute, not a flood
                             # Tansu holds a fetch for the whole wait: keep alerts prompt
                             "fetch.wait.max.ms": self.settings.kafka_fetch_max_wait_ms})
        # assign() instead of subscribe(): no group join to wait for. The embedded
        # broker is new, so all its alerts are ours; on a shared Kafka, only new ones.
        start = OFFSET_END if self.settings.bootstrap_servers else OFFSET_BEGINNING
        consumer.assign([TopicPartition(topics.ALERTS, p, start) for p in range(self.settings.kafka_partitions)])
        return consumer

    def run(self, duration: float | None) -> None:
        stop = {"now": False}
        signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
        # Ctrl-C (SIGINT) stops it however it was started: Python leaves SIGINT
        # ignored when the parent ignored it, as a shell does for a background job
        # (`jitterscope up &`, nohup); `kill -INT` then did nothing at all.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        decoder = batches.BatchDecoder(events.Alert)
        alerts = 0
        try:
            bootstrap = self.start()
            consumer = self._alert_consumer(bootstrap)
            deadline = time.monotonic() + duration if duration else None
            try:
                while not stop["now"] and (deadline is None or time.monotonic() < deadline):
                    message = consumer.poll(0.5)
                    self._check_children()
                    if message is None or message.error():
                        continue
                    good, _bad = decoder.decode(message.value())
                    for alert in good:
                        alerts += 1
                        style = "bold red" if alert.severity == "critical" else "yellow"
                        # markup off: process names are untrusted and may contain [tags]
                        self.console.print(format_alert(alert), style=style, markup=False, soft_wrap=True)
            finally:
                consumer.close()
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
        where = "" if self.settings.data_dir == default_data_dir() else f" --data-dir {self.settings.data_dir}"
        self.console.print(f"jitterscope stopped: {alerts} alert line(s) shown above (every alert raised is in the "
                           f"store, the delay line counts them). Query the store with: jitterscope query{where} "
                           "\"SELECT count() FROM jitterscope.runq_events\"", soft_wrap=True)
        if cost := self_cost_line(self.settings.data_dir / FINAL_FILE):
            self.console.print(cost, markup=False, soft_wrap=True)
        if self.delay_line:
            self.console.print(self.delay_line, markup=False, soft_wrap=True)

    def stop(self) -> None:
        with self.console.status("stopping") as status:
            collector = self.children.get("collector")
            draining, delays = collector is not None, []
            if collector is not None:
                status.update("stopping the collector (it sends what it holds)")
                _terminate(collector)
            # the judge first: stopped, it has published every alert row the store must then store
            for name, port, family in self._stages():
                if (proc := self.children.get(name)) is None:
                    continue
                if draining:
                    try:
                        self._drain(status, proc, port, family)
                    except KeyboardInterrupt:  # a second Ctrl-C: the operator wants out now
                        self.console.print("drain interrupted: records not stored yet are lost", style="bold red")
                        draining = False
                if port and (text := self._metrics(timeout=3, port=port)):
                    delays.append(text)
                status.update(f"stopping the streams {'store' if name == 'streams' else name}")
                _terminate(proc)
            self.delay_line = alert_delay_line("\n".join(delays)) if delays else None
            if self.broker:
                self.broker.stop()

    def _metrics(self, timeout: float = 10, port: int | None = None) -> str | None:
        """A stage's /metrics text (default: the store's); None while it does not answer (busy)."""
        from jitterscope.query import WORKER_HTTP  # our own worker: no proxy, no redirects

        host = dial_host(self.settings.streams_web_bind)
        try:
            with WORKER_HTTP.open(f"http://{host}:{port or self.settings.streams_web_port}/metrics",
                                  timeout=timeout) as r:
                return r.read().decode()
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def _counts(self, port: int, family: str) -> dict[str, int] | None:
        """A stage's per-topic counts (``family``); {} while it does not answer (busy)."""
        text = self._metrics(port=port)
        try:
            return {} if text is None else parse_per_topic(text, family)
        except ValueError:
            return {}

    def _to_drain(self, family: str, first: dict[str, int]) -> dict[str, int] | None:
        """What a stage must have counted before it may stop: the collector's
        sent records, of the topics the judge reads (``first``: its counts,
        one per topic it reads); for the store, also the judge's alert rows."""
        final = read_final(self.settings.data_dir / FINAL_FILE)
        if final is None:
            return None
        sent = final["sent_by_topic"]
        if family == DECODED:
            return {t: n for t, n in sent.items() if t in first}
        published = dict(sent)
        for name in STAGE_FINAL_FILES.values():
            try:
                final = json.loads((self.settings.data_dir / name).read_text())
                counts = {topics.ALERT_ROWS: int(final["alert_rows"]),
                          topics.ATTRIBUTION: int(final.get("attributions", 0))}
            except (OSError, ValueError, KeyError, TypeError):
                continue  # no such stage, or it left no count: what it published is not waited for
            for topic, n in counts.items():
                published[topic] = published.get(topic, 0) + n
        return published

    def _drain(self, status, worker: subprocess.Popen, port: int, family: str = ACCOUNTED) -> None:
        """Wait until a stage read (the judge) or stored what the collector sent; print what it did not."""
        s, say = self.settings, self.console.print
        first = self._counts(port, family) if port else None
        if first is None:
            say(f"the streams worker does not report what it stored; giving it {BLIND_DRAIN_S:g} s", style="yellow")
            time.sleep(BLIND_DRAIN_S)
            return
        sent = self._to_drain(family, first)
        if sent is None:
            say("the collector left no final counts (did it crash? see collector.log): waiting until the "
                f"worker's stored counts stand still for {QUIET_S:g} s", style="yellow", soft_wrap=True)
        total = sum(sent.values()) if sent else 0
        doing = "judging" if family == DECODED else "storing"  # the judge: silent once done, as before the split
        quiet, deadline, why = Quiet(QUIET_S), time.monotonic() + s.drain_timeout_s, None
        accounted: dict[str, int] = {}
        while why is None:
            if worker.poll() is not None:
                why = f"the streams worker exited with status {worker.returncode}"
                break
            accounted = self._counts(port, family) or accounted
            if sent is not None:
                left = unstored(sent, accounted)
                status.update(f"{doing}: {total - sum(left.values()):,} of {total:,} records")
                if not left:
                    if family != DECODED:
                        say(f"stored all {total:,} records the collector sent")
                    break
            else:
                status.update(f"{doing}: {sum(accounted.values()):,} records so far")
                if quiet.settled(accounted, time.monotonic()):
                    if family != DECODED:
                        say(f"the worker stored {sum(accounted.values()):,} records; no more arrived "
                            f"in {QUIET_S:g} s")
                    break
            if time.monotonic() >= deadline:
                why = f"gave up after {s.drain_timeout_s:g} s (drain_timeout_s)"
            else:
                time.sleep(POLL_S)
        if why and sent is not None:
            for topic, n in unstored(sent, accounted).items():
                say(f"not {'judged' if family == DECODED else 'stored'}: {n:,} of {sent[topic]:,} "
                    f"{printable(topic)} records ({why})", style="bold red", markup=False, soft_wrap=True)
        elif why:
            say(f"could not confirm that everything was {doing[:-3]}ed ({why})", style="bold red", markup=False)
        final = read_final(s.data_dir / FINAL_FILE) if family != DECODED else None
        for key, what in (("undelivered", "never reached Kafka (see collector.log)"),
                          ("spooled", "wait in the collector's on-disk spool for its next start")):
            if final and (n := final.get(key)):
                say(f"{n:,} records {what}", style="yellow", markup=False)


def _terminate(proc: subprocess.Popen, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
