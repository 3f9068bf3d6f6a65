# SPDX-License-Identifier: Apache-2.0
"""What jitterscope itself costs on the host, measured while it runs.

Two parts: the collector process's own CPU time (user+sys, every thread) and
RSS, and the run time of its BPF programs in the kernel. The kernel counts the
latter only while BPF statistics are on; :class:`BpfStats` switches them on for
as long as the collector runs -- through a ``BPF_ENABLE_STATS`` file
descriptor where the kernel has one (the kernel switches them off again when
the fd closes, so a crash cannot leave them on), else through the
``kernel.bpf_stats_enabled`` sysctl, put back as it was on close.

The programs are found by scanning ``/proc/self/fdinfo`` for fds that carry a
``prog_id:`` line: every program this process loaded, whatever probe loaded
it. The kernel keeps a program name of at most 15 characters; a probe that
knows the full names gives them as ``{name: fd}`` (``BccProbe.program_fds``).

:func:`overhead_share` is the one figure: the watching's CPU time as a share
of all the host's CPU time over an interval.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Counter, Gauge

log = logging.getLogger("jitterscope.collector")

STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")

# bpf(2): the x86_64/aarch64 syscall numbers, and the commands used here
_NR_BPF = {"x86_64": 321, "aarch64": 280}.get(os.uname().machine, 321)
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0
_ATTR_SIZE = 128  # bytes of union bpf_attr passed (zeroed past what a command uses)
_PROG_INFO_NAME = slice(64, 80)  # struct bpf_prog_info: char name[16] at byte 64
_PROG_INFO_LEN = 80

CPU_SECONDS = Counter("jitterscope_collector_cpu_seconds_total",
                      "CPU time (user+sys, all threads) the collector process used")
RSS_BYTES = Gauge("jitterscope_collector_rss_bytes", "resident memory of the collector process")
BPF_RUN_SECONDS = Counter("jitterscope_bpf_run_seconds_total",
                          "time the kernel spent running jitterscope's BPF programs", ["program"])
BPF_RUN_COUNT = Counter("jitterscope_bpf_run_count_total", "runs of jitterscope's BPF programs", ["program"])
BPF_MISSES = Counter("jitterscope_bpf_recursion_misses_total",
                     "runs of jitterscope's BPF programs the kernel skipped (another BPF program ran on that CPU)",
                     ["program"])
OVERHEAD = Gauge("jitterscope_overhead_ratio",
                 "BPF run time + collector CPU time as a share of all the host's CPU time, "
                 "over the last stats interval (0.005 = 0.5%)")
BPF_STATS_ON = Gauge("jitterscope_bpf_stats_enabled", "1 when the kernel counts BPF run time for the collector")


# -- pure --------------------------------------------------------------------
def overhead_share(bpf_run_ns: int, cpu_ns: int, interval_ns: int, cpus: int) -> float:
    """(BPF run time + collector CPU time) / (interval * online CPUs): the
    share of the host's CPU time spent watching it. 0.0 for an empty interval."""
    capacity = interval_ns * max(1, cpus)
    if capacity <= 0:
        return 0.0
    return max(0, bpf_run_ns + cpu_ns) / capacity


