# SPDX-License-Identifier: Apache-2.0
"""A stand-in NVIDIA driver and an inference server that calls it, for hosts
without a GPU.

The driver: a FUSE file system (the kernel's own FUSE, spoken here over
/dev/fuse directly: no libfuse, no PyPI package) whose root holds one regular
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
import stat
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

from jitterscope.schemas import nvidia

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


def request_code(name: str) -> int:
    """The request number user space passes for the named call."""
    return nvidia.ioctl_request(name, PARAM_SIZES.get(name, 32))


def params_bytes(request: int) -> int:
    size = (request >> 16) & 0x3FFF
    return size if (request >> 8) & 0xFF == nvidia.NV_IOCTL_MAGIC else UVM_PARAMS_BYTES


# --- the kernel interfaces: unshare, mount, FUSE -------------------------------------

CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 1 << 18
MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None = None, flags: int = 0,
          data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
           f"mount {source} on {target}")


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


def private_mount_namespace() -> None:
    """This process (call it before starting threads) gets its own copy of
    the mount table, and no mount made here propagates back."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


# include/uapi/linux/fuse.h
FUSE_LOOKUP, FUSE_FORGET, FUSE_GETATTR = 1, 2, 3
FUSE_OPEN, FUSE_STATFS, FUSE_RELEASE, FUSE_FLUSH, FUSE_INIT = 14, 17, 18, 25, 26
FUSE_OPENDIR, FUSE_READDIR, FUSE_RELEASEDIR, FUSE_INTERRUPT, FUSE_DESTROY = 27, 28, 29, 36, 38
FUSE_IOCTL, FUSE_BATCH_FORGET = 39, 42
FOPEN_DIRECT_IO, FOPEN_NONSEEKABLE = 1, 4
IN_HEADER = struct.Struct("<IIQQIIIHH")   # fuse_in_header: len opcode unique nodeid uid gid pid extlen pad
OUT_HEADER = struct.Struct("<IiQ")        # fuse_out_header: len error unique
ATTR = struct.Struct("<6Q10I")            # fuse_attr
IOCTL_IN = struct.Struct("<QIIQII")       # fuse_ioctl_in: fh flags cmd arg in_size out_size
IOCTL_OUT = struct.Struct("<iIII")        # fuse_ioctl_out: result flags in_iovs out_iovs
ROOT_ID = 1
FUSE_MINOR = 31  # what this server speaks; the kernel adapts to it


