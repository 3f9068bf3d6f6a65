# SPDX-License-Identifier: Apache-2.0
"""The signal catalogue: every signal's facts in one place.

A signal is one kind of record the collector publishes and the streams
worker reads: its record type (schemas/events.py), its Kafka topic, its
ClickHouse table and the migration that creates it
(schemas/clickhouse/*.sql), the collector settings that turn it on, where it
comes from in the kernel and the collector, and the rules that judge it.
What the rest of the code needs is derived from here: the topic tables
(schemas/topics.py), the sink's table per record (``TABLE_OF``), the
worker's handler per topic (streams/handlers.py: the method named after the
signal, or the generic one over the rule module's ``judge``), and README's
"Where each signal lives" (tests/unit/test_signals.py checks it matches).

Adding a signal (CONTRIBUTING.md walks through it): its record in
schemas/events.py, its migration, its probe in collector/probes/ (and its
BPF program), its rule module in streams/rules/, and one line here.
"""

from __future__ import annotations

from dataclasses import dataclass

from jitterscope.schemas import events

#: the ClickHouse database every table lives in
DATABASE = "jitterscope"


@dataclass(frozen=True)
class Signal:
    """One signal. ``name`` is the one name it has in every stage: its
    handler in streams/handlers.py, and its BPF program, probe and rule
    modules where it has one of each. ``probes``: the ``hardware_probes``
    setting values that turn it on (empty: always on, or as ``switch``
    says). ``kernel``, ``sources`` and ``rules``: the files that make it,
    publish it and judge it."""

    name: str
    what: str
    record: type[events.Record]
    topic: str
    table: str
    migration: str
    sources: tuple[str, ...]
    probes: tuple[str, ...] = ()
    kernel: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()
    #: another setting that turns it on or off, where one does
    switch: str = ""


