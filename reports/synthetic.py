# SPDX-License-Identifier: Apache-2.0
"""A synthetic fleet with known answers, for tests, benchmarks and trying the
reports: hundreds of GPU hosts, millions of run-queue events, and a few
injected root causes whose answers are constants below.

The rows are generated inside ClickHouse (INSERT ... SELECT over numbers(),
with cityHash64 as a deterministic random source), so millions of rows load
in seconds and the materialized-view rollups fill exactly as they would from
the streams worker.
"""

from __future__ import annotations

import time

from jitterscope.schemas.signals import DATABASE as DB

# The injected answers.
# Host names are <class>-<number>: hosts 1-200 are class h100, the rest a100.
WORST_RUNQ_HOST = "h100-017"  # heavy run-queue tail: worst P999
NOISY_NEIGHBOUR = "logrotate"  # most often held a starved CPU
OFF_NODE_HOSTS = [f"h100-{i:03d}" for i in range(40, 45)]  # inference CPUs off the GPU's node
STORM_HOST, STORM_TID = "h100-100", 7777  # a thread migrating 500 times/s
PCIE_HOST, PCIE_NEIGHBOUR = "a100-250", "nvme3"  # GPU stalls while nvme3 streams on its switch
SLO_CAUSES = ["runq_starvation", "gpu_ioctl_stall", "unexplained"]  # most to fewest breaches
# a log archiver that starves inference on one host every 15 minutes, at :07, :22, :37 and :52
RECURRING_HOST, RECURRING_CULPRIT, RECURRING_PERIOD_MIN, RECURRING_PHASE_MIN = "h100-123", "log-archiver", 15, 7
RECURRING_UNIT = "log-archiver.service"  # the archiver's memory side: a new pid each run, in this unit
SERVING_HOST, SERVING_COMM = "h100-001", "jsinfer"  # a serving process others wait behind: never one to move
# All SLO breaches happened before a remediation half-way through the period
# (say, pinning rolled out): the report's before/after must show it.
HOST_CLASSES = ["a100", "h100"]
HOSTILE_COMM = "<script>alert('x')</script>"  # a process name that must stay text

SUSPECTS = [NOISY_NEIGHBOUR, "backup-agent", "node_exporter", "kworker/7:2", "fluent-bit", HOSTILE_COMM]


def _host(expr: str, hosts: int) -> str:
    number = f"(1 + ({expr}) % {hosts})"
    return f"concat(if({number} <= 200, 'h100-', 'a100-'), leftPad(toString({number}), 3, '0'))"


#: rows per run-queue INSERT: a 100M-event fleet loads in steps that show progress
#: and keep each insert's memory (and the rollup view's block) bounded
RUNQ_CHUNK = 5_000_000


