# SPDX-License-Identifier: Apache-2.0
"""A stand-in NVIDIA driver and an inference server that calls it, for hosts
without a GPU.

The driver: a FUSE file system (tests/fuse_files.py: the kernel's own FUSE,
spoken over /dev/fuse directly, no libfuse) whose root holds one regular
file per device name. Its IOCTL handler sleeps the time programmed for the
request number, then answers 0. In a private mount namespace (of the server
process only: the host's /dev is untouched) a tmpfs covers /dev, keeps
null/zero/full/random/urandom from the real one, and each FUSE file is
bind-mounted at /dev/nvidia0, /dev/nvidia-uvm and /dev/nvidiactl. The
server opens them there, so /proc/PID/fd/N names /dev/nvidia0 to the
collector (in the host's namespace) as a real driver's file would, and its
ioctl(2) calls pass through sys_enter_ioctl/sys_exit_ioctl like the real
driver's: FUSE forwards any command on a regular file (restricted ioctl: the
kernel copies _IOC_SIZE bytes in and out as _IOC_DIR says; UVM's plain
numbers carry no size, so nothing is copied), with the number unchanged.

The server: each request is a SERVER span (``gen_ai.request.id``, sent over
OTLP/HTTP like examples/inference_standin.py when ``--endpoint`` is given)
around the driver calls planned for it, made from the serving (main) thread.
The daemon runs in a thread of the same process and serves one call at a
time (the server makes them one at a time). With ``--rt`` both run
SCHED_FIFO, so that other work on a loaded machine does not stretch the
programmed latencies (measured at a load average of 7 on 2 cores: a 60 ms
call took 60.2-60.4 ms with it, up to 69.7 ms without).

Run under root (``unshare`` and ``mount`` need CAP_SYS_ADMIN)::

    python tests/gpu_standin.py --latency NV_ESC_RM_CONTROL=60 \\
        --call nvidia0:NV_ESC_RM_CONTROL --requests 3 --no-wait

It prints one JSON line when the devices are open (``pid``, ``fds``,
``paths``), waits for a line on stdin (unless ``--no-wait``), serves the
requests, prints one JSON line with every (device, request): the calls made,
the calls the daemon served (and the bytes the kernel passed it), the
programmed latency and each call's as the caller measured it around
ioctl(2), and exits at end of stdin. ``GpuStandin`` runs it from a test.

Request encodings: ``_IOWR('F', NR, size)`` with NR from
``jitterscope.schemas.nvidia`` and the parameter sizes below, measured
(gcc, x86-64) from the headers of NVIDIA/open-gpu-kernel-modules at
df1c9a3de2be4b130f4fc7680f7198193d8ac6ad (595.45.04):
src/common/sdk/nvidia/inc/nvos.h (NVOSxx_PARAMETERS) and
src/nvidia/arch/nvalloc/unix/include/nv-ioctl.h,
nv-unix-nvos-params-wrappers.h (the *_with_fd wrappers).
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import fcntl
import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from jitterscope.schemas import nvidia

if not __package__:  # run as a script (GpuStandin runs it so): the checkout's root is not on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.fuse_files import (FOPEN_DIRECT_IO, FOPEN_NONSEEKABLE, FUSE_IOCTL, MNT_DETACH, MS_BIND,
                               MS_NOSUID, MS_NODEV, FuseFiles, mount, private_mount_namespace, umount)

#: sizeof the parameters user space passes with each RM call (see above)
PARAM_SIZES = {
    "NV_ESC_RM_CONTROL": 32,         # NVOS54_PARAMETERS
    "NV_ESC_RM_ALLOC": 48,           # NVOS64_PARAMETERS (NVOS21_PARAMETERS is 32)
    "NV_ESC_RM_FREE": 16,            # NVOS00_PARAMETERS
    "NV_ESC_RM_MAP_MEMORY": 56,      # nv_ioctl_nvos33_parameters_with_fd
    "NV_ESC_RM_UNMAP_MEMORY": 32,    # NVOS34_PARAMETERS
    "NV_ESC_RM_ALLOC_MEMORY": 56,    # nv_ioctl_nvos02_parameters_with_fd
    "NV_ESC_RM_DUP_OBJECT": 28,      # NVOS55_PARAMETERS
    "NV_ESC_RM_MAP_MEMORY_DMA": 64,  # NVOS46_PARAMETERS
    "NV_ESC_RM_UNMAP_MEMORY_DMA": 48,  # NVOS47_PARAMETERS
    "NV_ESC_CARD_INFO": 72,          # nv_ioctl_card_info_t (an array of them, one per GPU)
    "NV_ESC_IOCTL_XFER_CMD": 16,     # nv_ioctl_xfer_t
}
UVM_PARAMS_BYTES = 64  # the buffer a UVM call points at (its number encodes no size)
DEVICES = ("nvidia0", "nvidia-uvm", "nvidiactl")
PROCESS_NAME = b"jsgpuinfer"
RT_PRIORITY = 10  # --rt: low among real-time priorities (the kernel's threaded IRQs run at 50)


def driver_log_env(mark: str) -> dict[str, str]:
    """A collector's environment in which kernel-log lines carrying ``mark``
    are read as the NVIDIA driver's (tests/driver_standin/sitecustomize.py):
    a line written to /dev/kmsg from user space gets facility user, and only
    the kernel's lines are Xids (collector/probes/xid.py)."""
    standin = str(Path(__file__).resolve().parent / "driver_standin")
    return {"JITTERSCOPE_TEST_DRIVER_MARK": mark,
            "PYTHONPATH": os.pathsep.join(filter(None, [standin, os.environ.get("PYTHONPATH")]))}