SIGNALS: tuple[Signal, ...] = (
    Signal("runq", "run-queue waits", events.RunqEvent, "jitterscope.runq", "runq_events", "001_init.sql",
           ("collector/probes/runq.py",), kernel=("bpf/runq.bpf.c",),
           rules=("streams/rules/runq.py", "streams/attribution.py")),
    Signal("histograms", "every wait's latency, in log2 slots", events.LatencyHistogram, "jitterscope.histograms",
           "latency_histograms", "001_init.sql", ("collector/probes/runq.py",), kernel=("bpf/runq.bpf.c",),
           rules=("streams/signal_metrics.py",)),
    Signal("stacks", "the stacks of a run-queue wait's culprit and victim", events.StackTrace, "jitterscope.stacks",
           "stacks", "007_serving_stacks.sql", ("collector/stacks.py",), kernel=("bpf/runq.bpf.c",),
           switch="runq_stacks"),
    Signal("gpu_ioctl", "GPU driver calls", events.GpuIoctl, "jitterscope.gpu_ioctl", "gpu_ioctls", "003_hardware.sql",
           ("collector/probes/gpu_ioctl.py",), probes=("gpu_ioctl",), kernel=("bpf/gpu_ioctl.bpf.c",),
           rules=("streams/rules/gpu_ioctl.py", "streams/rules/blockio.py", "streams/attribution.py")),
    Signal("migrate", "CPU migrations", events.Migrations, "jitterscope.migrations", "migrations", "003_hardware.sql",
           ("collector/probes/migrate.py",), probes=("migrate",), kernel=("bpf/migrate.bpf.c",),
           rules=("streams/rules/migrate.py",)),
    Signal("pages", "page placement per NUMA node, and who added pages", events.PagePlacement, "jitterscope.pages",
           "page_placement", "003_hardware.sql", ("collector/probes/pages.py",), probes=("pages",),
           kernel=("bpf/pages.bpf.c",), rules=("streams/rules/pages.py", "streams/attribution.py")),
    Signal("device_io", "PCIe-neighbour block I/O and NIC counters", events.DeviceIo, "jitterscope.device_io",
           "device_io", "003_hardware.sql", ("collector/probes/blockio.py", "collector/probes/netdev.py"),
           probes=("blockio", "netdev"), kernel=("bpf/blockio.bpf.c",), rules=("streams/rules/blockio.py",)),
    Signal("irq", "hard/soft IRQ time per CPU, every irq_interval_s", events.IrqTime, "jitterscope.irq", "irq_time",
           "007_serving_stacks.sql", ("collector/probes/irq.py",), probes=("irq",), kernel=("bpf/irq.bpf.c",),
           rules=("streams/rules/irq.py", "streams/attribution.py")),
    Signal("throttle", "CFS quota throttling, from cpu.stat, every cfs_interval_s", events.CgroupThrottle,
           "jitterscope.cgroup_throttle", "cgroup_throttle", "007_serving_stacks.sql",
           ("collector/probes/throttle.py",), probes=("throttle",),
           rules=("streams/rules/throttle.py", "streams/rules/runq.py", "streams/attribution.py")),
    Signal("blocked", "serving threads blocked: GIL, memory, I/O, sleep", events.BlockedWait, "jitterscope.blocked",
           "blocked_waits", "011_time_budget.sql", ("collector/probes/blocked.py", "collector/pyruntime.py"),
           probes=("blocked",), kernel=("bpf/blocked.bpf.c",), rules=("streams/attribution.py",)),
    Signal("xid", "NVIDIA driver Xid errors, from the kernel log", events.GpuXid, "jitterscope.gpu_xid", "gpu_xid",
           "013_gpu_xid.sql", ("collector/probes/xid.py", "collector/kmsg.py"), probes=("xid",),
           rules=("streams/rules/xid.py", "streams/gpu_events.py")),
    Signal("nvml", "GPU clocks, throttle reasons, temperature, power, PCIe, NVLink errors (NVML)",
           events.GpuTelemetry, "jitterscope.gpu_telemetry", "gpu_telemetry", "014_gpu_telemetry.sql",
           ("collector/probes/nvml.py",), probes=("nvml",), rules=("streams/rules/nvml.py", "streams/gpu_events.py")),
    Signal("serving", "the serving engine's own metrics (vLLM's /metrics): queue, KV cache, TTFT and ITL P99",
           events.ServingMetrics, "jitterscope.serving", "serving_metrics", "022_serving_metrics.sql",
           ("collector/probes/serving.py", "collector/serving_metrics.py"), probes=("serving",)),
    Signal("requests", "request spans, over OTLP", events.RequestSpan, "jitterscope.requests", "requests",
           "002_requests.sql", ("collector/otlp/",), rules=("streams/rules/requests.py", "streams/attribution.py"),
           switch="otlp_port"),
    Signal("processes", "the processes watched: cgroup, CPUs, GPUs, serving group", events.ProcessInfo,
           "jitterscope.processes", "processes", "001_init.sql", ("collector/agent.py", "collector/hostinfo.py"),
           rules=("streams/rules/processes.py",)),
    Signal("topology", "the host's CPUs, NUMA nodes, GPUs and PCIe tree", events.Topology, "jitterscope.topology",
           "topology", "001_init.sql", ("collector/topology.py",)),
    Signal("collector_stats", "losses: events dropped in the kernel, batches spooled or lost", events.CollectorStats,
           "jitterscope.collector_stats", "collector_stats", "001_init.sql",
           ("collector/agent.py", "collector/spool.py"),
           kernel=("bpf/drops.bpf.inc",), rules=("streams/rules/losses.py",)),
)

#: what the worker writes, by record type: its table and the migration that creates it
OUTPUTS: dict[type[events.Record], tuple[str, str]] = {
    events.Alert: ("alerts", "001_init.sql"),
    events.RequestAttribution: ("request_attribution", "002_requests.sql"),
}

BY_NAME: dict[str, Signal] = {s.name: s for s in SIGNALS}

#: the values of the collector's ``hardware_probes`` setting (the run-queue probe is always on), in the
#: order the agent opens them; each is the probe collector/probes/<name>.py (collector/probes/registry.py)
HARDWARE_PROBES: tuple[str, ...] = tuple(dict.fromkeys(p for s in SIGNALS for p in s.probes))
#: old probe names, accepted with a warning for one release: the setting value "cfs" is now "throttle",
#: the name its probe and rule modules have
PROBE_ALIASES = {"cfs": "throttle"}

#: record type -> table
TABLE_OF: dict[type[events.Record], str] = {
    **{s.record: s.table for s in SIGNALS}, **{record: table for record, (table, _) in OUTPUTS.items()}}


def signal_table() -> str:
    """README's "Where each signal lives" table, rendered from the catalogue."""
    def files(paths: tuple[str, ...]) -> str:
        return ", ".join(f"`{p}`" for p in paths) or "—"

    rows = ["| signal | turned on by | kernel | collector | rules | table |", "|---|---|---|---|---|---|"]
    for s in SIGNALS:
        on = ", ".join([*(f"`{p}`" for p in s.probes), *([f"setting `{s.switch}`"] if s.switch else [])]) or "always"
        rows.append(f"| `{s.name}` ({s.what}) | {on} | {files(s.kernel)} | {files(s.sources)} | {files(s.rules)} "
                    f"| `{s.table}` |")
    return "\n".join(rows)
