# SPDX-License-Identifier: Apache-2.0
"""An inference server stand-in that traces its requests the way vLLM does.

Each "request" burns --cpu-ms of CPU (half "prefill", half "decode") and is
exported as an OpenTelemetry SERVER span with vLLM's attributes
(gen_ai.request.id, gen_ai.latency.*) over OTLP/HTTP protobuf, so the
collector's OTLP receiver can be exercised without a GPU or a model.

CPU work is measured in thread CPU time, so a starved stand-in takes longer
wall time for the same work: exactly the tail jitterscope explains.

It prints a progress line every 100 requests and a summary (wall-time
percentiles); with --times, one ``request_id start_ns end_ns`` line per
request (epoch ns, as in the span) instead, for a program to read.

    python examples/inference_standin.py --requests 100 --cpu-ms 20 --gap-ms 50

--gil-hog FIRST:LAST starts a second thread of pure-Python CPU work, on other
CPUs than the serving thread's, while requests FIRST..LAST-1 are served: the
CPUs stay free, and the serving thread waits for the interpreter lock (GIL)
instead, as a Python front end does beside a busy tokenizer or engine loop.
--disk-read FIRST:LAST makes requests FIRST..LAST-1 each read --disk-read-mb
from disk, bypassing the page cache (O_DIRECT): the thread is blocked in I/O
(from a scratch file, or from --disk-read-from: a file or a block device).
--weights-mb N maps an N MiB "weights" file and reads every page of it in each
request, as a model's forward pass does: from the page cache, normally; from
disk when something evicted it (a neighbour filling a shared memory limit).
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import tempfile
import sys
import threading
import time

import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

PR_SET_NAME = 15
PROCESS_NAME = b"jsinfer"  # what --comm filters of the collector target


def set_process_name(name: bytes) -> None:
    """Names the calling (main) thread, which is the process's comm; threads
    started afterwards (the span exporter's) inherit it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the name only matters to the collector's filters


def burn_cpu(ms: float) -> None:
    """Busy-loop until this thread has had ``ms`` of CPU time."""
    until = time.thread_time_ns() + int(ms * 1e6)
    x = 0
    while time.thread_time_ns() < until:
        for _ in range(1000):
            x += 1


class RunDelay:
    """How long this process's threads have waited runnable for a CPU, in
    all (each thread's /proc schedstat, 2nd field): the kernel's own count,
    the ground truth the tests set beside what jitterscope saw. The serving
    thread's own waits count, and those of a thread that kept it waiting
    (the span exporter, holding the GIL or the span queue's lock), but not
    the GIL hog's: the injected cause, which waits whenever the server
    holds the GIL. Read through
    libc with the GIL held (ctypes.PyDLL): Python's own reads release it,
    and beside the GIL hog each release would cost the request a switch
    interval (5 ms) of GIL wait it does not otherwise have."""

    def __init__(self):
        self._pread = ctypes.PyDLL(None).pread
        self._buffer = ctypes.create_string_buffer(128)
        self._files: dict[int, int] = {}  # native thread id -> its schedstat, open
        self._last: dict[int, int] = {}  # native thread id -> its count when last read

    def _read(self, fd: int) -> int:
        size = self._pread(fd, self._buffer, len(self._buffer) - 1, ctypes.c_long(0))
        if size <= 0:
            raise OSError(f"reading a thread's schedstat: pread returned {size}")
        return int(self._buffer.raw[:size].split()[1])

    def ns(self, without: int | None = None) -> int:
        """The sum, less the thread ``without``'s count."""
        for thread in threading.enumerate():  # a new thread's file is opened once (that open lets the GIL go)
            if thread.native_id not in self._files:
                self._files[thread.native_id] = os.open(f"/proc/self/task/{thread.native_id}/schedstat", os.O_RDONLY)
        for tid, fd in list(self._files.items()):
            try:
                self._last[tid] = self._read(fd)
            except OSError:  # the thread ended: its last count stays in the sum
                os.close(self._files.pop(tid))
        return sum(count for tid, count in self._last.items() if tid != without)


class GilHog:
    """A thread that runs pure Python (holding the GIL) until stopped; its
    native thread id is what jitterscope should name as the GIL holder."""

    def __init__(self, cpus: set[int], nice: int = 0):
        self.cpus = cpus
        self.nice = nice
        self.running = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gil-hog", daemon=True)

    def start(self) -> None:
        self.thread.start()
        self.running.wait()

    def _run(self) -> None:
        if self.cpus:  # CPUs of its own: the serving thread waits for the GIL, not for a CPU
            os.sched_setaffinity(0, self.cpus)
        if self.nice:  # this thread only (Linux: a thread id is a process id to setpriority)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        set_process_name(b"gil-hog")  # this thread's name, as the holder jitterscope names
        self.tid = threading.get_native_id()
        self.running.set()
        x = 0
        while not self.stopping.is_set():
            for _ in range(1000):
                x += 1

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()


PAGE = 4096


def scratch_file(directory: str | None, prefix: str, size: int) -> str:
    """A new file of ``size`` random bytes, written out to the disk (os.sync):
    its pages are clean, so reclaim can drop them and a read goes to the device."""
    with tempfile.NamedTemporaryFile(dir=directory, prefix=prefix, delete=False) as f:
        for done in range(0, size, 1 << 20):
            f.write(os.urandom(min(1 << 20, size - done)))
    os.sync()
    return f.name


class DiskReader:
    """Reads that the page cache cannot serve (O_DIRECT), each at the next
    offset: the serving thread blocks until the disk answers. Of ``path`` (a
    file or a block device, left as it is) or of a new scratch file in
    ``directory``, removed at close."""

    FILE_MB = 64

    def __init__(self, directory: str | None, read_mb: float, path: str | None = None):
        self.size = int(read_mb * (1 << 20)) // PAGE * PAGE or PAGE
        self.scratch = None if path else scratch_file(directory, "jsinfer-disk-", max(self.FILE_MB << 20, self.size))
        self.fd = os.open(path or self.scratch, os.O_RDONLY | os.O_DIRECT)
        self.buffer = mmap.mmap(-1, self.size)  # page-aligned, as O_DIRECT wants
        self.offset = 0
        self.file_size = os.lseek(self.fd, 0, os.SEEK_END)  # a block device's st_size is 0

    def read(self) -> None:
        if self.offset + self.size > self.file_size:
            self.offset = 0
        os.preadv(self.fd, [self.buffer], self.offset)
        self.offset += self.size

    def close(self) -> None:
        os.close(self.fd)
        if self.scratch:
            os.unlink(self.scratch)


class Weights:
    """A file mapped into memory, every page read by each request."""

    def __init__(self, directory: str | None, size_mb: float):
        size = int(size_mb * (1 << 20)) // PAGE * PAGE or PAGE
        self.path = scratch_file(directory, "jsinfer-weights-", size)
        with open(self.path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        self.read()  # warm: in the page cache from the start

    def read(self) -> int:
        return sum(self.map[offset] for offset in range(0, len(self.map), PAGE))

    def close(self) -> None:
        self.map.close()
        os.unlink(self.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="http://127.0.0.1:4318/v1/traces")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--cpu-ms", type=float, default=10.0, help="CPU time per request")
    parser.add_argument("--gap-ms", type=float, default=10.0, help="sleep between requests")
    parser.add_argument("--no-pid", action="store_true",
                        help="leave process.pid out of the resource (the collector then finds it from the connection)")
    parser.add_argument("--name", default="llm_request", help="span name")
    parser.add_argument("--id-prefix", default="req-", help="request IDs are PREFIX0, PREFIX1, ...")
    parser.add_argument("--pin-cpu", type=int, default=None,
                        help="pin the serving thread (only) to this CPU, as servers pin their GPU feeder")
    parser.add_argument("--times", action=argparse.BooleanOptionalAction, default=False,
                        help="one 'request_id start_ns end_ns' line per request, for a program to read (default: "
                             "progress and a summary, piped or not)")
    parser.add_argument("--cpu-times", action="store_true",
                        help="with --times, two more fields: the serving thread's CPU time during the request, and "
                             "the run delay of its threads but the GIL hog (runnable, waiting for a CPU: the kernel's schedstat), in ns")
    parser.add_argument("--gil-hog", default=None, metavar="FIRST:LAST",
                        help="a pure-Python thread holds the GIL while requests FIRST..LAST-1 are served")
    parser.add_argument("--disk-read", default=None, metavar="FIRST:LAST",
                        help="requests FIRST..LAST-1 each read --disk-read-mb from disk, past the page cache")
    parser.add_argument("--disk-read-mb", type=float, default=4.0)
    parser.add_argument("--disk-read-from", default=None, metavar="PATH",
                        help="--disk-read reads this file or block device (default: a scratch file in --scratch)")
    parser.add_argument("--weights-mb", type=float, default=0, help="map a weights file of this size, read in each request")
    parser.add_argument("--scratch", default=None, help="where --disk-read's file goes (default: the temp dir)")
    parser.add_argument("--gil-hog-nice", type=int, default=0,
                        help="the GIL hog's nice value (negative needs root): a CPU mostly to itself")
    parser.add_argument("--hold-at", type=int, action="append", default=[], metavar="N",
                        help="before request N, wait for a line on stdin (a test's cue that its probes are ready, "
                             "or that a cause it injects is in place); may be given more than once")
    args = parser.parse_args(argv)
    hog_first, hog_last = map(int, args.gil_hog.split(":")) if args.gil_hog else (-1, -1)
    hog: GilHog | None = None
    read_first, read_last = map(int, args.disk_read.split(":")) if args.disk_read else (-1, -1)
    disk = DiskReader(args.scratch, args.disk_read_mb, args.disk_read_from) if args.disk_read else None
    weights = Weights(args.scratch, args.weights_mb) if args.weights_mb else None
    times = args.times
    walls_ms: list[float] = []
    run_delay = RunDelay() if args.cpu_times else None

    set_process_name(PROCESS_NAME)
    attributes = {"service.name": "inference-standin"}
    if not args.no_pid:
        attributes["process.pid"] = os.getpid()
    # Resource(...) rather than Resource.create(...): no detectors or
    # OTEL_RESOURCE_ATTRIBUTES, so --no-pid really sends no pid.
    provider = TracerProvider(resource=Resource(attributes))
    # A session that ignores *_PROXY variables: the spans must come from this
    # process's own connection, which is how the collector tells who sent them.
    session = requests.Session()
    session.trust_env = False
    # export every 200 ms (the SDK default is 5 s), so the demo's spans arrive promptly
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=args.endpoint, session=session), schedule_delay_millis=200))
    tracer = provider.get_tracer("jitterscope.examples.inference_standin")

    hog_cpus = os.sched_getaffinity(0) - {args.pin_cpu}
    if args.pin_cpu is not None:
        # Linux affinity is per thread: the exporter thread, started above,
        # keeps the process's CPUs; only the thread serving requests moves.
        os.sched_setaffinity(0, {args.pin_cpu})
    for i in range(args.requests):
        if i in args.hold_at:
            sys.stdin.readline()
        if i == hog_first:
            hog = GilHog(hog_cpus, args.gil_hog_nice)
            hog.start()
            if times:
                print("gil-hog", hog.tid, flush=True)
        if i == hog_last and hog:
            hog.stop()
            hog = None
        request_id = f"{args.id_prefix}{i}"
        # thread.id: the thread serving it (OpenTelemetry semantic conventions), whose time jitterscope accounts
        span = tracer.start_span(args.name, kind=SpanKind.SERVER, attributes={
            "gen_ai.request.id": request_id, "thread.id": threading.get_native_id()})
        started = time.perf_counter()
        cpu_started = time.thread_time_ns()
        delay_started = run_delay.ns(without=hog and hog.tid) if run_delay else 0
        if disk and read_first <= i < read_last:
            disk.read()
        if weights:
            weights.read()
        burn_cpu(args.cpu_ms / 2)
        first_token = time.perf_counter()
        burn_cpu(args.cpu_ms / 2)
        done = time.perf_counter()
        cpu_ns = time.thread_time_ns() - cpu_started
        delay_ns = run_delay.ns(without=hog and hog.tid) - delay_started if run_delay else 0
        span.set_attributes({
            "gen_ai.latency.time_in_queue": 0.0,
            "gen_ai.latency.time_in_model_prefill": first_token - started,
            "gen_ai.latency.time_in_model_decode": done - first_token,
            "gen_ai.latency.time_to_first_token": first_token - started,
            "gen_ai.latency.e2e": done - started,
        })
        span.set_status(Status(StatusCode.OK))
        span.end()
        if times:
            print(request_id, span.start_time, span.end_time, *([cpu_ns, delay_ns] if args.cpu_times else []),
                  flush=True)
        else:
            walls_ms.append((span.end_time - span.start_time) / 1e6)
            if len(walls_ms) % 100 == 0:
                print(f"{len(walls_ms)}/{args.requests} requests, last 100: {summary(walls_ms[-100:])}", flush=True)
        if args.gap_ms > 0:
            time.sleep(args.gap_ms / 1000)

    if hog:
        hog.stop()
    if disk:
        disk.close()
    if weights:
        weights.close()
    if walls_ms:
        print(f"done: {len(walls_ms)} requests of {args.cpu_ms:g} ms CPU each: {summary(walls_ms)}")
    return flush_spans(provider, args.endpoint)


def summary(walls_ms: list[float]) -> str:
    """Wall-time percentiles: a starved request takes longer for the same CPU work."""
    ordered = sorted(walls_ms)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return f"wall p50 {at(0.5):.1f} ms, p99 {at(0.99):.1f} ms, max {ordered[-1]:.1f} ms"


def flush_spans(provider: TracerProvider, endpoint: str) -> int:
    """Send the spans still queued; the exit status: 1 when they could not go."""
    flushed = provider.force_flush(30_000)
    provider.shutdown()
    if not flushed:
        print("could not flush spans to", endpoint, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