def parse_fdinfo(text: str) -> dict[str, str]:
    """An fdinfo file's ``key:\\tvalue`` lines as a dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class ProgramStats:
    prog_id: int
    name: str
    run_ns: int
    run_count: int
    #: runs the kernel skipped: the program's tracepoint fired while another BPF program ran on that CPU
    #: (an interrupt in a program on a page fault): what it would have seen is lost, unlike a drop, silently
    misses: int = 0


def program_stats(fdinfo: dict[str, str], name: str = "") -> ProgramStats | None:
    """A BPF program's counters from its parsed fdinfo; None when the fd is
    not a program (or the kernel predates run_time_ns in fdinfo)."""
    if "prog_id" not in fdinfo:
        return None
    prog_id = int(fdinfo["prog_id"])
    return ProgramStats(prog_id, name or f"prog{prog_id}", int(fdinfo.get("run_time_ns", 0)),
                        int(fdinfo.get("run_cnt", 0)), int(fdinfo.get("recursion_misses", 0)))


def format_cost(cost: dict) -> str:
    """One line for people: ``jitterscope cost on this host: 0.30% of CPU
    (BPF 0.10%, collector 0.20%), collector RSS 180 MB``."""
    total = cost.get("overhead_share", 0.0)
    bpf, collector = cost.get("bpf_share", 0.0), cost.get("collector_share", 0.0)
    rss_mb = cost.get("rss_bytes", 0) / 1e6
    return (f"jitterscope cost on this host: {total:.2%} of CPU (BPF {bpf:.2%}, collector {collector:.2%}), "
            f"collector RSS {rss_mb:.0f} MB")


# -- kernel ------------------------------------------------------------------
def _bpf(cmd: int, attr: ctypes.Array) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ret = libc.syscall(ctypes.c_long(_NR_BPF), ctypes.c_int(cmd), attr, ctypes.c_uint(len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def enable_stats_fd() -> int:
    """An fd that keeps the kernel's BPF run-time statistics on while open
    (BPF_ENABLE_STATS, Linux 5.8+). Raises OSError where the kernel lacks it."""
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    ctypes.c_uint32.from_buffer(attr, 0).value = BPF_STATS_RUN_TIME
    return _bpf(BPF_ENABLE_STATS, attr)


def prog_name(fd: int) -> str:
    """The kernel's name for the program behind ``fd`` (at most 15 characters)."""
    info = ctypes.create_string_buffer(_PROG_INFO_LEN)
    attr = ctypes.create_string_buffer(_ATTR_SIZE)
    ctypes.c_uint32.from_buffer(attr, 0).value = fd
    ctypes.c_uint32.from_buffer(attr, 4).value = _PROG_INFO_LEN
    ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(info)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    return info.raw[_PROG_INFO_NAME].split(b"\0", 1)[0].decode(errors="replace")


class BpfStats:
    """Keeps the kernel's BPF statistics on until :meth:`close`: through an
    enable fd (closed with the process, whatever happens), else through the
    sysctl, put back to its previous value on close."""

    def __init__(self, sysctl: Path = STATS_SYSCTL):
        self.sysctl = sysctl
        self.fd: int | None = None
        self.previous: str | None = None  # the sysctl's value before, when we wrote it
        self.how = "off"

    def open(self) -> "BpfStats":
        try:
            self.fd = enable_stats_fd()
            self.how = "fd"
        except OSError as exc:
            try:
                before = self.sysctl.read_text().strip()
                if before != "1":
                    self.sysctl.write_text("1\n")
                    self.previous = before
                self.how = "sysctl"
            except OSError as exc2:
                log.warning("BPF run times not measured: cannot enable the kernel's BPF statistics",
                            extra={"fields": {"enable_stats": str(exc), "sysctl": str(exc2)}})
        BPF_STATS_ON.set(self.how != "off")
        return self

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.previous is not None:
            try:
                self.sysctl.write_text(self.previous + "\n")
            except OSError as exc:
                log.error("could not restore kernel.bpf_stats_enabled",
                          extra={"fields": {"value": self.previous, "error": str(exc)}})
            self.previous = None
        self.how = "off"
        BPF_STATS_ON.set(0)

    def __enter__(self) -> "BpfStats":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()


