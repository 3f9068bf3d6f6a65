"""The per-host collector: probes in, stamped and batched records out.

Kernel events carry CLOCK_MONOTONIC times; records leave with epoch ns, the
host, its boot id and a sequence number per record type. Sequences start at
the collector's start time in microseconds since boot, so a restarted
collector never reuses a (host, boot_id, seq) of its predecessor and the sink
stays idempotent without any state on disk.
"""

from __future__ import annotations

import logging
import queue
import signal
import threading
import time
from pathlib import Path

from prometheus_client import Counter, Gauge, start_http_server

from jitterscope.collector import hostinfo, topology
from jitterscope.collector.hardware import HardwareSources
from jitterscope.collector.clock import EpochConverter
from jitterscope.collector.otlp import OtlpReceiver
from jitterscope.collector.probes.runqlat import RawRunqEvent, RunqProbe
from jitterscope.collector.publish import Batcher, KafkaPublisher
from jitterscope.logs import fields
from jitterscope.schemas import events
from jitterscope.settings import Settings

log = logging.getLogger("jitterscope.collector")

EVENTS_READ = Counter("jitterscope_collector_events_read_total", "kernel events read from ring buffers", ["probe"])
RECORDS_SENT = Gauge("jitterscope_collector_records_sent", "records acknowledged by Kafka")
DELIVERY_ERRORS = Gauge("jitterscope_collector_delivery_errors", "Kafka messages that failed delivery")
RINGBUF_DROPS = Gauge("jitterscope_collector_ringbuf_drops", "events dropped in the kernel (ring buffer full)", ["probe"])

PROCESS_REFRESH_NS = 60_000_000_000  # re-publish a process's metadata at most this often


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


