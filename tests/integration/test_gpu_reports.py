# SPDX-License-Identifier: Apache-2.0
"""An Xid joined to a request through the whole pipeline: the GPU stand-in
server (tests/gpu_standin.py) sends its request spans to the real collector
and, in the middle of one request, writes an NVRM Xid line into the kernel
log and sleeps there (a hung kernel's wait, which no probe sees). The
collector's xid probe and OTLP receiver, Kafka, and the worker's attributor
must give that request, and no other, ``gpu_xid`` 79 and the cause
``gpu_xid`` in ClickHouse, beside the ``xid`` alert. This host has no GPU, so
no process record names one and a request takes any GPU of the host as its
own (streams/gpu_events.py); the mapping to the right GPU of several is
tests/bpf/test_xid.py's, on a fixture topology. The kernel gives a line
written from user space facility user, and only the kernel's lines are
Xids: the collector reads this test's own lines as the driver's
(tests/driver_standin/sitecustomize.py)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import span_pipeline, wait_until
from tests.gpu_standin import GpuStandin, driver_log_env

pytestmark = [pytest.mark.bpf, pytest.mark.integration]

REQUESTS, XID_REQUEST = 12, 6
DRIVER_MARK = f"jsdriver-{os.getpid()}"



@pytest.fixture(scope="module")
def pipeline(stack):
    yield span_pipeline(stack, JITTERSCOPE_HARDWARE_PROBES='["xid"]', **driver_log_env(DRIVER_MARK))


def test_the_request_in_the_xid_window_names_it_in_clickhouse(pipeline):
    stack, worker, _collector, otlp_port = pipeline
    prefix = f"xid-{os.getpid()}-"
    with GpuStandin(["--call=nvidia0:NV_ESC_RM_ALLOC", f"--requests={REQUESTS}", "--gap-ms=20",
                     f"--id-prefix={prefix}", f"--endpoint=http://127.0.0.1:{otlp_port}/v1/traces",
                     f"--xid={XID_REQUEST}:<3>NVRM: Xid (PCI:0000:3b:00): 79, pid={{pid}}, name=jsgpuinfer, "
                     f"GPU has fallen off the bus. {prefix}{DRIVER_MARK}", f"--sleep={XID_REQUEST}:150"]) as standin:
        summary = standin.run()
    assert len(summary["requests"]) == REQUESTS and summary["spans_flushed"]
    rows = wait_until(lambda: (r := stack.query(
        "SELECT request_id, gpu_xid, cause, culprit, pid FROM jitterscope.request_attribution FINAL "
        "WHERE startsWith(request_id, {p:String}) ORDER BY request_id", p=prefix)) and len(r) >= REQUESTS and r,
        90, "every request's attribution in ClickHouse", worker)
    named = {rid: (xid, cause, culprit) for rid, xid, cause, culprit, _pid in rows if xid}
    assert named == {f"{prefix}{XID_REQUEST}": (79, "gpu_xid", "Xid 79 on GPU 0000:3b:00.0: GPU has fallen off the "
                                                               "bus: it no longer answers on PCIe")}, rows
    assert {pid for *_, pid in rows} == {standin.pid}
    [[summary_line]] = wait_until(lambda: stack.query(
        "SELECT summary FROM jitterscope.alerts WHERE kind = 'xid' AND evidence['message'] = {m:String}",
        m=f"GPU has fallen off the bus. {prefix}{DRIVER_MARK}"), 30, "the xid alert", worker)
    assert summary_line.startswith(f"Xid 79 on the GPU at 0000:3b:00.0 (not in this host's topology), process "
                                   f"jsgpuinfer (pid {standin.pid})")