class FuseDriver:
    """The stand-in driver: a FUSE file system of ``names`` (regular files,
    node ids 2, 3, ...) whose ioctls sleep ``latency_ns[request]`` (0 when
    not programmed). ``served`` counts the calls it answered by (name,
    request) and ``sizes`` keeps the bytes the kernel passed in and allowed
    out."""

    def __init__(self, names, latency_ns: dict[int, int]):
        self.nodes = {i + 2: name for i, name in enumerate(names)}
        self.by_name = {name: node for node, name in self.nodes.items()}
        self.latency_ns = dict(latency_ns)
        self.served: Counter[tuple[str, int]] = Counter()
        self.sizes: dict[tuple[str, int], tuple[int, int]] = {}
        self.fd = -1
        self._thread: threading.Thread | None = None
        self._now = int(time.time())

    def mount(self, mountpoint: str, fuse_fd: int) -> None:
        """Mount on ``mountpoint`` (a directory) through ``fuse_fd`` (an open
        /dev/fuse, now the driver's) and start serving."""
        self.fd = fuse_fd
        mount("jsgpu", mountpoint, "fuse.jsgpu", MS_NOSUID | MS_NODEV,
              f"fd={self.fd},rootmode=40000,user_id=0,group_id=0,allow_other")
        self._thread = threading.Thread(target=self._serve, name="fuse-driver", daemon=True)
        self._thread.start()

    # -- the protocol

    def _attr(self, node: int) -> bytes:
        mode = stat.S_IFDIR | 0o755 if node == ROOT_ID else stat.S_IFREG | 0o666
        return ATTR.pack(node, 0, 0, self._now, self._now, self._now, 0, 0, 0, mode,
                         2 if node == ROOT_ID else 1, 0, 0, 0, 4096, 0)

    def _reply(self, unique: int, payload: bytes = b"", error: int = 0) -> None:
        try:
            os.write(self.fd, OUT_HEADER.pack(OUT_HEADER.size + len(payload), -error, unique) + payload)
        except OSError as exc:  # ENOENT: the caller is gone (interrupted); ENODEV: unmounted
            if exc.errno not in (errno.ENOENT, errno.ENODEV):
                raise

    def _serve(self) -> None:
        while True:
            try:
                message = os.read(self.fd, 1 << 18)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.EAGAIN):
                    continue
                return  # ENODEV: unmounted, the connection is gone
            _len, opcode, unique, node, _uid, _gid, _pid, _ext, _pad = IN_HEADER.unpack_from(message)
            body = memoryview(message)[IN_HEADER.size:]
            if opcode in (FUSE_FORGET, FUSE_BATCH_FORGET, FUSE_INTERRUPT):
                continue  # no answer expected (an interrupted call still gets its own)
            if opcode == FUSE_DESTROY:
                self._reply(unique)
                return
            try:
                answer = self._answer(opcode, node, body)
            except Exception:  # a bug here must fail the caller's call, not hang it
                traceback.print_exc()
                answer = (b"", errno.EIO)
            self._reply(unique, *answer)

    def _answer(self, opcode: int, node: int, body: memoryview) -> tuple[bytes, int] | tuple[bytes]:
        if opcode == FUSE_INIT:
            major, minor, max_readahead, _flags = struct.unpack_from("<IIII", body)
            if major != 7:
                return b"", errno.EPROTO
            # fuse_init_out: major minor max_readahead flags max_background congestion_threshold
            # max_write time_gran max_pages map_alignment flags2 max_stack_depth, then unused
            return (struct.pack("<IIIIHHIIHHII", 7, min(minor, FUSE_MINOR), max_readahead, 0, 16, 12,
                                1 << 17, 1, 32, 0, 0, 0) + bytes(24),)
        if opcode == FUSE_LOOKUP:
            name = bytes(body).split(b"\0", 1)[0].decode()
            found = self.by_name.get(name) if node == ROOT_ID else None
            if found is None:
                return b"", errno.ENOENT
            # fuse_entry_out: nodeid generation entry_valid attr_valid entry_valid_nsec attr_valid_nsec attr
            return (struct.pack("<QQQQII", found, 0, 3600, 3600, 0, 0) + self._attr(found),)
        if opcode == FUSE_GETATTR:
            return (struct.pack("<QII", 3600, 0, 0) + self._attr(node),)
        if opcode in (FUSE_OPEN, FUSE_OPENDIR):
            flags = FOPEN_DIRECT_IO | FOPEN_NONSEEKABLE if opcode == FUSE_OPEN else 0
            return (struct.pack("<QIi", node, flags, 0),)  # fuse_open_out: fh open_flags backing_id
        if opcode in (FUSE_READDIR, FUSE_RELEASE, FUSE_RELEASEDIR, FUSE_FLUSH):
            return (b"",)  # an empty directory listing; nothing to release or flush
        if opcode == FUSE_STATFS:  # fuse_kstatfs: blocks bfree bavail files ffree bsize namelen frsize pad spare[6]
            return (struct.pack("<5Q4I", 0, 0, 0, len(self.nodes), 0, 4096, 255, 4096, 0) + bytes(24),)
        if opcode == FUSE_IOCTL:
            _fh, _flags, cmd, _arg, in_size, out_size = IOCTL_IN.unpack_from(body)
            key = (self.nodes.get(node, "?"), cmd)
            sleep_ns = self.latency_ns.get(cmd, 0)
            if sleep_ns:
                time.sleep(sleep_ns / 1e9)
            self.served[key] += 1
            self.sizes[key] = (in_size, out_size)
            return (IOCTL_OUT.pack(0, 0, 0, 0),)  # result 0, the caller's buffer left as it was
        return b"", errno.ENOSYS


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
    driver.mount(staging, fuse)
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
    _libc.prctl(15, ctypes.c_char_p(PROCESS_NAME), 0, 0, 0)  # PR_SET_NAME
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


def fuse_unavailable() -> str | None:
    """Why the stand-in cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (a private mount namespace and a FUSE mount)"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine"
    try:
        with open("/proc/filesystems") as f:
            if not any(line.split()[-1] == "fuse" for line in f if line.strip()):
                return "the kernel has no FUSE file system (CONFIG_FUSE_FS)"
    except OSError:
        pass
    return None


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