class Collector:
    def __init__(self, settings: Settings, publisher: KafkaPublisher | None = None,
                 proc: Path = Path("/proc"), sys: Path = Path("/sys")):
        self.settings = settings
        self.proc, self.sys = proc, sys
        self.stamp = Stamp(settings.host, proc)
        self.publisher = publisher or KafkaPublisher(
            settings.bootstrap_servers or "", settings.host,
            {"enable.idempotence": settings.kafka_idempotence})
        self.batcher = Batcher(settings.batch_max_records, settings.batch_max_delay_ms * 1_000_000)
        self.events_read = 0
        self._processes_sent: dict[int, int] = {}  # pid -> monotonic ns of last publish
        self._comms: dict[int, str] = {}
        self._stop = threading.Event()
        self.probe: RunqProbe | None = None
        self.hardware: HardwareSources | None = None
        self.topology: events.Topology | None = None
        self.otlp: OtlpReceiver | None = None
        self._spans_in: queue.SimpleQueue[list[dict]] = queue.SimpleQueue()  # from the OTLP threads
        self._serving_pids: set[int] = set()  # processes that sent request spans

    # -- records ---------------------------------------------------------
    def _queue(self, record: events.Record) -> None:
        for topic, batch in self.batcher.add(record):
            self.publisher.send(topic, batch)

    def publish_topology(self) -> None:
        self.topology_fields = topology.read_topology(self.sys, self.proc)
        self.topology = events.Topology(**self.stamp.header(events.Topology, time.time_ns()),
                                        **self.topology_fields)
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
            info = hostinfo.process_info(pid, self.proc)
        except hostinfo.ProcessGone:
            return
        self._comms[pid] = info["comm"]
        gpus, cuda_visible = topology.process_gpus(pid, self.proc, self.topology)
        self._queue(events.ProcessInfo(**self.stamp.header(events.ProcessInfo, time.time_ns()), **info,
                                       gpus=gpus, cuda_visible_devices=cuda_visible))

    def on_runq(self, raw: RawRunqEvent) -> None:
        self.events_read += 1
        EVENTS_READ.labels("runqlat").inc()
        pid = raw.pid or hostinfo.tgid_of(raw.tid, self.proc) or raw.tid
        self.describe_process(pid)
        self.describe_process(raw.suspect_pid)
        self._queue(events.RunqEvent(
            **self.stamp.header(events.RunqEvent, self.stamp.clock.to_epoch(raw.ts_ns)),
            pid=pid, tid=raw.tid, comm=raw.comm, cpu=raw.cpu, wait_ns=raw.wait_ns,
            suspect_pid=raw.suspect_pid, suspect_tid=raw.suspect_tid, suspect_comm=raw.suspect_comm,
        ))

    def take_requests(self) -> None:
        """Stamp and queue the request spans the OTLP receiver handed over.
        A serving process becomes a probe target when targets are filtered:
        its requests cannot be explained without its threads' waits."""
        new_pids = False
        while True:
            try:
                batch = self._spans_in.get_nowait()
            except queue.Empty:
                break
            for span in batch:
                self._queue(events.RequestSpan(**self.stamp.header(events.RequestSpan, span["end_ns"]), **span))
                if span["pid"] and span["pid"] not in self._serving_pids:
                    self._serving_pids.add(span["pid"])
                    new_pids = True
                    self.describe_process(span["pid"])
        if new_pids and self.probe:
            self.update_targets()

    def publish_histograms(self, interval_ns: int) -> None:
        now = time.time_ns()
        for pid, slots in sorted(self.probe.read_histograms().items()):
            ordered = sorted(slots.items())
            self._queue(events.LatencyHistogram(
                **self.stamp.header(events.LatencyHistogram, now), probe="runq", interval_ns=interval_ns, pid=pid,
                comm=self._comm(pid), slots=[s for s, _ in ordered], counts=[c for _, c in ordered],
            ))
        gone = {pid for pid in self._processes_sent if not (self.proc / str(pid)).exists()}
        if self.hardware:
            self.hardware.flush(interval_ns, now, self._comm)
        if gone:
            self.probe.forget_histograms(gone)
            if self.hardware:
                self.hardware.forget(gone)
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

    def publish_stats(self) -> None:
        drops = (self.probe.drops() if self.probe else 0) + (self.hardware.drops() if self.hardware else 0)
        RINGBUF_DROPS.labels("runqlat").set(drops)
        RECORDS_SENT.set(self.publisher.records_sent)
        DELIVERY_ERRORS.set(self.publisher.delivery_errors)
        self._queue(events.CollectorStats(
            **self.stamp.header(events.CollectorStats, time.time_ns()),
            started_ns=self.stamp.started_ns, ringbuf_drops=drops,
            events_read=self.events_read + (self.hardware.events_read if self.hardware else 0),
            records_sent=self.publisher.records_sent, delivery_errors=self.publisher.delivery_errors,
        ))

    def serving_thresholds(self) -> dict[int, int]:
        """Processes that send request spans report finer waits: their
        requests are explained from them, and short waits add up."""
        self._serving_pids = {p for p in self._serving_pids if (self.proc / str(p)).exists()}
        ns = int(self.settings.serving_threshold_ms * 1_000_000)
        return {pid: ns for pid in self._serving_pids}

    def update_targets(self) -> None:
        self.probe.set_targets(self.current_targets() or set(), self.serving_thresholds())

    def current_targets(self) -> set[int] | None:
        s = self.settings
        if not s.filters_targets:
            return None
        pids = set(s.target_pids) | self._serving_pids
        if s.target_comms:
            pids |= hostinfo.pids_matching(s.target_comms, self.proc)
        return pids

    # -- loop ------------------------------------------------------------
    def stop(self, *_args) -> None:
        self._stop.set()

    def run(self, duration_s: float | None = None) -> None:
        s = self.settings
        self.publisher.check_reachable()
        if s.collector_metrics_port:
            start_http_server(s.collector_metrics_port)
        self.probe = RunqProbe(int(s.runq_threshold_ms * 1_000_000), self.current_targets(),
                               self.serving_thresholds())
        self.probe.open(self.on_runq)
        self.publish_topology()
        self.hardware = HardwareSources(
            s.hardware_probes, self.stamp, self._queue, self.describe_process, self.topology_fields,
            int(s.gpu_ioctl_threshold_ms * 1_000_000), s.gpu_device_patterns, self.current_targets(),
            self.proc, self.sys)
        self.hardware.rescan(self.current_targets())
        log.info("collector started", extra=fields(
            host=s.host, boot_id=self.stamp.boot_id, threshold_ms=s.runq_threshold_ms,
            targets="all" if not s.filters_targets else sorted(self.current_targets() or []),
            hardware=s.hardware_probes))
        if s.otlp_port:
            self.otlp = OtlpReceiver(s.otlp_bind, s.otlp_port, self._spans_in.put, s.request_id_attributes).start()
            log.info("OTLP receiver listening", extra=fields(
                endpoint=f"http://{s.otlp_bind}:{self.otlp.port}/v1/traces"))

        started = time.monotonic()
        next_hist = started + s.histogram_interval_s
        next_topology = started + s.topology_interval_s
        next_rescan = started + s.target_rescan_s
        last_hist_ns = time.monotonic_ns()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if duration_s is not None and now - started >= duration_s:
                    break
                self.probe.poll(50)
                self.hardware.poll()
                self.take_requests()
                for topic, batch in self.batcher.due():
                    self.publisher.send(topic, batch)
                self.publisher.poll(0)
                now = time.monotonic()
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
                    self.hardware.rescan(self.current_targets())
                    next_rescan = now + s.target_rescan_s
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        if self.otlp:
            self.otlp.stop()
            self.take_requests()
        if self.probe:
            self.probe.poll(0)  # take what the kernel still holds
            if self.hardware:
                self.hardware.poll()
            self.publish_histograms(0)
            self.publish_stats()
        for topic, batch in self.batcher.drain():
            self.publisher.send(topic, batch)
        undelivered = self.publisher.flush(10.0)
        log.info("collector stopped", extra=fields(
            events_read=self.events_read, records_sent=self.publisher.records_sent,
            undelivered_messages=undelivered, delivery_errors=self.publisher.delivery_errors))
        if self.probe:
            self.probe.close()
            self.probe = None
        if self.hardware:
            self.hardware.close()
            self.hardware = None


def install_signal_handlers(collector: Collector) -> None:
    signal.signal(signal.SIGTERM, collector.stop)
    signal.signal(signal.SIGINT, collector.stop)