def request_code(name: str) -> int:
    """The request number user space passes for the named call."""
    return nvidia.ioctl_request(name, PARAM_SIZES.get(name, 32))


def params_bytes(request: int) -> int:
    size = (request >> 16) & 0x3FFF
    return size if (request >> 8) & 0xFF == nvidia.NV_IOCTL_MAGIC else UVM_PARAMS_BYTES


# --- the driver: a FUSE file system (tests/fuse_files.py) whose ioctls sleep -----------

IOCTL_IN = struct.Struct("<QIIQII")       # fuse_ioctl_in: fh flags cmd arg in_size out_size
IOCTL_OUT = struct.Struct("<iIII")        # fuse_ioctl_out: result flags in_iovs out_iovs


class FuseDriver(FuseFiles):
    """The stand-in driver: a FUSE file system of ``names`` (regular files,
    node ids 2, 3, ...) whose ioctls sleep ``latency_ns[request]`` (0 when
    not programmed). ``served`` counts the calls it answered by (name,
    request) and ``sizes`` keeps the bytes the kernel passed in and allowed
    out."""

    open_flags = FOPEN_DIRECT_IO | FOPEN_NONSEEKABLE

    def __init__(self, names, latency_ns: dict[int, int]):
        super().__init__(names)
        self.latency_ns = dict(latency_ns)
        self.served: Counter[tuple[str, int]] = Counter()
        self.sizes: dict[tuple[str, int], tuple[int, int]] = {}

    def answer(self, opcode: int, node: int, body: memoryview) -> tuple[bytes, int] | tuple[bytes]:
        if opcode != FUSE_IOCTL:
            return b"", errno.ENOSYS
        _fh, _flags, cmd, _arg, in_size, out_size = IOCTL_IN.unpack_from(body)
        key = (self.nodes.get(node, "?"), cmd)
        sleep_ns = self.latency_ns.get(cmd, 0)
        if sleep_ns:
            time.sleep(sleep_ns / 1e9)
        self.served[key] += 1
        self.sizes[key] = (in_size, out_size)
        return (IOCTL_OUT.pack(0, 0, 0, 0),)  # result 0, the caller's buffer left as it was


def stand_in_devices(latency_ns: dict[int, int], names=DEVICES) -> FuseDriver:
    """In this process's own mount namespace (call before starting threads):
    a tmpfs /dev with the FUSE driver's files at /dev/<name>. Returns the
    running driver."""
    private_mount_namespace()
    host_dev = os.open("/dev", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # stays reachable under the tmpfs
    driver = FuseDriver(names, latency_ns)
    fuse = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    mount("jsgpu-dev", "/dev", "tmpfs", MS_NOSUID, "mode=0755,size=1m")
    for node in ("null", "zero", "full", "random", "urandom"):
        source = f"/proc/self/fd/{host_dev}/{node}"
        if os.path.exists(source):
            os.close(os.open(f"/dev/{node}", os.O_CREAT | os.O_WRONLY, 0o666))
            mount(source, f"/dev/{node}", None, MS_BIND)
    os.mkdir("/dev/shm", 0o1777)
    mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
    for link, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"/dev/{link}")
    staging = "/dev/.jsgpu"
    os.mkdir(staging, 0o700)
    driver.mount(staging, fuse, "jsgpu")
    for name in names:
        os.close(os.open(f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o666))
        mount(f"{staging}/{name}", f"/dev/{name}", None, MS_BIND)
    umount(staging, MNT_DETACH)  # the bind mounts keep the file system
    os.rmdir(staging)
    os.close(host_dev)
    return driver


