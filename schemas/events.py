# SPDX-License-Identifier: Apache-2.0
"""The one definition of every record jitterscope moves.

Collector and streams both import these types; nothing restates them. On the
wire a Kafka message is a batch: records of one type from one host, one JSON
object per line (NDJSON), which is also what ClickHouse's JSONEachRow and
kcat read directly.

Every record carries ``v`` (the schema version; a reader rejects versions it
does not know) and ``(host, boot_id, seq)``: ``seq`` counts per host and record
type, so the sink can insert idempotently and name gaps as losses. All
timestamps are epoch nanoseconds.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

# the integer ranges of the ClickHouse columns, and the parts of a request's attribution: re-exported
from jitterscope.schemas.ranges import EpochNs, I16, I32, I64, MAX_EPOCH_NS, U8, U16, U32, U64  # noqa: F401
from jitterscope.schemas.request_parts import CauseShare, ChainHop, PhasePart, Suspect  # noqa: F401

SCHEMA_VERSION: Final = 1


# gc=False (inherited): records are immutable, hold only scalars, lists of them and other records: never in a
# cycle. It skips msgspec's tracking (run-queue batches decode 7% faster) and keeps them out of the GC's scans.
class Record(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    v: Literal[1] = SCHEMA_VERSION
    host: str
    boot_id: str
    seq: U64
    ts_ns: EpochNs


#: what a suspect's name starts with when the process is jitterscope's own
#: (its collector, or under `up` its broker and worker): never a neighbour to
#: move, always the cost of watching
OWN_SUSPECT_PREFIX = "jitterscope:"


def suspect_name(comm: str, own_role: str | None) -> tuple[str, bool]:
    """(a suspect's or waker's name in records, whether it is jitterscope's
    own). Own is known by pid (``own_role``: the collector's ``own`` map),
    never by name; a foreign name spelled like the label (``cp /bin/yes
    /tmp/jitterscope:up``) gets a "?" in front, so the label stays
    unforgeable where only names are kept (the runq_minute rollup)."""
    if own_role is not None:
        return OWN_SUSPECT_PREFIX + own_role, True
    return ("?" + comm if comm.startswith(OWN_SUSPECT_PREFIX) else comm), False


class RunqEvent(Record, frozen=True):
    """A thread waited at least the probe threshold for a CPU -- or, with ``waits`` > 1, a serving
    thread's waits under its threshold, summed: ``wait_ns`` their total, ``ts_ns`` the last one's end
    (bpf/runq.h struct short_waits). Stored in whole microseconds (clickhouse/015_runq_microseconds.sql)."""

    pid: U32
    tid: U32
    comm: str
    cpu: U16
    wait_ns: U64
    suspect_pid: U32  # the task that held the CPU when the waiter got it
    suspect_tid: U32
    suspect_comm: str
    # StackTrace.stack_id of the waiter's stack when preempted and of the task that held the CPU; 0 = none
    # (stacks are taken only for waits worth an alert)
    victim_stack: U64 = 0
    suspect_stack: U64 = 0
    waits: U32 = 1  # how many waits it stands for
    suspect_own: bool = False  # jitterscope's own, known by pid (`suspect_name`): the cost of watching


class LatencyHistogram(Record, frozen=True):
    """Every latency one probe measured for one process over ``interval_ns``, in log2 buckets:
    ``slots[i]`` is a bucket of latencies in [2^slot, 2^(slot+1)) us holding ``counts[i]`` of them (empty
    ones left out). ``probe``: "runq" (wait for a CPU) or "gpu_ioctl" (GPU driver call)."""

    probe: str
    interval_ns: U64
    pid: U32
    comm: str
    slots: list[U8]
    counts: list[U64]

    def __post_init__(self):
        # the rollup view ARRAY JOINs the two: unequal lengths would fail the insert
        if len(self.slots) != len(self.counts):
            raise ValueError(f"slots ({len(self.slots)}) and counts ({len(self.counts)}) differ in length")


class NumaNode(msgspec.Struct, frozen=True, gc=False):
    node: U16
    cpus: list[U16]
    memory_bytes: U64 = 0
    pfn_ranges: list[list[U64]] = []  # [start, end) page-frame ranges of the node's zones


class Cpu(msgspec.Struct, frozen=True, gc=False):
    cpu: U16
    node: I16
    socket: I16
    core: I32
    siblings: list[U16]  # SMT threads of the same core, itself included


class PciDevice(msgspec.Struct, frozen=True, gc=False):
    """A device on the PCI tree and the bridges above it.

    ``upstream`` lists the bridge addresses from the root port down to the
    device's parent: two devices share a switch when they share an entry
    below the root port.
    """

    address: str  # 0000:3b:00.0
    kind: str  # "gpu", "nvme", "nic" or "other"
    vendor: U32
    device: U32
    class_code: U32
    numa_node: I16  # -1 where the firmware does not say
    upstream: list[str]
    name: str = ""  # nvme0, eth0, or the GPU's NVML index as a string
    link_gen: U8 = 0  # current PCIe generation (NVML or sysfs), 0 = unknown
    link_width: U8 = 0


class Topology(Record, frozen=True):
    """The host's hardware: CPUs, NUMA nodes and the PCI devices that matter
    for inference (GPUs, NVMe, NICs) with the bridges they hang off."""

    cpus: list[U16]
    numa_nodes: list[NumaNode]
    cpu_info: list[Cpu] = []
    pci: list[PciDevice] = []


class ProcessInfo(Record, frozen=True):
    """Metadata of a process the collector reports on."""

    pid: U32
    comm: str
    cmdline: str
    cgroup: str
    cpus_allowed: list[U16]
    gpus: list[str] = []  # PCI addresses of the GPUs it has open (/dev/nvidiaN)
    cuda_visible_devices: str = ""
    ppid: U32 = 0
    ns_pid: U32 = 0  # its pid inside its own PID namespace (innermost NSpid); = pid on the bare host
    # its serving stack: the host pid of the process that sends the request spans (itself for it); 0 = none
    serving_group: U32 = 0
    # container and Kubernetes identity, from the cgroup path (and the kubelet's pod list); "" on a bare host
    container_id: str = ""
    pod_uid: str = ""
    pod: str = ""
    namespace: str = ""
    container: str = ""
    memory_cgroup: str = ""  # the memory controller's cgroup: whose limit it shares ("" = unknown)


class GpuIoctl(Record, frozen=True):
    """A GPU driver ioctl that took at least the probe threshold."""

    pid: U32
    tid: U32
    comm: str
    fd: I32
    request: U64
    latency_ns: U64
    device: str  # the device path the fd was opened on


class GpuXid(Record, frozen=True):
    """An Xid error the NVIDIA driver logged to the kernel log (an NVRM line
    in /dev/kmsg), at the kernel's own time of the line; meanings:
    schemas/gpu_health.py."""

    xid: U16
    pci: str  # the GPU's PCI address as sysfs names it (0000:3b:00.0)
    gpu: str = ""  # its name in the host's topology (NVML index or nvidiaN), "" where it has no GPU there
    pid: U32 = 0  # the process the driver named, 0 where the line names none
    comm: str = ""
    message: str = ""  # the rest of the line, as the driver wrote it


class GpuTelemetry(Record, frozen=True):
    """One GPU's NVML readings over ``interval_ns`` ending at ``ts_ns``: clocks, why they are held down
    (``throttle``: the names of ``throttle_reasons``' bits, schemas/gpu_health.py), temperature, power,
    PCIe throughput and the NVLink errors in the interval. 0 where NVML does not support a reading."""

    pci: str
    gpu: str
    interval_ns: U64
    sm_clock_mhz: U32 = 0
    mem_clock_mhz: U32 = 0
    sm_clock_max_mhz: U32 = 0
    throttle_reasons: U64 = 0
    throttle: list[str] = []
    temperature_c: U16 = 0
    power_mw: U32 = 0
    pcie_tx_kbps: U32 = 0  # KB/s, NVML's 20 ms sample at the reading
    pcie_rx_kbps: U32 = 0
    nvlink_errors: U64 = 0  # replay, recovery and CRC errors over every active link, in the interval


class ServingMetrics(Record, frozen=True):
    """The serving engine's own readings (vLLM's /metrics, collector/serving_metrics.py) for one model over
    ``interval_ns`` ending at ``ts_ns``: requests running and waiting and KV-cache use as last read, and its
    TTFT and inter-token latency histograms' P50/P99 over the requests that finished in the interval."""

    endpoint: str  # the URL read
    model: str
    interval_ns: U64
    requests_running: float = 0.0
    requests_waiting: float = 0.0
    kv_cache_usage: float = 0.0  # 0..1
    ttft_count: U32 = 0
    ttft_p50_ns: U64 = 0
    ttft_p99_ns: U64 = 0
    itl_count: U32 = 0  # tokens
    itl_p50_ns: U64 = 0
    itl_p99_ns: U64 = 0


#: what held a blocked thread (BlockedWait.kind): the interpreter lock, memory
#: (a page-cache fault or reclaim), uninterruptible I/O, any other sleep
BLOCKED_KINDS = ("gil", "memory", "io", "sleep")


class BlockedWait(Record, frozen=True):
    """A thread of a serving group was blocked (off the CPU, not runnable)
    for at least the probe threshold, ending at ``ts_ns`` when it was woken.
    ``kind`` (BLOCKED_KINDS) says what it was blocked on; the waker is the
    task that woke it: for ``gil`` the thread that released the interpreter
    lock (the holder); pid 0 when no task did: its own timer (``waker_tid``
    its own tid; a poll loop's timeouts: a record per run, up to 100 ms), an
    interrupt on an idle CPU. ``device``: for ``io``, the block device of the
    last I/O it queued before it slept ("": none seen: NFS, a pipe in D)."""

    pid: U32
    tid: U32
    comm: str
    kind: str
    blocked_ns: U64
    waker_pid: U32
    waker_tid: U32
    waker_comm: str
    device: str = ""


class IrqTime(Record, frozen=True):
    """Time one CPU spent in one interrupt source over ``interval_ns`` ending at ``ts_ns`` (in-kernel sums
    from the irq: tracepoints). ``kind`` is "hardirq" (``source`` = "<irq>:<handler name>"), "softirq"
    (``source`` = the vector: "NET_RX", "TIMER", ...) or "steal": the hypervisor ran something else on
    this vCPU (``source`` "hypervisor", ``count`` clock ticks; /proc/stat)."""

    cpu: U16
    interval_ns: U64
    kind: str
    source: str
    count: U64
    time_ns: U64


class CgroupThrottle(Record, frozen=True):
    """CFS bandwidth control of one cgroup over ``interval_ns`` ending at
    ``ts_ns``: deltas of its ``cpu.stat`` counters, and its limit."""

    cgroup: str  # path below the cpu controller's root
    interval_ns: U64
    quota_us: I64  # -1 = no limit
    period_us: U64
    nr_periods: U64
    nr_throttled: U64
    throttled_ns: U64


class StackTrace(Record, frozen=True):
    """One distinct stack, symbolized once by the collector; ``stack_id``
    (a hash of the frames) is what RunqEvent and Alert refer to."""

    stack_id: U64
    pid: U32
    comm: str
    kernel: list[str]  # innermost frame first
    user: list[str]


class Migrations(Record, frozen=True):
    """CPU migrations of one watched thread over ``interval_ns``."""

    pid: U32
    tid: U32
    comm: str
    interval_ns: U64
    migrations: U32
    cross_node: U32  # of which moved it to another NUMA node
    last_cpu: U16


class PagePlacement(Record, frozen=True):
    """Pages one process put on one NUMA node over ``interval_ns``."""

    pid: U32
    comm: str
    node: I16
    interval_ns: U64
    page_cache_pages: U64  # file pages it added to the page cache
    alloc_pages: U64  # pages allocated in its context
    memory_cgroup: str = ""  # its memory cgroup when counted: whose limit it filled ("" = unknown)
    exited: bool = False  # its last record: the process exited, its allocations freed (its page cache may stay)


class DeviceIo(Record, frozen=True):
    """Traffic of one block device or network interface over ``interval_ns``."""

    device: str  # nvme0n1, eth0
    kind: str  # "block" or "net"
    pci: str  # PCI address of the controller, "" when not on PCI
    interval_ns: U64
    ios: U64
    bytes: U64
    latency_max_ns: U64 = 0  # block only
    latency_sum_ns: U64 = 0


class CollectorStats(Record, frozen=True):
    """The collector's own counters, cumulative since it started."""

    started_ns: EpochNs
    ringbuf_drops: U64
    events_read: U64
    records_sent: U64
    delivery_errors: U64
    # loss ledger: every way a record can be lost on the host, counted
    map_full_drops: U64 = 0  # in-kernel map updates that failed (map full)
    spool_drops: U64 = 0  # records dropped because Kafka and the on-disk spool were both full
    spooled: U64 = 0  # records waiting in the on-disk spool now
    producer_restarts: U64 = 0  # fatal producer errors survived by recreating the producer
    sent_by_topic: dict[str, U64] = {}  # records acknowledged by Kafka, per topic
    # self-cost (collector/selfcost.py): what watching the host costs it
    cpu_ns: U64 = 0  # the collector process's CPU time, user+sys, all threads
    rss_bytes: U64 = 0  # its resident memory now
    bpf_run_ns: U64 = 0  # kernel time in its BPF programs (counted while BPF stats are on)
    bpf_run_count: U64 = 0  # runs of its BPF programs
    bpf_run_ns_by_program: dict[str, U64] = {}
    bpf_run_count_by_program: dict[str, U64] = {}
    online_cpus: U16 = 0
    overhead_share: float = 0.0  # (BPF + collector CPU time) / (interval * online CPUs), last interval
    longest_run_ns: U64 = 0  # the collector loop's longest run on a CPU without a wait or yield, last interval


class Alert(Record, frozen=True):
    """A root cause found in the evidence, with what to do about it. ``seq``/``boot_id`` are the
    evidence record's (re-processing the same evidence yields the same alert key). ``ts_ns`` is when
    the evidence happened, ``raised_ns`` when the rule fired (the difference is the alert delay)."""

    raised_ns: EpochNs
    kind: str
    severity: str
    pid: U32
    tid: U32
    comm: str
    cpu: U16
    wait_ns: U64
    suspect_pid: U32
    suspect_comm: str
    cpus_allowed: list[U16]
    summary: str
    remedy: str
    request_id: str = ""  # the request it is about, for request alerts
    evidence: dict[str, str] = {}  # what else the rule saw, as text: the GPU, its NUMA node and switch, rates...
    # the victim's container identity (ProcessInfo), "" on a bare host
    pod: str = ""
    namespace: str = ""
    container: str = ""
    victim_stack: U64 = 0  # StackTrace.stack_id, 0 = none
    suspect_stack: U64 = 0


class RequestSpan(Record, frozen=True):
    """One inference request, from an OpenTelemetry span the collector received.

    ``ts_ns`` is the span's end. ``pid`` is the serving process (0 = not known:
    attributed at host level). Phase durations are 0 where the span did not
    carry them.
    """

    request_id: str
    trace_id: str  # hex
    span_id: str  # hex
    name: str
    pid: U32
    start_ns: EpochNs
    end_ns: EpochNs
    status: str  # "ok", "error" or "unset"
    queue_ns: U64 = 0
    prefill_ns: U64 = 0
    decode_ns: U64 = 0
    ttft_ns: U64 = 0
    # the span's ``thread.id`` (OpenTelemetry semantic conventions): the thread
    # that carried the request, whose time budget the attribution gives; 0 =
    # not sent (the group's most-delayed thread is taken)
    tid: U32 = 0
    model: str = ""  # gen_ai.response.model (or .request.model): whose token objectives apply
    output_tokens: U32 = 0  # gen_ai.usage.completion_tokens (or .output_tokens): 0 = not sent


class RequestAttribution(Record, frozen=True):
    """Why one request took as long as it did.

    ``baseline_ns`` is the host's rolling median for requests of this name;
    ``excess_ns`` what this one took beyond it. ``cause`` is the evidence that
    explains most of the excess ("runq_starvation", "self_contention",
    "cfs_throttling", "irq", "steal", "gpu_ioctl_stall", "gil_contention",
    "memory_stall", "io_wait"; "gpu_xid" or "gpu_throttle" when its GPU
    logged an Xid or was clocked down during it and nothing on the CPU side
    explains the excess), or "unexplained" (or "none": no excess). Requests
    batched together share evidence, by design. ``causes``: every cause with its
    share, largest first; ``chain``: who its thread slept on, hop by hop.
    """

    request_id: str
    trace_id: str
    name: str
    pid: U32
    start_ns: EpochNs
    end_ns: EpochNs
    duration_ns: U64
    baseline_ns: U64
    excess_ns: U64
    status: str
    runq_wait_ns: U64
    runq_wait_max_ns: U64
    runq_waits: U32
    suspects: list[Suspect]
    cause: str
    explained: float  # share of the excess its causes account for together, 0..1
    slo_ns: U64
    slo_breached: bool
    gpu_ioctl_ns: U64 = 0  # time its process spent in slow GPU driver calls during it
    gpu_ioctl_max_ns: U64 = 0
    gpu_ioctls: U32 = 0
    throttled_ns: U64 = 0  # part of its waits spent with its cgroup throttled (CFS quota)
    irq_ns: U64 = 0  # interrupt time on the CPUs it waited for, during its waits
    pids: list[U32] = []  # the serving group's processes whose evidence counted
    pod: str = ""
    namespace: str = ""
    container: str = ""
    # part of its waits behind its own serving group's threads: more runnable
    # threads than CPUs (self-contention), never a neighbour's doing
    self_wait_ns: U64 = 0
    self_threads: U32 = 0  # distinct threads of the group that held the CPUs it waited for
    # its duration less its carrying thread's run-queue waits and stalls, save those behind its own group's
    # threads (how it always runs): what it would have taken with no one in the way; the baseline learns it
    service_ns: U64 = 0
    gpu_ioctl_call: str = ""  # the longest slow GPU driver call's name (schemas/nvidia.py), "" for none
    # The time budget of the thread that carried it (the group's thread that lost the most to waits during it;
    # 0 = none known): its blocked time by BlockedWait kind, and the rest, on the CPU (or in waits under the
    # probes' thresholds): runq (its own) + these = duration.
    thread_tid: U32 = 0
    gil_wait_ns: U64 = 0
    memory_wait_ns: U64 = 0
    io_wait_ns: U64 = 0
    sleep_ns: U64 = 0
    on_cpu_ns: U64 = 0
    # who is behind the cause: the top neighbour, "comm[tid]" of the GIL holder, the memory or I/O stall's waker
    culprit: str = ""
    gpu_xid: U16 = 0  # an Xid its GPU logged during it (the first; 0 for none): GpuXid
    gpu_throttle: list[str] = []  # the slowdowns NVML saw on its GPU during it (GpuTelemetry.throttle)
    causes: list[CauseShare] = []
    chain: list[ChainHop] = []
    # each phase its span gave (queue, prefill, decode), with the cause that took the most of it; [] for none
    phases: list[PhasePart] = []
    # the span's model, its time to first token, its mean time between output tokens (decode over the tokens
    # after the first), and which token objectives (ttft_slo_ms, itl_slo_ms) it broke: "ttft", "itl"
    model: str = ""
    ttft_ns: U64 = 0
    itl_ns: U64 = 0
    token_slo_breached: list[str] = []
    span_id: str = ""  # the request's own span (hex): the parent of its OTLP attribution span (streams/otlp_export.py)
    culprit_stack: U64 = 0  # StackTrace.stack_id: what the runq_starvation culprit ran while it held the CPU (0 = none)


class DeadLetter(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """Input that could not be decoded or stored, kept with the reason."""

    host: str = ""  # the message's key: the host that sent it
    topic: str
    partition: U32
    offset: U64
    line: U32  # 1-based line within the message; 0 = the whole message
    reason: str
    payload: str  # the offending bytes, decoded as UTF-8 with replacement
    ts_ns: int