def runq_statements(hosts: int, runq_events: int, span: int, end_ns: int, resolution_ns: int = 1000) -> list[str]:
    """Run-queue tail events shaped like a real capture's: each host's records
    arrive in time order with consecutive seq numbers (event i of a host falls
    in slot i of its even share of the period, at a random point inside it);
    waits over the 5 ms kernel threshold with an exponential tail (mean 8 ms);
    ts and wait in whole ``resolution_ns`` (1000: as the sink stores them,
    migration 015; 1: as the collector sends them); each suspect daemon a few
    threads of one pid; the suspect drawn by weight, logrotate most often."""
    per_host = -(-runq_events // hosts)
    step_ns = span * 1_000_000_000 // per_host
    weights = "[40, 20, 15, 10, 10, 5]"
    r = int(resolution_ns)
    return [f"""INSERT INTO {DB}.runq_events (host, boot_id, seq, ts, pid, tid, comm, cpu, wait_ns, suspect_pid,
                                  suspect_tid, suspect_comm)
SELECT {_host('number', hosts)} AS host, 'boot-1', intDiv(number, {hosts}) AS seq,
       fromUnixTimestamp64Nano(toInt64(intDiv({end_ns - span * 1_000_000_000} + seq * {step_ns}
                                       + cityHash64(number, 2) % {step_ns}, {r}) * {r})) AS ts,
       1000 + cityHash64(number, 3) % 4 AS pid, 2000 + cityHash64(number, 4) % 32 AS tid, 'vllm',
       cityHash64(number, 5) % 64,
       intDiv(5000000 + toUInt64(-log((cityHash64(number, 6) + 1) / 1.8446744073709552e19) * 3000000), {r}) * {r}
         AS wait_ns,
       30000 + 100 * (arrayFirstIndex(x -> x > cityHash64(number, 8) % 100, arrayCumSum({weights})) AS suspect)
         + cityHash64(number, 7) % 4 AS suspect_pid, suspect_pid, {{suspects:Array(String)}}[suspect]
FROM numbers({start}, {min(RUNQ_CHUNK, runq_events - start)})""" for start in range(0, runq_events, RUNQ_CHUNK)]


def _hashed(n: str) -> str:
    return f"cityHash64({n}, 1)"


def _recurring_statement(span: int) -> str:
    """The recurring archiver: 40 waits of 20 ms in its minute, every period, on its own boot's seqs."""
    period = RECURRING_PERIOD_MIN * 60
    return f"""INSERT INTO {DB}.runq_events (host, boot_id, seq, ts, pid, tid, comm, cpu, wait_ns, suspect_pid,
                                  suspect_tid, suspect_comm)
SELECT {{recurring_host:String}}, 'boot-recurring', number,
       fromUnixTimestamp64Nano(toInt64((intDiv(toUInt64(now()) - {span}, {period}) * {period}
                                        + {period} * (1 + intDiv(number, 40)) + {RECURRING_PHASE_MIN * 60}
                                        + number % 40) * 1000000000)),
       1000, 2001, 'vllm', 3, 20000000, 31000, 31000, {{recurring_culprit:String}}
FROM numbers({40 * (span // (RECURRING_PERIOD_MIN * 60) - 2)})"""


def _recurring_memory_statements(span: int) -> list[str]:
    """The same archiver's memory side: each run a new process (a cron job's
    new pid) under one systemd unit, named by three requests' memory stalls."""
    period, runs = RECURRING_PERIOD_MIN * 60, span // (RECURRING_PERIOD_MIN * 60) - 2
    run_start = (f"(intDiv(toUInt64(now()) - {span}, {period}) * {period} + {period} * (1 + k) "
                 f"+ {RECURRING_PHASE_MIN * 60})")
    return [f"""INSERT INTO {DB}.request_attribution (host, boot_id, seq, ts, request_id, name, pid, duration_ns,
       baseline_ns, excess_ns, status, cause, explained, culprit)
SELECT {{recurring_host:String}}, 'boot-recurring', number,
       fromUnixTimestamp64Nano(toInt64(({run_start} + 10 + number % 3) * 1000000000)),
       concat('archived-', toString(number)), 'llm_request', 1000, 100000000, 75000000, 25000000, 'ok', 'memory_stall',
       0.9, concat({{recurring_culprit:String}}, ' (pid ', toString(50000 + k), ')')
FROM (SELECT number, intDiv(number, 3) AS k FROM numbers({3 * runs}))""",
            f"""INSERT INTO {DB}.processes (host, boot_id, seq, ts, pid, comm, cmdline, cgroup)
SELECT {{recurring_host:String}}, 'boot-recurring', k, fromUnixTimestamp64Nano(toInt64(({run_start} + 1) * 1000000000)),
       50000 + k, {{recurring_culprit:String}}, '/usr/local/bin/log-archiver --compress',
       '/system.slice/log-archiver.service'
FROM (SELECT number AS k FROM numbers({runs}))"""]


def _histogram_statement(hosts: int, minutes: int) -> str:
    """Every minute, per host, a runq histogram; one host has a heavy tail."""
    return f"""INSERT INTO {DB}.latency_histograms
SELECT host, 'boot-1', number AS seq, toDateTime64(now64(9) - toIntervalMinute(number % {minutes}), 9),
       'runq', 60000000000, 1000, 'vllm',
       if(host = {{worst:String}}, [3, 6, 9, 12, 16], [3, 6, 9, 12]),
       if(host = {{worst:String}}, [5000, 2000, 200, 40, 30], [5000, 2000, 200, 1 + cityHash64(number) % 3])
FROM (SELECT number, {_host('intDiv(number, ' + str(minutes) + ')', hosts)} AS host
      FROM numbers({hosts * minutes}))"""


def _attribution_statement(hosts: int, span: int) -> str:
    """Request attributions: most fine; breaches by cause in a known order."""
    return f"""INSERT INTO {DB}.request_attribution (host, boot_id, seq, ts, request_id, trace_id, name, pid, start_ns,
       end_ns, duration_ns, baseline_ns, excess_ns, status, runq_wait_ns, runq_wait_max_ns, runq_waits, suspects,
       cause, explained, slo_ns, slo_breached, gpu_ioctl_ns, gpu_ioctl_max_ns, gpu_ioctls, phases)
SELECT {_host(_hashed('number'), hosts)} AS host, 'boot-1', number,
       toDateTime64(now64(9) - toIntervalSecond(if(r < 4500, {span // 2} + number % {span // 2}, number % {span})), 9),
       concat('req-', toString(number)), hex(cityHash64(number)), 'llm_request', 1000, 0, 0,
       multiIf(r < 3000, 900000000, r < 4200, 400000000, r < 4500, 300000000, 70000000 + r % 10000000) AS duration_ns,
       75000000, greatest(toInt64(duration_ns) - 75000000, 0), 'ok',
       if(r < 3000, 800000000, 0), if(r < 3000, 40000000, 0), if(r < 3000, 30, 0),
       if(r < 3000, [(30000, {{noisy:String}}, 600000000)], []),
       multiIf(r < 3000, 'runq_starvation', r < 4200, 'gpu_ioctl_stall', r < 4500, 'unexplained', 'none'),
       if(r < 4500, 0.9, 0), 375000000, r < 4500, if(r >= 3000 AND r < 4200, 300000000, 0), 0, 0,
       -- vLLM's phases: the neighbour took the queue, the GPU driver the decode
       multiIf(r < 3000, [('queue', 600000000, 'runq_starvation', 500000000, {{noisy:String}}, 500000000, 0, 0, 0),
                          ('decode', 250000000, '', 0, '', 0, 0, 0, 0)],
               r < 4200, [('decode', 350000000, 'gpu_ioctl_stall', 300000000, 'UVM_MAP', 0, 0, 0, 0)], [])
FROM (SELECT number, cityHash64(number, 9) % 200000 AS r FROM numbers(200000))"""


def _placement_statements(hosts: int, span: int) -> list[str]:
    """Standing placement problems, migration storms and PCIe incidents,
    and every host's inference process with the GPU it uses."""
    return [
        f"""INSERT INTO {DB}.alerts (host, boot_id, seq, ts, raised, kind, severity, pid, tid, comm, cpu, wait_ns,
    suspect_pid, suspect_comm, cpus_allowed, summary, remedy, request_id, evidence)
SELECT host, 'boot-1', number, now64(9) - toIntervalMinute(number), now64(9), 'numa_cpu_mismatch', 'warning',
       4242, 0, 'vllm', 0, 0, 0, '', range(64), 'uses GPU on node 1 but may run on node 0 CPUs',
       'numactl --cpunodebind=1 --membind=1', '',
       map('gpu', '0000:83:00.0', 'gpu_node', '1', 'remote_cpus', '0-15,32-47')
FROM (SELECT number, arrayJoin({{off_node:Array(String)}}) AS host FROM numbers(3))""",
        f"""INSERT INTO {DB}.alerts (host, boot_id, seq, ts, raised, kind, severity, pid, tid, comm, cpu, wait_ns,
    suspect_pid, suspect_comm, cpus_allowed, summary, remedy, request_id, evidence)
SELECT if(number < 50, {{pcie_host:String}}, 'a100-251'), 'boot-1', 1000 + number,
       now64(9) - toIntervalMinute(number), now64(9),
       'pcie_contention', 'critical', 4242, 4243, 'vllm', 0, 80000000 + number * 1000000, 0, '', [],
       'GPU stall while a neighbour streamed', 'move the I/O', '',
       map('gpu', '0000:83:00.0', 'switch', '0000:81:00.0',
           'neighbour', if(number < 50, {{pcie_neighbour:String}}, 'eth1'))
FROM numbers(55)""",
        # a serving process (it sent spans: its group is itself) that a hog waited behind
        f"""INSERT INTO {DB}.processes (host, boot_id, seq, ts, pid, comm, cmdline, cgroup, serving_group)
VALUES ({{serving_host:String}}, 'boot-serving', 0, now64(9), 2000, {{serving_comm:String}}, 'jsinfer', '/', 2000)""",
        f"""INSERT INTO {DB}.runq_events (host, boot_id, seq, ts, pid, tid, comm, cpu, wait_ns, suspect_pid,
                                  suspect_tid, suspect_comm)
SELECT {{serving_host:String}}, 'boot-serving', number, now64(9) - toIntervalSecond(number), 3000, 3000, 'hog', 1,
       50000000, 2000, 2000, {{serving_comm:String}}
FROM numbers(2000)""",
        # every host's inference process and the GPU it uses
        f"""INSERT INTO {DB}.processes (host, boot_id, seq, ts, pid, comm, cmdline, cgroup, cpus_allowed, gpus,
    cuda_visible_devices)
SELECT {_host('number', hosts)}, 'boot-1', number, now64(9), 1000, 'vllm', 'vllm serve llama', '/inference',
       range(64), ['0000:83:00.0'], '4'
FROM numbers({hosts})""",
        f"""INSERT INTO {DB}.migrations
SELECT {_host(_hashed('number'), hosts)}, 'boot-1', number, now64(9) - toIntervalSecond(number % {span}),
       1000, 3000 + number % 50, 'vllm', 10000000000, cityHash64(number) % 100, 0, number % 64
FROM numbers(100000)""",
        f"""INSERT INTO {DB}.migrations
SELECT {{storm_host:String}}, 'boot-1', 200000 + number, now64(9) - toIntervalSecond(number * 10), 1000, {STORM_TID},
       'vllm', 10000000000, 5000, 900, number % 64
FROM numbers(60)""",
    ]


def _serving_statement(span: int) -> str:
    """vLLM's own metrics on the first 20 hosts every 5 minutes: TTFT P99 150 ms, but 2 s on the worst host."""
    return f"""INSERT INTO {DB}.serving_metrics (host, boot_id, seq, ts, endpoint, model, interval_ns, requests_running,
       requests_waiting, kv_cache_usage, ttft_count, ttft_p50_ns, ttft_p99_ns, itl_count, itl_p50_ns, itl_p99_ns)
SELECT {_host('number % 20', 20)} AS host, 'boot-1', number,
       toDateTime64(now64(9) - toIntervalSecond(intDiv(number, 20) * 300), 9), 'http://127.0.0.1:8000/metrics',
       'llama-8b', 300000000000, 8, if(host = {{worst:String}}, 40, 2), 0.5, 600, 60000000,
       if(host = {{worst:String}}, 2000000000, 150000000), 60000, 20000000, 45000000
FROM numbers({20 * (span // 300)})"""


def statements(hosts: int = 300, runq_events: int = 2_000_000, hours: int = 24) -> list[str]:
    """The statements that load the fleet, in order."""
    span = hours * 3600
    return [
        *runq_statements(hosts, runq_events, span, time.time_ns()),
        _recurring_statement(span),
        *_recurring_memory_statements(span),
        _histogram_statement(hosts, hours * 60),
        _attribution_statement(hosts, span),
        *_placement_statements(hosts, span),
        _serving_statement(span),
    ]


#: the injected names go in as bound parameters: one of them is hostile on purpose
PARAMETERS = {"suspects": SUSPECTS, "worst": WORST_RUNQ_HOST, "noisy": NOISY_NEIGHBOUR, "off_node": OFF_NODE_HOSTS,
              "pcie_host": PCIE_HOST, "pcie_neighbour": PCIE_NEIGHBOUR, "storm_host": STORM_HOST,
              "recurring_host": RECURRING_HOST, "recurring_culprit": RECURRING_CULPRIT,
              "serving_host": SERVING_HOST, "serving_comm": SERVING_COMM}


def load_fleet(client, progress=None, **sizes) -> None:
    """Run the generating statements; ``progress(i, n)`` after each."""
    todo = statements(**sizes)
    for i, sql in enumerate(todo, start=1):
        used = {k: v for k, v in PARAMETERS.items() if "{" + k + ":" in sql}
        client.command(sql, parameters=used)
        if progress:
            progress(i, len(todo))
