# SPDX-License-Identifier: Apache-2.0
"""streams/rules/requests.py: the request_slo remedy fits the cause the
attribution named (throttling -> the limit, interrupts -> the IRQ, a
neighbour -> move it), with the serving group's pids and the pod."""

from __future__ import annotations

from jitterscope.schemas.events import CgroupThrottle, IrqTime, RequestAttribution, Suspect
from jitterscope.streams.rules.requests import request_slo

MS = 1_000_000
NOW = 1_700_000_000_500_000_000


def attribution(**kw) -> RequestAttribution:
    fields = dict(host="gpu-a1", boot_id="b0", seq=7, ts_ns=NOW, request_id="req-42", trace_id="ab" * 16,
                  name="llm_request", pid=1234, start_ns=NOW - 400 * MS, end_ns=NOW, duration_ns=400 * MS,
                  baseline_ns=75 * MS, excess_ns=325 * MS, status="ok", runq_wait_ns=300 * MS,
                  runq_wait_max_ns=40 * MS, runq_waits=12, suspects=[Suspect(pid=0, comm="swapper/2", wait_ns=20 * MS)],
                  cause="runq_starvation", explained=0.92, slo_ns=375 * MS, slo_breached=True, pids=[1234, 1240])
    fields.update(kw)
    return RequestAttribution(**fields)


def throttle(**kw) -> CgroupThrottle:
    fields = dict(host="gpu-a1", boot_id="b0", seq=1, ts_ns=NOW, cgroup="/kubepods/burstable/pod1/abc",
                  interval_ns=1_000 * MS, quota_us=200_000, period_us=100_000, nr_periods=10, nr_throttled=9,
                  throttled_ns=700 * MS)
    fields.update(kw)
    return CgroupThrottle(**fields)


def irq(**kw) -> IrqTime:
    fields = dict(host="gpu-a1", boot_id="b0", seq=1, ts_ns=NOW, cpu=2, interval_ns=1_000 * MS, kind="hardirq",
                  source="57:mlx5_comp3", count=90_000, time_ns=400 * MS)
    fields.update(kw)
    return IrqTime(**fields)


def test_throttling_in_a_pod_names_the_pod_its_limit_and_the_cpu_manager():
    a = attribution(cause="cfs_throttling", throttled_ns=280 * MS, explained=0.86, pod="vllm-0",
                    namespace="serving", container="vllm")
    alert = request_slo(a, "python3", [2, 3], [0, 1, 2, 3], NOW, throttle=throttle())
    assert "CPU-throttled" in alert.summary and "280 ms" in alert.summary and "1234,1240" in alert.summary
    assert "serving/vllm-0" in alert.remedy and "container vllm" in alert.remedy
    assert "quota 200 ms per 100 ms period (= 2.00 CPUs)" in alert.remedy
    assert "limits.cpu" in alert.remedy and "--cpu-manager-policy=static" in alert.remedy
    assert "taskset" not in alert.remedy
    assert (alert.pod, alert.namespace, alert.container) == ("vllm-0", "serving", "vllm")
    assert alert.evidence["throttled_ms"] == "280.0"


def test_throttling_on_a_bare_host_names_the_cgroup_quota():
    a = attribution(cause="cfs_throttling", throttled_ns=280 * MS)
    alert = request_slo(a, "python3", [2], [0, 1, 2, 3], NOW, throttle=throttle(cgroup="/jsquota"))
    assert "cgroup /jsquota" in alert.remedy and "cpu.cfs_quota_us" in alert.remedy


def test_a_hard_irq_gets_its_smp_affinity_on_the_other_cpus():
    a = attribution(cause="irq", irq_ns=250 * MS, explained=0.77)
    alert = request_slo(a, "python3", [2, 3], [0, 1, 2, 3, 4, 5], NOW, irq=irq())
    assert "top source hardirq 57:mlx5_comp3 on CPU 2" in alert.summary
    assert "echo 0-1,4-5 > /proc/irq/57/smp_affinity_list" in alert.remedy


def test_a_softirq_names_the_device_behind_it():
    a = attribution(cause="irq", irq_ns=250 * MS, explained=0.77)
    alert = request_slo(a, "python3", [2], [0, 1, 2], NOW, irq=irq(kind="softirq", source="NET_RX"))
    assert "softirq NET_RX" in alert.remedy and "rps_cpus" in alert.remedy


def test_a_neighbour_is_still_moved():
    a = attribution(suspects=[Suspect(pid=4321, comm="logrotate", wait_ns=250 * MS)])
    alert = request_slo(a, "python3", [2, 3], [0, 1, 2, 3], NOW)
    assert alert.remedy == "move logrotate (pid 4321) off the CPUs of pid 1234: taskset -apc 0-1 4321"
    assert "across pids 1234,1240" in alert.summary


