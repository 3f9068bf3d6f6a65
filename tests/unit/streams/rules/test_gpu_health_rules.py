# SPDX-License-Identifier: Apache-2.0
"""What the worker makes of a GPU's own reports, on the 2-socket 8-GPU
fixture: an Xid is an ``xid`` alert naming the GPU, its node, the process
and NVIDIA's meaning and remedy (an unknown code by number); a GPU clocked
down for power, heat or hardware is a ``gpu_throttle`` alert (idle or a
clock setting is none); repeats per GPU and code are folded; requests on
that GPU during an Xid or a slowdown name it, requests on another GPU or
outside the window do not, and it is the cause only where nothing on the
CPU side explains the excess."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from jitterscope.collector import topology as t
from jitterscope.schemas import events, topics
from jitterscope.schemas.gpu_health import XIDS
from jitterscope.streams.attribution import Attributor
from jitterscope.streams.handlers import Handlers
from jitterscope.streams.rules import nvml, xid
from jitterscope.streams.rules.base import Thresholds
from jitterscope.streams.rules.requests import request_slo
from tests.fixtures.sysfs_builder import build_host
from tests.unit.streams.rules.test_hardware_rules import GPU0, GPU4, State, process
from tests.unit.streams.test_attribution import GRACE, MS, T0, baseline, due_after, span, wait

T = Thresholds.defaults()
COMMON = (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 94, 95, 119)


@pytest.fixture(scope="module")
def topo(tmp_path_factory):
    host = build_host(tmp_path_factory.mktemp("host"))
    return events.Topology(host="gpu-a1", boot_id="b", seq=0, ts_ns=T0, **t.read_topology(host.sys, host.proc, nvml=False))


def an_xid(code=79, pci=GPU4, at_ms=0.0, pid=4242, host="gpu-a1", gpu="nvidia4") -> events.GpuXid:
    return events.GpuXid(host=host, boot_id="b", seq=int(at_ms * 1000), ts_ns=T0 + int(at_ms * MS), xid=code, pci=pci,
                         gpu=gpu, pid=pid, comm="vllm" if pid else "", message="GPU has fallen off the bus.")


def reading(names=("hw_thermal_slowdown",), pci=GPU4, end_ms=1000.0, interval_ms=1000.0, host="gpu-a1"):
    return events.GpuTelemetry(host=host, boot_id="b", seq=int(end_ms), ts_ns=T0 + int(end_ms * MS), pci=pci,
                               gpu="4", interval_ns=int(interval_ms * MS), sm_clock_mhz=705, sm_clock_max_mhz=1410,
                               throttle=list(names), temperature_c=91, power_mw=250_000)


def test_the_common_codes_have_nvidia_meanings_and_remedies():
    assert set(COMMON) <= set(XIDS)
    assert all(XIDS[c].meaning and XIDS[c].remedy and XIDS[c].severity in ("warning", "critical") for c in XIDS)


def test_an_xid_alert_names_the_gpu_its_node_the_process_and_the_remedy(topo):
    state = State(topo, [process()])
    alert = xid.judge(an_xid(), state, T, T0)
    assert alert.kind == "xid" and alert.severity == "critical" and (alert.pid, alert.comm) == (4242, "vllm")
    assert alert.summary == ("Xid 79 on GPU nvidia4 (0000:83:00.0, node 1), process vllm (pid 4242): GPU has fallen "
                             "off the bus: it no longer answers on PCIe [GPU has fallen off the bus.]")
    assert "reboot" in alert.remedy
    assert alert.evidence == {"xid": "79", "gpu": "nvidia4", "pci": GPU4, "message": "GPU has fallen off the bus."}
    assert xid.judge(an_xid(13, pid=0), state, T, T0).severity == "warning"
    unknown = xid.judge(an_xid(250, pci="0000:ff:00.0", gpu=""), state, T, T0)
    assert "Xid 250 on the GPU at 0000:ff:00.0 (not in this host's topology)" in unknown.summary
    assert "analyzing-xid-catalog" in unknown.remedy


def test_a_gpu_throttle_alert_only_for_slowdowns(topo):
    state = State(topo, [])
    assert nvml.judge(reading(("gpu_idle", "applications_clocks", "sync_boost")), state, T, T0) is None
    hot = nvml.judge(reading(("sw_power_cap", "hw_thermal_slowdown")), state, T, T0)
    assert hot.kind == "gpu_throttle" and hot.severity == "critical"
    assert hot.summary == ("GPU 4 (0000:83:00.0) clocked down: sw_power_cap, hw_thermal_slowdown "
                           "(SM 705 MHz of 1410, 91 C, 250 W)")
    assert "nvidia-smi -pl" in hot.remedy and "cooling" in hot.remedy
    assert nvml.judge(reading(("sw_power_cap",)), state, T, T0).severity == "warning"


def test_the_handlers_fold_repeats_and_feed_the_attributor(topo):
    attributor = Attributor(grace_ns=GRACE)
    judge = Handlers(State(topo, [process()]), attributor=attributor)
    alerts = asyncio.run(judge.handle(topics.GPU_XID, [an_xid(13, at_ms=i) for i in range(3)] + [an_xid(79)], T0))
    assert [a.evidence["xid"] for a in alerts] == ["13", "79"], "13 comes in threes: one alert"
    assert asyncio.run(judge.handle(topics.GPU_XID, [an_xid(13, pci=GPU0, gpu="nvidia0")], T0 + 1)), "another GPU"
    assert len(asyncio.run(judge.handle(topics.GPU_TELEMETRY, [reading(), reading(end_ms=2000)], T0))) == 1
    attributor.add_request(span("on-gpu4", 0, 2, pid=4242, host="gpu-a1"))
    [done] = attributor.due(T0 + 2 * MS + GRACE)
    assert done.gpu_xid == 13 and done.gpu_throttle == ["hw_thermal_slowdown"]


class Book:
    def __init__(self, *infos):
        self.processes = {(p.host, p.pid): p for p in infos}

    def serving_group(self, host, pid):
        return {pid}


def info(pid, gpus, host="h1"):
    return events.ProcessInfo(host=host, boot_id="b", seq=pid, ts_ns=T0, pid=pid, comm="vllm", cmdline="vllm",
                              cgroup="/", cpus_allowed=[0], gpus=list(gpus))


def test_requests_in_the_window_on_that_gpu_name_the_xid():
    a = Attributor(grace_ns=GRACE, processes=Book(info(100, [GPU4]), info(200, [GPU0])))
    baseline(a)
    a.add_evidence(an_xid(79, at_ms=50, host="h1"))
    a.add_evidence(an_xid(31, at_ms=500, host="h1"))
    for request in (span("slow-on-gpu4", 0, 80, pid=100), span("slow-on-gpu0", 0, 80, pid=200),
                    span("before", -50, -10, pid=100), span("other-host", 0, 80, pid=100, host="h2")):
        a.add_request(request)
    done = {r.request_id: r for r in due_after(a, 80)}
    assert (done["slow-on-gpu4"].gpu_xid, done["slow-on-gpu4"].cause) == (79, "gpu_xid")
    assert done["slow-on-gpu4"].culprit == "Xid 79 on GPU nvidia4: GPU has fallen off the bus: it no longer answers on PCIe"
    assert (done["slow-on-gpu0"].gpu_xid, done["slow-on-gpu0"].cause) == (0, "unexplained")
    assert done["before"].gpu_xid == 0 and done["other-host"].gpu_xid == 0


def test_a_cpu_side_cause_stays_the_cause_and_the_xid_is_still_named():
    a = Attributor(grace_ns=GRACE, processes=Book(info(100, [GPU4])))
    baseline(a)
    a.add_evidence(wait(60, 55, pid=100))
    a.add_evidence(an_xid(13, at_ms=20, host="h1"))
    a.add_request(span("starved", 0, 80, pid=100))
    [done] = due_after(a, 80)
    assert (done.cause, done.gpu_xid) == ("runq_starvation", 13)


def test_a_slowdown_overlapping_the_request_names_it_and_is_the_cause_when_nothing_else_is():
    a = Attributor(grace_ns=GRACE, processes=Book(info(100, [GPU4]), info(200, [GPU0])))
    baseline(a)
    a.add_evidence(reading(("sw_power_cap",), end_ms=40, interval_ms=1000, host="h1"))  # covers the request's first 40 ms
    a.add_evidence(reading(("gpu_idle",), end_ms=1040, interval_ms=1000, host="h1"))  # not a slowdown
    a.add_evidence(reading(("hw_slowdown",), pci=GPU0, end_ms=1040, interval_ms=1000, host="h1"))
    a.add_request(span("on-gpu4", 0, 80, pid=100))
    a.add_request(span("unknown-gpus", 0, 80, pid=300))  # no process record: any GPU of the host
    a.add_request(span("later", 2000, 2080, pid=100))
    done = {r.request_id: r for r in due_after(a, 2080)}
    assert (done["on-gpu4"].cause, done["on-gpu4"].gpu_throttle) == ("gpu_throttle", ["sw_power_cap"])
    assert done["on-gpu4"].culprit == "sw_power_cap on GPU 4"
    assert done["unknown-gpus"].gpu_throttle == ["sw_power_cap", "hw_slowdown"]
    assert done["later"].gpu_throttle == [] and done["later"].cause != "gpu_throttle"


def test_the_request_alert_says_what_the_gpu_did_and_its_remedy():
    a = Attributor(grace_ns=GRACE, processes=Book(info(100, [GPU4])))
    baseline(a)
    a.add_evidence(an_xid(48, at_ms=30, host="h1"))
    a.add_evidence(reading(("hw_slowdown",), end_ms=2040, host="h1"))
    a.add_request(span("xid", 0, 80, pid=100))
    a.add_request(span("slow-clocks", 2000, 2080, pid=100))
    done = {r.request_id: msgspec.structs.replace(r, slo_ns=20 * MS, slo_breached=True) for r in due_after(a, 2080)}
    xid_alert = request_slo(done["xid"], "vllm", [0, 1], [0, 1, 2, 3], T0)
    assert "its GPU logged Xid 48 during it (double-bit ECC error" in xid_alert.summary
    assert xid_alert.remedy.startswith("Xid 48 on GPU nvidia4: double-bit ECC error") and "reset" in xid_alert.remedy
    clocks = request_slo(done["slow-clocks"], "vllm", [0, 1], [0, 1, 2, 3], T0)
    assert "its GPU was clocked down during it (hw_slowdown)" in clocks.summary
    assert clocks.remedy.startswith("hardware slowdown: clocks cut by half or more")
    assert (xid_alert.evidence["gpu_xid"], clocks.evidence["gpu_throttle"]) == ("48", "hw_slowdown")
    assert "gpu_throttle" not in xid_alert.evidence and "gpu_xid" not in clocks.evidence