def scan_programs(fdinfo_dir: Path = Path("/proc/self/fdinfo"),
                  names: dict[int, str] | None = None, only_named: bool = False) -> dict[int, ProgramStats]:
    """prog_id -> counters of every BPF program this process holds an fd of.
    ``names`` (fd -> name) overrides the kernel's short names; ``only_named``
    reads just those fds' fdinfo (the collector holds hundreds of fds, maps
    and perf events among them: reading them all took ~4 ms a second)."""
    names = names or {}
    found: dict[int, ProgramStats] = {}
    try:
        entries = [fdinfo_dir / str(fd) for fd in names] if only_named else list(fdinfo_dir.iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            fd = int(entry.name)
            info = parse_fdinfo(entry.read_text())
        except (ValueError, OSError):  # closed meanwhile, or not ours to read
            continue
        if "prog_id" not in info or int(info["prog_id"]) in found and fd not in names:
            continue
        name = names.get(fd, "")
        if not name:
            try:
                name = prog_name(fd)
            except OSError:
                name = ""
        stats = program_stats(info, name)
        if stats:
            found[stats.prog_id] = stats
    return found


def cpu_ns() -> int:
    """User+sys CPU time of this process, every thread, in ns."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return int((r.ru_utime + r.ru_stime) * 1e9)


def rss_bytes(statm: Path = Path("/proc/self/statm")) -> int:
    try:
        return int(statm.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the peak, at least


def online_cpus() -> int:
    return os.sysconf("SC_NPROCESSORS_ONLN") or 1


def program_names(probes) -> dict[int, str]:
    """fd -> full program name, from the probes that can say
    (``program_fds() -> {name: fd}``); BCC's ``tracepoint__`` prefix dropped."""
    names: dict[int, str] = {}
    for probe in probes:
        fds = getattr(probe, "program_fds", None)
        if not callable(fds):
            continue
        try:
            for name, fd in fds().items():
                names[fd] = name.removeprefix("tracepoint__")
        except Exception:  # a closed probe: the kernel's names will do
            continue
    return names


# -- the collector's view ------------------------------------------------------
def _unique_names(programs: dict[int, ProgramStats]) -> dict[int, str]:
    """prog_id -> name, a name shared by programs suffixed with their id."""
    count: dict[str, int] = {}
    for p in programs.values():
        count[p.name] = count.get(p.name, 0) + 1
    return {i: (p.name if count[p.name] == 1 else f"{p.name}#{i}") for i, p in programs.items()}


FULL_SCAN_EVERY = 30  # samples (one a second): how often every fd is read, named by a probe or not


@dataclass
class SelfCost:
    """The collector's running totals of its own cost. :meth:`sample` reads
    the counters; programs unloaded since (a probe detached) keep their last
    counts, so the totals never go down."""

    fdinfo_dir: Path = Path("/proc/self/fdinfo")
    stats: BpfStats = field(default_factory=BpfStats)
    started_mono_ns: int = field(default_factory=time.monotonic_ns)
    started_cpu_ns: int = field(default_factory=cpu_ns)
    programs: dict[int, ProgramStats] = field(default_factory=dict)
    cpu_ns: int = 0
    rss_bytes: int = 0
    cpus: int = field(default_factory=online_cpus)
    _last: tuple[int, int, int] | None = None  # (mono ns, bpf ns, cpu ns) at the previous interval
    last_share: tuple[float, float] = (0.0, 0.0)  # (bpf, collector) over the last interval
    _exported: dict = field(default_factory=dict)
    _samples: int = 0

    def start(self) -> "SelfCost":
        self.stats.open()
        self._last = (time.monotonic_ns(), self.bpf_run_ns, cpu_ns() - self.started_cpu_ns)
        return self

    def close(self) -> None:
        self.stats.close()

    def sample(self, names: dict[int, str] | None = None) -> None:
        """Read the counters: of the programs ``names`` (fd -> name) gives,
        and of every program this process holds at every FULL_SCAN_EVERY-th
        call (one no probe names is still counted, a little later)."""
        self._samples += 1
        only_named = bool(names) and self._samples % FULL_SCAN_EVERY != 1
        for prog_id, p in scan_programs(self.fdinfo_dir, names, only_named).items():
            old = self.programs.get(prog_id)
            # a name from a probe wins over the kernel's short one
            name = p.name if not old or p.name != f"prog{prog_id}" else old.name
            self.programs[prog_id] = ProgramStats(prog_id, name, p.run_ns, p.run_count, p.misses)
        self.cpu_ns = cpu_ns()  # the process's: start-up (compiling the probes) included
        self.rss_bytes = rss_bytes()

    @property
    def bpf_run_ns(self) -> int:
        return sum(p.run_ns for p in self.programs.values())

    @property
    def bpf_run_count(self) -> int:
        return sum(p.run_count for p in self.programs.values())

    def misses_by_program(self) -> dict[str, int]:
        """{program: runs the kernel skipped}, of the programs that missed any."""
        names = _unique_names(self.programs)
        return {names[i]: p.misses for i, p in self.programs.items() if p.misses}

    def by_program(self) -> tuple[dict[str, int], dict[str, int]]:
        """({program: run ns}, {program: runs})."""
        names = _unique_names(self.programs)
        return ({names[i]: p.run_ns for i, p in self.programs.items()},
                {names[i]: p.run_count for i, p in self.programs.items()})

    def interval(self, now_ns: int | None = None) -> float:
        """Sample, then the overhead share since the previous call (or start);
        the steady cost, not counting what happened before :meth:`start`."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        spent_cpu = self.cpu_ns - self.started_cpu_ns
        last = self._last or (self.started_mono_ns, 0, 0)
        elapsed = now_ns - last[0]
        if elapsed > 0:
            d_bpf, d_cpu = self.bpf_run_ns - last[1], spent_cpu - last[2]
            self.last_share = (overhead_share(d_bpf, 0, elapsed, self.cpus),
                               overhead_share(0, d_cpu, elapsed, self.cpus))
            self._last = (now_ns, self.bpf_run_ns, spent_cpu)
        return sum(self.last_share)

    def record_fields(self) -> dict:
        """The CollectorStats fields, the overhead share over the interval
        since the previous call (the figures as of the last sample)."""
        self.interval()
        run_ns, runs = self.by_program()
        return {"cpu_ns": self.cpu_ns, "rss_bytes": self.rss_bytes, "bpf_run_ns": self.bpf_run_ns,
                "bpf_run_count": self.bpf_run_count, "bpf_run_ns_by_program": run_ns,
                "bpf_run_count_by_program": runs, "online_cpus": self.cpus,
                "overhead_share": sum(self.last_share)}

    def summary(self, now_ns: int | None = None) -> dict:
        """The whole run's figures since :meth:`start` (for collector-final.json)."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        elapsed = now_ns - self.started_mono_ns
        spent_cpu = self.cpu_ns - self.started_cpu_ns
        bpf = overhead_share(self.bpf_run_ns, 0, elapsed, self.cpus)
        collector = overhead_share(0, spent_cpu, elapsed, self.cpus)
        return {"elapsed_ns": elapsed, "startup_cpu_ns": self.started_cpu_ns, "online_cpus": self.cpus,
                "cpu_ns": self.cpu_ns, "rss_bytes": self.rss_bytes, "bpf_run_ns": self.bpf_run_ns,
                "bpf_run_count": self.bpf_run_count, "bpf_stats": self.stats.how, "bpf_share": bpf,
                "collector_share": collector, "overhead_share": bpf + collector,
                "bpf_recursion_misses": self.misses_by_program()}

    def export(self, probes=()) -> None:
        """Sample, then feed the Prometheus metrics from the running totals
        (one call). ``probes``: objects with ``program_fds()``, for full names."""
        self.sample(program_names(probes))
        self._add(CPU_SECONDS, self.cpu_ns)
        RSS_BYTES.set(self.rss_bytes)
        run_ns, runs = self.by_program()
        for name, ns in run_ns.items():
            self._add(BPF_RUN_SECONDS, ns, name)
            self._add(BPF_RUN_COUNT, runs[name], name)
        for name, misses in self.misses_by_program().items():
            self._add(BPF_MISSES, misses, name)
        OVERHEAD.set(sum(self.last_share))

    def _add(self, counter, total: int, *labels: str) -> None:
        key = (counter, labels)
        delta = total - self._exported.get(key, 0)
        if delta > 0:
            scale = 1e-9 if counter is CPU_SECONDS or counter is BPF_RUN_SECONDS else 1
            (counter.labels(*labels) if labels else counter).inc(delta * scale)
        self._exported[key] = total
