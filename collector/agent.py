# SPDX-License-Identifier: Apache-2.0
"""The per-host collector: probes in, stamped and batched records out.

Kernel events carry CLOCK_MONOTONIC times; records leave with epoch ns, the
host, its boot id and a sequence number per record type. Sequences start at
the collector's start time in microseconds since boot, so a restarted
collector never reuses a (host, boot_id, seq) of its predecessor and the sink
stays idempotent without any state on disk.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import threading
import time
from pathlib import Path

from prometheus_client import start_http_server

from jitterscope.collector import hostinfo, intake, kubelet, pacing, serving_group, stacks, topology
from jitterscope.collector.clock import EpochConverter
from jitterscope.collector.metrics import (DELIVERY_ERRORS, EVENTS_READ, MAP_FULL_DROPS, OWN_WAITS_SKIPPED,
                                           PRODUCER_RESTARTS, RECORDS_SENT, RINGBUF_DROPS, SPOOL_DROPS, SPOOLED,
                                           _Exported)
from jitterscope.collector.otlp import OtlpReceiver, OtlpReceiverUnavailable
from jitterscope.collector.probes import base, registry
from jitterscope.collector.probes.interface import Probe, ProbeContext, call_each
from jitterscope.collector.publish import Batcher, KafkaPublisher, alert_worthy
from jitterscope.collector.selfcost import SelfCost
from jitterscope.collector.spool import Spool, SpoolBusy
from jitterscope.common import buildinfo, kafka_auth, ports  # noqa: F401  (buildinfo: registers jitterscope_build_info)
from jitterscope.common.logs import fields
from jitterscope.common.private import open_private, private_dir
from jitterscope.schemas import events, topics
from jitterscope.common.settings import FINAL_FILE, Settings

log = logging.getLogger("jitterscope.collector")

PROCESS_REFRESH_NS = 60_000_000_000  # re-publish a process's metadata at most this often
MID_EXEC_RETRY_NS = 1_000_000_000  # a process read with no command line yet: described again after this


class Stamp:
    """host, boot id, per-type sequence numbers, epoch time."""

    def __init__(self, host: str, proc: Path = Path("/proc")):
        self.host = host
        self.boot_id = hostinfo.boot_id(proc)
        self.clock = EpochConverter()
        self.started_ns = time.time_ns()
        self._seq_start = time.monotonic_ns() // 1000
        self._seq: dict[type, int] = {}

    def header(self, kind: type, ts_ns: int) -> dict:
        seq = self._seq.get(kind, self._seq_start)
        self._seq[kind] = seq + 1
        return {"host": self.host, "boot_id": self.boot_id, "seq": seq, "ts_ns": ts_ns}


def make_spool(settings: Settings) -> Spool | None:
    """The host's spool under the data dir (its own subdirectory: the data
    dir may be shared with the worker's chDB, or among test collectors)."""
    if not settings.spool_max_mb:
        return None
    directory = Path(settings.data_dir) / "spool" / re.sub(r"[^A-Za-z0-9._-]", "_", settings.host)
    try:
        return Spool(directory, settings.spool_max_mb << 20)
    except (SpoolBusy, OSError) as exc:
        log.error("spool unavailable: records Kafka cannot take will be dropped (and counted)",
                  extra=fields(error=str(exc)))
        return None