# --- the inference server -----------------------------------------------------------


def parse_call(text: str) -> tuple[str, str]:
    device, _, name = text.partition(":")
    if device not in DEVICES:
        raise argparse.ArgumentTypeError(f"unknown device {device!r} (one of {', '.join(DEVICES)})")
    request_code(name)  # KeyError for an unknown name
    return device, name


def parse_once(text: str) -> tuple[int, str, str]:
    index, _, call = text.partition(":")
    return (int(index), *parse_call(call))


def parse_xid(text: str) -> tuple[int, str]:
    index, _, line = text.partition(":")
    return int(index), line if line.endswith("\n") else line + "\n"


def parse_sleep(text: str) -> tuple[int, float]:
    index, _, ms = text.partition(":")
    return int(index), float(ms)


def parse_latency(text: str) -> tuple[str, float]:
    name, _, ms = text.partition("=")
    request_code(name)
    return name, float(ms)


def tracer_for(endpoint: str | None):
    """(provider, tracer, SpanKind.SERVER) of an OTLP/HTTP exporter sending
    every 200 ms; Nones without an endpoint."""
    if not endpoint:
        return None, None, None
    import requests
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import SpanKind

    provider = TracerProvider(resource=Resource({"service.name": "gpu-standin", "process.pid": os.getpid()}))
    session = requests.Session()
    session.trust_env = False  # the spans must come from this process's own connection
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, session=session),
                                                   schedule_delay_millis=200))
    return provider, provider.get_tracer("jitterscope.tests.gpu_standin"), SpanKind.SERVER


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=parse_latency, action="append", default=[], metavar="NAME=MS",
                        help="the driver sleeps MS for every call of NAME (default 0)")
    parser.add_argument("--call", type=parse_call, action="append", default=[], metavar="DEVICE:NAME",
                        help="a call every request makes, in order (repeat)")
    parser.add_argument("--once", type=parse_once, action="append", default=[], metavar="INDEX:DEVICE:NAME",
                        help="a call request INDEX makes after its --call ones (repeat)")
    parser.add_argument("--xid", type=parse_xid, action="append", default=[], metavar="INDEX:LINE",
                        help="request INDEX writes LINE to the kernel log (/dev/kmsg) after its calls, as the "
                             "driver logs an Xid while a request's work runs (repeat)")
    parser.add_argument("--sleep", type=parse_sleep, action="append", default=[], metavar="INDEX:MS",
                        help="request INDEX sleeps MS after its calls: time no GPU probe sees (repeat)")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--gap-ms", type=float, default=2.0, help="sleep between requests")
    parser.add_argument("--endpoint", default=None, help="OTLP/HTTP traces URL (default: no spans)")
    parser.add_argument("--id-prefix", default="req-")
    parser.add_argument("--no-wait", action="store_true", help="start at once, exit when done")
    parser.add_argument("--rt", action="store_true",
                        help="run the server and its driver SCHED_FIFO (where allowed), so that a loaded "
                             "machine does not stretch the programmed latencies")
    args = parser.parse_args(argv)
    args.sleep = dict(args.sleep)

    latency_ns = {request_code(name): int(ms * 1e6) for name, ms in args.latency}
    realtime = False
    if args.rt:  # before any thread starts: they inherit it
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
            realtime = True
        except OSError:
            pass  # (an RT-less cgroup): the latencies are as the load allows
    # the host's kernel log, opened before /dev is covered
    kmsg = os.open("/dev/kmsg", os.O_WRONLY | os.O_CLOEXEC) if args.xid else -1
    driver = stand_in_devices(latency_ns)  # before any thread starts: the namespace is per thread
    ctypes.CDLL(None).prctl(15, ctypes.c_char_p(PROCESS_NAME), 0, 0, 0)  # PR_SET_NAME
    fds = {name: os.open(f"/dev/{name}", os.O_RDWR | os.O_CLOEXEC) for name in DEVICES}
    print(json.dumps({"pid": os.getpid(), "fds": fds, "realtime": realtime,
                      "paths": {name: os.readlink(f"/proc/self/fd/{fd}") for name, fd in fds.items()}}),
          flush=True)
    if not args.no_wait and not sys.stdin.readline():
        return 0
    provider, tracer, server_kind = tracer_for(args.endpoint)

    once = defaultdict(list)
    for index, device, name in args.once:
        once[index].append((device, name))
    calls: Counter[tuple[str, int]] = Counter()
    caller_ns: dict[tuple[str, int], list[int]] = defaultdict(list)
    spans = []
    for i in range(args.requests):
        request_id = f"{args.id_prefix}{i}"
        start = time.time_ns()
        span = tracer.start_span("llm_request", kind=server_kind, start_time=start,
                                 attributes={"gen_ai.request.id": request_id}) if tracer else None
        for device, name in [*args.call, *once.get(i, [])]:
            request = request_code(name)
            buffer = bytearray(params_bytes(request))
            t0 = time.perf_counter_ns()
            fcntl.ioctl(fds[device], request, buffer)
            caller_ns[(device, request)].append(time.perf_counter_ns() - t0)
            calls[(device, request)] += 1
        for line in (line for index, line in args.xid if index == i):
            # one write, one record (the kernel takes 10 a burst per open file); {pid}: this server's, as the driver names it
            os.write(kmsg, line.replace("{pid}", str(os.getpid())).encode())
        if i in args.sleep:
            time.sleep(args.sleep[i] / 1000)
        end = time.time_ns()
        if span:
            span.end(end_time=end)
        spans.append({"request_id": request_id, "start_ns": start, "end_ns": end})
        if args.gap_ms > 0:
            time.sleep(args.gap_ms / 1000)
    flushed = provider.force_flush(30_000) if provider else True

    print(json.dumps({
        "calls": [{"device": device, "request": request, "name": nvidia.ioctl_name(request),
                   "count": count, "served": driver.served[(device, request)],
                   "sizes": driver.sizes.get((device, request)),
                   "programmed_ns": latency_ns.get(request, 0), "caller_ns": caller_ns[(device, request)]}
                  for (device, request), count in sorted(calls.items())],
        "served_total": sum(driver.served.values()), "requests": spans, "spans_flushed": flushed}), flush=True)
    if provider:
        provider.shutdown()
    if not args.no_wait:
        sys.stdin.read()  # stay (devices open) until the test has read what it needs
    for fd in fds.values():
        os.close(fd)
    return 0