def test_self_contention_names_no_neighbour_and_says_how_many_threads_for_how_many_cpus():
    a = attribution(cause="self_contention", self_wait_ns=260 * MS, self_threads=6, explained=0.8, suspects=[])
    alert = request_slo(a, "VLLM::EngineCor", [2, 3], [0, 1, 2, 3], NOW)
    assert "held by 6 thread(s) of its own serving group" in alert.summary and "no neighbour" in alert.summary
    assert alert.remedy.startswith("6 busy thread(s) of pid 1234's serving group compete for its 2 CPU(s) (2-3)")
    assert "taskset" not in alert.remedy and alert.suspect_pid == 0
    assert alert.evidence["self_wait_ms"] == "260.0"


def test_a_gpu_stall_names_the_driver_call():
    a = attribution(cause="gpu_ioctl_stall", gpu_ioctl_ns=70 * MS, gpu_ioctl_max_ns=60 * MS, gpu_ioctls=2,
                    gpu_ioctl_call="NV_ESC_RM_CONTROL", explained=0.8)
    alert = request_slo(a, "vllm", [2], [0, 1, 2], NOW)
    assert "longest NV_ESC_RM_CONTROL 60 ms" in alert.summary and "in NV_ESC_RM_CONTROL" in alert.remedy


def test_a_gil_wait_names_the_holder_thread_and_moving_its_work():
    a = attribution(cause="gil_contention", gil_wait_ns=250 * MS, thread_tid=1236, culprit="tokenizer[1250]",
                    explained=0.77)
    alert = request_slo(a, "vllm", [0, 1], [0, 1, 2, 3], NOW)
    assert "thread 1236 waited 250 ms for the Python interpreter lock" in alert.summary
    assert "held by tokenizer[1250]" in alert.summary
    assert alert.remedy.startswith("tokenizer[1250] holds pid 1234's GIL") and "taskset" not in alert.remedy
    assert alert.evidence["culprit"] == "tokenizer[1250]" and alert.evidence["gil_wait_ms"] == "250.0"


def test_memory_and_io_stalls_get_their_own_remedies():
    memory = request_slo(attribution(cause="memory_stall", memory_wait_ns=300 * MS), "vllm", [0], [0, 1], NOW)
    assert "blocked 300 ms on memory" in memory.summary and "memory.low" in memory.remedy
    io = request_slo(attribution(cause="io_wait", io_wait_ns=280 * MS), "vllm", [0], [0, 1], NOW)
    assert "uninterruptible I/O" in io.summary and "device_io" in io.remedy
    on = request_slo(attribution(cause="io_wait", io_wait_ns=280 * MS, culprit="nvme1n1"), "vllm", [0], [0, 1], NOW)
    assert "uninterruptible I/O" in on.summary and on.summary.endswith("on nvme1n1")
    assert "find nvme1n1's other users" in on.remedy


def test_the_summary_follows_the_chain_and_lists_the_causes_beside_the_first():
    from jitterscope.schemas.events import CauseShare, ChainHop

    a = attribution(cause="gil_contention", explained=0.95, gil_wait_ns=0, culprit="detok[177]",
                    causes=[CauseShare(cause="gil_contention", share=0.7), CauseShare(cause="runq_starvation", share=0.25)],
                    chain=[ChainHop(tid=201, comm="VLLM::EngineCor", waited_ns=300 * MS, kind="sleep", ns=280 * MS,
                                    culprit="detok[177]"),
                           ChainHop(tid=177, comm="detok", waited_ns=280 * MS, kind="gil", ns=230 * MS, culprit="x[9]")])
    summary = request_slo(a, "python3", [2], [0, 1, 2, 3], NOW).summary
    assert "(70% of the excess), held by detok[177]" in summary, "the cause's own share, not all the causes'"
    assert ("it slept on VLLM::EngineCor[201] 300 ms, which slept on detok[177] 280 ms "
            "(waiting for the GIL 230 ms, x[9])") in summary
    assert "also runq_starvation 25%; 95% of the excess explained" in summary


def test_steal_names_the_hypervisor_and_no_process_to_move():
    from jitterscope.schemas.events import CauseShare

    a = attribution(cause="steal", explained=0.8, irq_ns=260 * MS, culprit="hypervisor",
                    causes=[CauseShare(cause="steal", share=0.8)])
    alert = request_slo(a, "python3", [2], [0, 1, 2, 3], NOW)
    assert "the hypervisor took the vCPUs its threads waited for (steal time, 80% of the excess)" in alert.summary
    assert "dedicated vCPUs" in alert.remedy and "taskset" not in alert.remedy