class Collector:
    def __init__(self, settings: Settings, publisher: KafkaPublisher | None = None,
                 proc: Path = Path("/proc"), sys: Path = Path("/sys")):
        self.settings = settings
        self.proc, self.sys = hostinfo.host_roots(settings.host_root, proc, sys)  # the host's, seen from here
        self.kubelet = kubelet.from_settings(settings)  # pod names and namespaces, when a kubelet is reachable
        self.stamp = Stamp(settings.host, self.proc)
        self.publisher = publisher or KafkaPublisher(
            settings.bootstrap_servers or "", settings.host, kafka_auth.librdkafka_config(settings),
            idempotence=settings.kafka_idempotence,
            max_message_bytes=settings.kafka_max_message_bytes, max_records=settings.batch_max_records,
            spool=make_spool(settings))
        self._export = _Exported()
        self.batcher = Batcher(settings.batch_max_records, settings.batch_max_delay_ms * 1_000_000,
                               urgent=alert_worthy(settings))
        self._processes_sent: dict[int, int] = {}  # pid -> monotonic ns of last publish
        self._sent_as, self._comms = {}, {}  # pid -> the (cpu cgroup, name) its last record said; pid -> name
        self._stop, self._reported_losses = threading.Event(), (0, 0)  # (ringbuf, map-full) drops already logged
        self.probes: list[Probe] = []  # the open signals, registry order (runq first)
        self.topology: events.Topology | None = None
        self.otlp: OtlpReceiver | None = None
        self.cost: SelfCost | None = None  # what watching costs the host
        self.intake = intake.Intake(settings)  # spans from the OTLP threads, heads and targets: all bounded
        self._serving_pids: set[int] = set()  # processes that sent request spans
        # member pid -> the span process whose serving group it is in
        # (collector/serving_group.py); re-found at each target rescan
        self._group_of: dict[int, int] = {}
        # jitterscope's own processes (this collector; under `up` its whole
        # tree): never victims, labelled as suspects. Updated in place: the
        # probes hold this very set
        self.own: dict[int, str] = {os.getpid(): "collector"}

    # -- records ---------------------------------------------------------
    def _queue(self, record: events.Record) -> None:
        pacing.point()  # every record published is one item of some loop: none of them runs long (pacing.py)
        for topic, batch in self.batcher.add(record):
            self.publisher.send(topic, batch)

    def publish_topology(self) -> None:
        self.topology_fields = topology.read_topology(self.sys, self.proc)
        self.topology = events.Topology(**self.stamp.header(events.Topology, time.time_ns()), **self.topology_fields)
        self._queue(self.topology)

    def describe_process(self, pid: int) -> None:
        """Publish a process's metadata the first time it is reported on, and
        again after PROCESS_REFRESH_NS."""
        if pid <= 0:
            return
        now = time.monotonic_ns()
        if now - self._processes_sent.get(pid, -PROCESS_REFRESH_NS) < PROCESS_REFRESH_NS:
            return
        self._processes_sent[pid] = now
        try:
            info = hostinfo.process_info(pid, self.proc, self.kubelet)
        except hostinfo.ProcessGone:
            self._sent_as.pop(pid, None)
            return
        if not info["cmdline"] and info["ppid"] not in (0, 2):  # caught mid-exec (a kernel thread's parent is 2)
            self._processes_sent[pid] = now - PROCESS_REFRESH_NS + MID_EXEC_RETRY_NS  # described again soon
        self._comms[pid] = info["comm"]
        self._sent_as[pid] = (info["cgroup"], info["comm"])
        gpus, cuda_visible = topology.process_gpus(pid, self.proc, self.topology)
        info = {**info, "serving_group": self._group_of.get(pid, 0)}
        self._queue(events.ProcessInfo(**self.stamp.header(events.ProcessInfo, time.time_ns()), **info,
                                       gpus=gpus, cuda_visible_devices=cuda_visible))

    def take_requests(self) -> None:
        """Stamp and queue the request spans the OTLP receiver handed over.
        A serving process becomes a probe target when targets are filtered:
        its requests cannot be explained without its threads' waits."""
        new_pids = False
        for sender, batch in self.intake.take():
            for span in batch:
                self._queue(events.RequestSpan(**self.stamp.header(events.RequestSpan, span["end_ns"]), **span))
                pid = span["pid"]
                if pid and pid not in self._serving_pids and self.intake.admit_head(pid, sender):
                    self._serving_pids.add(pid)
                    new_pids = True
        if new_pids:  # finds the new groups, describes their members, retargets the probes
            self.update_targets()

    def publish_histograms(self, interval_ns: int) -> None:
        """Every signal's periodic records (histograms, counters) for the
        interval that ends now; then forget the processes that exited."""
        now = time.time_ns()
        for records in call_each(self.probes, "periodic", lambda p: p.periodic(interval_ns, now)):
            for record in records:
                self._queue(record)
        gone = {pid for pid in pacing.paced(list(self._processes_sent)) if not (self.proc / str(pid)).exists()}
        if gone:
            call_each(self.probes, "forget", lambda p: p.forget(gone))
            for pid in gone:
                self._processes_sent.pop(pid, None)
                self._comms.pop(pid, None)

    def _comm(self, pid: int) -> str:
        """The process's name now (processes rename themselves after start,
        so a cached name may be stale); the last one known if it has exited."""
        try:
            self._comms[pid] = (self.proc / str(pid) / "comm").read_text().strip()
        except (FileNotFoundError, ProcessLookupError):
            pass
        return self._comms.get(pid, "")

    def ringbuf_drops(self) -> int:
        return sum(probe.drops() for probe in self.probes)

    def map_full_drops(self) -> int:
        return sum(probe.map_full_drops() for probe in self.probes)

    def events_read(self) -> int:
        return sum(probe.events_read for probe in self.probes)

    def report_losses(self, ringbuf: int, map_full: int) -> None:
        """One log line per stats interval in which the kernel lost events
        (the counters say how many; the streams worker alerts past a threshold)."""
        lost = (ringbuf - self._reported_losses[0], map_full - self._reported_losses[1])
        if any(lost):
            log.warning("the kernel lost events", extra=fields(
                ringbuf_drops=lost[0], map_full_drops=lost[1], ringbuf_drops_total=ringbuf,
                map_full_drops_total=map_full,
                fix="raise runq_threshold_ms or narrow the targets (--comm/--pid)"))
        self._reported_losses = (ringbuf, map_full)

    def export_metrics(self) -> None:
        p = self.publisher
        self._export(RINGBUF_DROPS, self.ringbuf_drops(), "runq")  # every probe's, under one label
        for probe in self.probes:
            if probe.events_read:
                self._export(EVENTS_READ, probe.events_read, probe.name)
        self._export(MAP_FULL_DROPS, self.map_full_drops())
        self._export(OWN_WAITS_SKIPPED, sum(getattr(probe, "own_skipped", 0) for probe in self.probes))
        self.intake.export(self._export, self.probes)
        for topic, sent in p.sent_by_topic.items():
            self._export(RECORDS_SENT, sent, topic)
        self._export(DELIVERY_ERRORS, p.delivery_errors)
        self._export(SPOOL_DROPS, p.spool_drops)
        self._export(PRODUCER_RESTARTS, p.producer_restarts)
        SPOOLED.set(p.spooled)
        if self.cost:  # self-cost: samples, then exports
            self.cost.export([bpf for probe in self.probes for bpf in probe.bcc_probes()])

    def publish_stats(self, last: bool = False) -> None:
        """``last``: after the final flush; its counts include itself (the
        ledger reads them only if it is stored, and then it was sent)."""
        drops, map_full = self.ringbuf_drops(), self.map_full_drops()
        self.report_losses(drops, map_full)
        self.export_metrics()
        p, sent = self.publisher, dict(self.publisher.sent_by_topic)
        if last:
            sent[topics.COLLECTOR_STATS] = sent.get(topics.COLLECTOR_STATS, 0) + 1
        self._queue(events.CollectorStats(
            **self.stamp.header(events.CollectorStats, time.time_ns()),
            started_ns=self.stamp.started_ns, ringbuf_drops=drops, map_full_drops=map_full,
            events_read=self.events_read(),
            records_sent=p.records_sent + last, delivery_errors=p.delivery_errors,
            spool_drops=p.spool_drops, spooled=p.spooled, producer_restarts=p.producer_restarts,
            sent_by_topic=sent, longest_run_ns=pacing.PACER.take_longest(),
            **(self.cost.record_fields() if self.cost else {}),  # self-cost, this interval
        ))

    def write_final(self) -> Path:
        """The drain contract with `up`: what this run had acknowledged per
        topic, what it never will, and what waits in the spool. Written
        atomically: a reader sees the old file or the whole new one."""
        p = self.publisher
        final = {"host": self.settings.host, "boot_id": self.stamp.boot_id,
                 "sent_by_topic": dict(p.sent_by_topic), "undelivered": p.undelivered, "spooled": p.spooled,
                 "longest_run_ns": pacing.PACER.longest_run_max,
                 "behind_own": next((p.behind_own for p in self.probes if hasattr(p, "behind_own")), {})}
        if self.cost:
            final["self_cost"] = self.cost.summary()
        path = Path(self.settings.data_dir) / FINAL_FILE
        private_dir(path.parent)
        tmp = path.with_name(f".{FINAL_FILE}.{os.getpid()}.tmp")
        with os.fdopen(open_private(tmp), "w") as out:
            out.write(json.dumps(final))
        os.replace(tmp, path)
        return path

    def serving_thresholds(self) -> dict[int, int]:
        """Processes that send request spans report finer waits: their
        requests are explained from them, and short waits add up."""
        ns = int(self.settings.serving_threshold_ms * 1_000_000)
        return {pid: ns for pid in self._group_of}

    def refresh_groups(self) -> None:
        """Re-find each span process's serving group (its children come
        and go); a process that joins or changes group is described again
        at once, so the worker learns its ``serving_group`` before its waits
        are needed for attribution; so is a watched process moved to another
        cgroup or renamed (`_changed`), so its waits are charged to its new
        quota and its requests name it as it names itself now."""
        self._serving_pids = {p for p in self._serving_pids if (self.proc / str(p)).exists()}
        self.intake.keep_heads(self._serving_pids)
        mode = self.settings.serving_group
        containers = set()
        if mode == "auto":
            for head in self._serving_pids:
                try:
                    found = hostinfo.process_info(head, self.proc).get("container_id", "")
                except hostinfo.ProcessGone:
                    continue
                if serving_group.in_container(head, self.proc, found):
                    containers.add(head)
        groups = self.intake.bound_targets(serving_group.find_groups(self._serving_pids, mode, self.proc, containers))
        changed = [pid for pid, head in groups.items() if self._group_of.get(pid) != head]
        changed += [pid for pid in self._group_of if pid not in groups]  # left: described with no group
        self._group_of = groups
        for pid in changed + self._changed():  # _changed: its throttling is its new cgroup's from now on
            self.describe_again(pid)

    def describe_again(self, pid: int) -> None:
        """Publish a process's record now, however recently it was."""
        self._processes_sent.pop(pid, None)
        self.describe_process(pid)

    def _changed(self) -> list[int]:
        """The watched processes whose cpu cgroup or name is no longer what
        their last record said: moved after they were described (``systemctl
        set-property``, ``cgclassify``, a supervisor), so the worker would
        look for their throttling in the wrong cgroup; or renamed (vLLM's
        engine is "python" at first). Watched: the serving groups' members
        and, when filtered, the targets described; two small reads each."""
        for pid in self._sent_as.keys() - self._processes_sent.keys():  # exited (publish_histograms)
            del self._sent_as[pid]
        s = self.settings
        watched = set(self._group_of)
        if s.filters_targets:
            watched |= {pid for pid in self._sent_as if pid in s.target_pids or (
                s.target_comms and hostinfo.comm_matches(self._comms.get(pid, ""), s.target_comms))}
        changed = []
        for pid in pacing.paced(sorted(watched)):
            sent = self._sent_as.get(pid)
            if sent is None:  # not described yet: its first record will say what it is then
                continue
            try:
                if (hostinfo.process_cgroup(pid, self.proc), self._comm(pid)) != sent:
                    changed.append(pid)
            except hostinfo.ProcessGone:
                continue
        return changed

    def refresh_own(self) -> None:
        """Re-find jitterscope's own processes: the tree of ``own_tree_pid``
        (a worker `up` restarts has a new pid), this collector, and the
        symbol helpers it started (collector/stacks.py)."""
        head = self.settings.own_tree_pid
        found = set(serving_group.find_groups({head}, "tree", self.proc)) if head else set()
        found.add(os.getpid())
        found.update(stacks.helper_pids())
        if found != self.own.keys():  # pid -> its role, the label it has as a suspect
            self.own.clear()
            self.own.update({pid: hostinfo.own_role(pid, head, self.proc) for pid in found})

    def update_targets(self) -> None:
        self.refresh_own()
        self.refresh_groups()
        targets, thresholds = self.current_targets(), self.serving_thresholds()
        call_each(self.probes, "set_targets", lambda p: p.set_targets(targets, thresholds))

    def open_probes(self) -> None:
        """Open every enabled signal (registry order); if one fails, close
        the ones already open and raise."""
        s = self.settings
        context = ProbeContext(
            settings=s, stamp=self.stamp, publish=self._queue, describe_process=self.describe_process,
            comm_of=self._comm, topology=self.topology_fields, targets=self.current_targets(),
            thresholds=self.serving_thresholds(), proc=self.proc, sys=self.sys, own=self.own,
            describe_again=self.describe_again)
        try:
            for probe in registry.create(registry.enabled(s)):
                probe.open(context)
                self.probes.append(probe)
        except Exception:
            self.close_probes()
            raise
        base.release_compiler_memory()

    def close_probes(self) -> None:
        for probe in reversed(self.probes):
            probe.close()
        self.probes = []

    def current_targets(self) -> set[int] | None:
        s = self.settings
        if not s.filters_targets:
            return None
        pids = set(s.target_pids) | set(self._group_of)
        if s.target_comms:
            pids |= hostinfo.pids_matching(s.target_comms, self.proc)
        return pids

    # -- loop ------------------------------------------------------------
    def stop(self, *_args) -> None:
        self._stop.set()

    def start(self, duration_s: float | None = None) -> None:
        """Before the loop: ports checked, Kafka reached, the metrics server, probes and OTLP receiver started."""
        s = self.settings
        pacing.confine(s.own_cpus)  # before the probes' and the OTLP receiver's threads: they inherit it
        pacing.yield_to_servers(s.collector_policy)  # the same
        metrics, otlp = ports.collector_listeners(s)
        ports.require_free(metrics, otlp)  # a port taken: one line now, not a traceback after the BPF compile
        self.publisher.check_reachable(10.0 if duration_s is None else min(10.0, duration_s))  # --duration bounds it
        if s.collector_metrics_port:
            with ports.refusing(metrics):  # taken since the check
                start_http_server(s.collector_metrics_port, addr=s.collector_metrics_bind)
        self.publish_topology()  # before the probes: some are configured from it
        self.refresh_own()  # before the first event: its own waits are never alerts
        self.open_probes()
        for probe in self.probes:
            probe.rescan()
        self.cost = SelfCost().start()  # BPF statistics on until shutdown
        log.info("collector started", extra=fields(
            host=s.host, boot_id=self.stamp.boot_id, threshold_ms=s.runq_threshold_ms,
            targets="all" if not s.filters_targets else sorted(self.current_targets() or []),
            hardware=s.hardware_probes))
        if s.otlp_port:
            self.otlp = OtlpReceiver(s.otlp_bind, s.otlp_port, None, s.request_id_attributes,
                                     max_connections=s.otlp_max_connections, read_timeout_s=s.otlp_read_timeout_s,
                                     proc=self.proc, trusted_relays=s.otlp_trusted_relays, intake=self.intake)
            try:
                self.otlp.start()
            except OtlpReceiverUnavailable:
                ports.require_free(otlp)  # taken since the check: say by whom
                raise
            log.info("OTLP receiver listening", extra=fields(
                endpoint=f"http://{s.otlp_bind}:{self.otlp.port}/v1/traces"))

    def run(self, duration_s: float | None = None) -> None:
        self.start(duration_s)
        s = self.settings
        started = time.monotonic()
        next_hist, next_topology = started + s.histogram_interval_s, started + s.topology_interval_s
        next_rescan, next_metrics = started + s.target_rescan_s, started + 1.0
        last_hist_ns = time.monotonic_ns()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if duration_s is not None and now - started >= duration_s:
                    break
                first = self.probes[0] if self.probes else None  # runq, always on: it waits for events
                pacing.PACER.waiting(lambda: call_each(self.probes, "poll", lambda p: p.poll(50 if p is first else 0)))
                if first is None:
                    self._stop.wait(0.05)  # no signal left to wait on: no busy loop
                self.take_requests()
                for topic, batch in self.batcher.due():
                    self.publisher.send(topic, batch)
                self.publisher.poll(0)
                now = time.monotonic()
                if now >= next_metrics:
                    self.export_metrics()
                    next_metrics = now + 1.0
                if now >= next_hist:
                    mono = time.monotonic_ns()
                    self.publish_histograms(mono - last_hist_ns)
                    last_hist_ns = mono
                    self.publish_stats()
                    next_hist = now + s.histogram_interval_s
                if now >= next_topology:
                    self.publish_topology()
                    next_topology = now + s.topology_interval_s
                if now >= next_rescan:
                    self.update_targets()
                    call_each(self.probes, "rescan", lambda p: p.rescan())
                    next_rescan = now + s.target_rescan_s
        finally:
            try:
                self.shutdown(time.monotonic_ns() - last_hist_ns)
            finally:
                if self.cost:  # the kernel's BPF statistics back as they were
                    self.cost.close()

    def shutdown(self, since_last_histograms_ns: int) -> None:
        if self.otlp:
            self.otlp.stop()
            self.take_requests()
        if self.probes:
            call_each(self.probes, "poll", lambda p: p.poll(0))  # take what the kernel still holds
            self.publish_histograms(since_last_histograms_ns)  # the rates' true interval, never 0
            self.publish_stats()
        for topic, batch in self.batcher.drain():
            self.publisher.send(topic, batch)
        # what is still in flight after this goes to the spool, for the next run
        undelivered = self.publisher.flush(10.0)
        if self.probes and not undelivered:  # the ledger's "sent" is the last stats record's: one counting all
            self.publish_stats(last=True)
            for topic, batch in self.batcher.drain():
                self.publisher.send(topic, batch)
            undelivered = self.publisher.flush(5.0)
        p = self.publisher
        self.export_metrics()
        try:
            if isinstance(p, KafkaPublisher):  # `up`'s drain contract; a recording has its own summary
                self.write_final()
        except OSError as exc:
            log.error("could not write the final counts", extra=fields(error=str(exc)))
        if self.cost:
            log.info("collector self-cost", extra=fields(**self.cost.summary()))
        log.info("collector stopped", extra=fields(
            events_read=self.events_read(), records_sent=p.records_sent, sent_by_topic=p.sent_by_topic,
            undelivered_messages=undelivered, undelivered_records=p.undelivered, spooled=p.spooled,
            spool_drops=p.spool_drops, producer_restarts=p.producer_restarts, delivery_errors=p.delivery_errors))
        p.close()
        self.close_probes()


def install_signal_handlers(collector: Collector) -> None:
    signal.signal(signal.SIGTERM, collector.stop)
    signal.signal(signal.SIGINT, collector.stop)