# --- from a test --------------------------------------------------------------------


class GpuStandin:
    """Runs the stand-in server (``main``'s arguments) as a child process:
    ``with GpuStandin([...]) as s:`` -- ``s.pid``, ``s.fds``, ``s.paths``
    (and ``s.realtime``: whether ``--rt`` took) once its devices are open; ``s.run()`` lets it serve and returns its
    summary; leaving the block ends it."""

    def __init__(self, args: list[str], timeout_s: float = 60.0):
        self.args = args
        self.timeout_s = timeout_s

    def __enter__(self) -> "GpuStandin":
        self.popen = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *self.args],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            ready = self._line()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.pid, self.fds, self.paths, self.realtime = ready["pid"], ready["fds"], ready["paths"], ready["realtime"]
        return self

    def _line(self) -> dict:
        """The child's next JSON line, within ``timeout_s`` (its exit or a
        stall fails the test, never hangs it)."""
        result: list[str] = []
        reader = threading.Thread(target=lambda: result.append(self.popen.stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.timeout_s)
        if not result or not result[0]:
            self.popen.kill()
            raise RuntimeError(f"the GPU stand-in said nothing within {self.timeout_s} s "
                               f"(exit status {self.popen.wait()})")
        return json.loads(result[0])

    def run(self) -> dict:
        self.popen.stdin.write("go\n")
        self.popen.stdin.flush()
        return self._line()

    def __exit__(self, *exc) -> None:
        try:
            self.popen.stdin.close()
            self.popen.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.popen.kill()
            self.popen.wait()


if __name__ == "__main__":
    sys.exit(main())
