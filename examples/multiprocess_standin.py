# SPDX-License-Identifier: Apache-2.0
"""A multi-process inference server stand-in, shaped like vLLM V1.

vLLM V1 (VLLM_ENABLE_V1_MULTIPROCESSING, on by default) runs the API server,
which emits the ``llm_request`` spans, and a separate ``VLLM::EngineCore``
child process that runs the engine loop; the API server hands each request
to the engine over a socket and waits for the result. This stand-in does the
same with a pipe: the front process ("jsfront") traces each request as an
OpenTelemetry SERVER span (OTLP/HTTP, like examples/inference_standin.py) and
sends the work to its engine child, which burns --cpu-ms of CPU time and
replies. Starve the engine's CPU and the front's requests get slow while the
front itself never waits for a CPU: only evidence from the serving group
(the span's process and its children) explains them.

The engine names itself "VLLM::EngineCor": vLLM sets its process title to
"VLLM::EngineCore", but a comm (what the kernel, ps -o comm and the
collector's --comm filters see) holds 15 characters, so the kernel keeps
exactly this prefix of vLLM's name.

Prints ``engine PID`` first, then ``request_id start_ns end_ns engine_wait_ns
front_wait_ns`` per request: the kernel's own count of the time the engine
and the front waited for a CPU during the request (``schedstat`` of all their
threads), the ground truth to check an attribution against on
a host that others load too.

    python examples/multiprocess_standin.py --requests 100 --cpu-ms 10 --gap-ms 15 --engine-cpu 1
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

import requests
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode

from inference_standin import burn_cpu, flush_spans, set_process_name  # the single-process stand-in's parts

FRONT_NAME = b"jsfront"
ENGINE_NAME = b"VLLM::EngineCore"[:15]  # the kernel's comm limit: "VLLM::EngineCor"


def runq_wait_ns(pid: int) -> int:
    """Time the process's threads spent runnable but waiting, per the kernel
    (all of them, as jitterscope counts a serving process's threads)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
        except FileNotFoundError:
            pass  # a thread that just ended
    return total


def engine(cpu: int | None) -> int:
    """The engine loop: one line of work in (CPU ms), one line out when done."""
    set_process_name(ENGINE_NAME)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    sys.stdout.write("ready\n")  # like vLLM's handshake: no request before the engine is up
    sys.stdout.flush()
    for line in sys.stdin:
        burn_cpu(float(line))
        sys.stdout.write("done\n")
        sys.stdout.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", default="http://127.0.0.1:4318/v1/traces")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=None, help="stop after this long, even before --requests")
    parser.add_argument("--cpu-ms", type=float, default=10.0, help="engine CPU time per request")
    parser.add_argument("--gap-ms", type=float, default=10.0, help="sleep between requests")
    parser.add_argument("--name", default="llm_request", help="span name")
    parser.add_argument("--id-prefix", default="req-", help="request IDs are PREFIX0, PREFIX1, ...")
    parser.add_argument("--engine-cpu", type=int, default=None, help="pin the engine process to this CPU")
    parser.add_argument("--engine", action="store_true", help=argparse.SUPPRESS)  # run as the engine child
    args = parser.parse_args(argv)
    if args.engine:
        return engine(args.engine_cpu)

    set_process_name(FRONT_NAME)
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--engine",
         *(["--engine-cpu", str(args.engine_cpu)] if args.engine_cpu is not None else [])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    if child.stdout.readline() != "ready\n":
        print("the engine did not start", file=sys.stderr)
        return 1
    print("engine", child.pid, flush=True)

    provider = TracerProvider(resource=Resource({"service.name": "multiprocess-standin", "process.pid": os.getpid()}))
    session = requests.Session()
    session.trust_env = False  # the spans come from this process's own connection
    provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=args.endpoint, session=session), schedule_delay_millis=200))
    tracer = provider.get_tracer("jitterscope.examples.multiprocess_standin")

    stop_at = time.monotonic() + args.seconds if args.seconds else float("inf")
    try:
        for i in range(args.requests):
            if time.monotonic() >= stop_at:
                break
            request_id = f"{args.id_prefix}{i}"
            # thread.id: the thread that carries it (OpenTelemetry semantic conventions), asleep on the engine
            span = tracer.start_span(args.name, kind=SpanKind.SERVER, attributes={
                "gen_ai.request.id": request_id, "thread.id": threading.get_native_id()})
            started = time.perf_counter()
            waited = (runq_wait_ns(child.pid), runq_wait_ns(os.getpid()))
            child.stdin.write(f"{args.cpu_ms}\n")
            if child.stdout.readline() != "done\n":
                print("the engine died", file=sys.stderr)
                return 1
            span.set_attributes({"gen_ai.latency.e2e": time.perf_counter() - started})
            span.set_status(Status(StatusCode.OK))
            span.end()
            print(request_id, span.start_time, span.end_time, max(0, runq_wait_ns(child.pid) - waited[0]),
                  max(0, runq_wait_ns(os.getpid()) - waited[1]), flush=True)
            if args.gap_ms > 0:
                time.sleep(args.gap_ms / 1000)
    finally:
        child.stdin.close()
        child.wait(10)
    return flush_spans(provider, args.endpoint)


if __name__ == "__main__":
    sys.exit(main())
