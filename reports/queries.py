# SPDX-License-Identifier: Apache-2.0
"""Saved fleet queries: the questions SREs and capacity planners ask most,
written once, with their parameters bound by ClickHouse (never pasted into
the SQL).

    jitterscope query --saved worst-hosts -p since=7d -p probe=runq
    jitterscope query --list-saved

Every query takes ``since`` (a duration: 30m, 24h, 7d) and a ``limit``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from jitterscope.common import errors
from jitterscope.reports import ledger
from jitterscope.schemas.signals import DATABASE as DB


@dataclass(frozen=True)
class SavedQuery:
    name: str
    question: str
    sql: str
    params: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (ClickHouse type, default)
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> its only valid values


#: probes whose latencies are kept as histograms (latency_histograms.probe)
LATENCY_PROBES = ("runq", "gpu_ioctl")


COMMON = {"since": ("UInt32", "7d"), "limit": ("UInt32", "20")}
SINCE = "ts > now64(9) - toIntervalSecond({since:UInt32})"
MINUTES = "minute > now() - toIntervalSecond({since:UInt32})"  # rollups: whole minutes

#: a serving group's process (one that sends request spans, or its group's)
#: is what jitterscope protects, never a neighbour to move off the CPUs,
#: though other processes wait behind it (a hog behind the server it crowds);
#: its host's process records say which (by name: the rollups keep no pids)
NOT_SERVING = (f"(host, suspect_comm) NOT IN (SELECT host, comm FROM {DB}.processes "
               f"WHERE serving_group != 0 AND {SINCE})")

SAVED: dict[str, SavedQuery] = {q.name: q for q in [
    SavedQuery(
        "worst-hosts",
        "Which hosts had the worst P999 latency for a probe (runq: CPU waits; gpu_ioctl: driver calls)?",
        f"""SELECT host,
       round(q[3] / 1000, 2) AS p999_ms, round(q[2] / 1000, 2) AS p99_ms, round(q[1] / 1000, 3) AS p50_ms,
       observations
FROM (
    SELECT host, quantilesTDigestWeightedMerge(0.5, 0.99, 0.999)(quantiles) AS q, sum(observations) AS observations
    FROM {DB}.latency_minute
    WHERE probe = {{probe:String}} AND minute > now() - toIntervalSecond({{since:UInt32}})
    GROUP BY host
)
ORDER BY q[3] DESC, host
LIMIT {{limit:UInt32}}""",
        {"probe": ("String", "runq")},
        {"probe": LATENCY_PROBES},  # anything else matches nothing: say so instead
    ),
    SavedQuery(
        "slo-by-cause",
        "How many requests broke their SLO, by root cause, and how slow were they?",
        f"""SELECT cause, count() AS requests, uniqExact(host) AS hosts,
       round(quantile(0.5)(duration_ns) / 1e6, 1) AS p50_ms, round(quantile(0.99)(duration_ns) / 1e6, 1) AS p99_ms,
       round(sum(excess_ns) / 1e9, 1) AS excess_s
FROM {DB}.request_attribution FINAL
WHERE slo_breached AND {SINCE}
GROUP BY cause
ORDER BY requests DESC, cause
LIMIT {{limit:UInt32}}""",
    ),
    SavedQuery(
        "phase-causes",
        "Which cause took each phase of slow requests (vLLM's queue, prefill, decode), and how much of it?",
        f"""SELECT p.phase AS phase, p.cause AS cause, count() AS requests, round(sum(p.cause_ns) / 1e9, 2) AS taken_s,
       round(sum(p.cause_ns) / sum(p.ns), 2) AS share_of_phase, topK(1)(p.culprit)[1] AS top_culprit
FROM {DB}.request_attribution FINAL ARRAY JOIN phases AS p
WHERE p.cause != '' AND {SINCE}
GROUP BY phase, cause
ORDER BY indexOf(['front', 'queue', 'prefill', 'decode', 'output'], phase), taken_s DESC, cause
LIMIT {{limit:UInt32}}""",
    ),
    SavedQuery(
        "serving-vs-causes",
        "When was the serving engine's own P99 TTFT worst (vLLM's /metrics), and what did the kernel do then?",
        f"""SELECT m.minute AS minute, m.host AS host, m.model AS model, m.ttft_p99_ms AS ttft_p99_ms,
       m.itl_p99_ms AS itl_p99_ms, m.waiting AS requests_waiting, c.slow AS slow_requests, c.top_cause AS top_cause
FROM (SELECT toStartOfMinute(ts) AS minute, host, model, round(max(ttft_p99_ns) / 1e6, 1) AS ttft_p99_ms,
             round(max(itl_p99_ns) / 1e6, 1) AS itl_p99_ms, max(requests_waiting) AS waiting
      FROM {DB}.serving_metrics FINAL WHERE {SINCE} GROUP BY minute, host, model) AS m
LEFT JOIN (SELECT toStartOfMinute(ts) AS minute, host, countIf(slo_breached OR notEmpty(token_slo_breached)) AS slow,
                  topKIf(1)(cause, cause NOT IN ('none', 'unexplained'))[1] AS top_cause
           FROM {DB}.request_attribution FINAL WHERE {SINCE} GROUP BY minute, host) AS c
ON m.minute = c.minute AND m.host = c.host
ORDER BY ttft_p99_ms DESC, minute DESC, host
LIMIT {{limit:UInt32}}""",
    ),
    SavedQuery(
        "noisy-neighbours",
        "Which commands most often held a CPU that an inference thread was starving for?",
        f"""SELECT suspect_comm AS command, sum(waits) AS starvations, uniqExact(host) AS hosts,
       round(sum(waited_ns) / 1e9, 2) AS waited_s, round(max(max_wait_ns) / 1e6, 1) AS worst_ms
FROM {DB}.runq_minute
WHERE {MINUTES} AND neighbour AND {NOT_SERVING}
GROUP BY suspect_comm
ORDER BY starvations DESC, command
LIMIT {{limit:UInt32}}""",
    ),
    SavedQuery(
        "off-node",
        "Which hosts run inference processes on CPUs away from their GPU's NUMA node?",
        f"""SELECT host, pid, any(comm) AS command, any(evidence['gpu']) AS gpu, any(evidence['gpu_node']) AS gpu_node,
       any(evidence['remote_cpus']) AS remote_cpus, max(ts) AS last_seen
FROM {DB}.alerts FINAL
WHERE kind = 'numa_cpu_mismatch' AND {SINCE}
GROUP BY host, pid
ORDER BY host, pid
LIMIT {{limit:UInt32}}""",
    ),
    SavedQuery(
        "migration-storms",
        "Which threads hopped between CPUs the most (migrations per second over an interval)?",
        f"""SELECT host, pid, tid, any(comm) AS command,
       round(max(migrations / (interval_ns / 1e9)), 1) AS worst_per_s, sum(migrations) AS total_migrations,
       sum(cross_node) AS total_cross_node
FROM {DB}.migrations FINAL
WHERE {SINCE} AND interval_ns > 0
GROUP BY host, pid, tid
HAVING worst_per_s >= {{min_per_s:Float64}}
ORDER BY worst_per_s DESC, host, tid
LIMIT {{limit:UInt32}}""",
        {"min_per_s": ("Float64", "50")},
    ),
    SavedQuery(
        "pcie-contention",
        "Where did GPU driver calls stall while a PCIe neighbour on the same switch was busy?",
        f"""SELECT host, evidence['gpu'] AS gpu, evidence['switch'] AS switch, evidence['neighbour'] AS neighbour,
       count() AS incidents, round(max(wait_ns) / 1e6, 1) AS worst_stall_ms, max(ts) AS last_seen
FROM {DB}.alerts FINAL
WHERE kind = 'pcie_contention' AND {SINCE}
GROUP BY host, gpu, switch, neighbour
ORDER BY incidents DESC, host
LIMIT {{limit:UInt32}}""",
    ),
]}

# A cause that comes back on a schedule (an archiver every 15 minutes, a
# cron backup, a flusher every 30 s) is found from its moments: each (host,
# cause, culprit)'s steps of ``step_s`` seconds with the cause (a neighbour
# holding CPUs the serving threads waited for at least min_ms in the minute,
# from the runq_minute rollup, which has whole minutes only; or attributed
# requests naming it), consecutive steps merged into one occurrence; the
# period is the commonest gap between occurrences, the regularity the share
# of gaps within a step of it, the phase where in the period it starts
# (epoch seconds modulo the period: 420 with a 15-minute period is :07,
# :22, :37, :52). A culprit's step is the coarser of step_s and its source's.
#
# A culprit recurs by what it is, not by its pid: a cron job is a new
# process every run. An attribution's culprit ("archiver (pid 4242)") is
# keyed by its command, with its systemd unit where the process record
# gives one ("archiver (log-archiver.service)"); ``instance`` keeps the
# culprit as attributed, pid included, for the drill-down.
STEP = "greatest({step_s:UInt32}, 1)"
RECURRING_SPIKES = f"""
    SELECT host, 'runq_starvation' AS cause, suspect_comm AS culprit, suspect_comm AS instance,
           toStartOfInterval(minute, toIntervalSecond(greatest({STEP}, 60))) AS moment, greatest({STEP}, 60) AS step
    FROM {DB}.runq_minute
    WHERE {MINUTES} AND neighbour
    GROUP BY host, culprit, moment
    HAVING sum(waited_ns) >= {{min_ms:UInt32}} * 1000000
  UNION ALL
    SELECT r.host AS host, r.cause AS cause,
           concat(replaceRegexpOne(r.culprit, ' [(](pid|tid) [0-9]+[)]$', ''),
                  if(endsWith(u.unit, '.service'), concat(' (', u.unit, ')'), '')) AS culprit,
           r.culprit AS instance, toStartOfInterval(toDateTime(r.ts), toIntervalSecond({STEP})) AS moment,
           {STEP} AS step
    FROM {DB}.request_attribution AS r
    LEFT JOIN (SELECT host, pid, splitByChar('/', argMax(cgroup, ts))[-1] AS unit
               FROM {DB}.processes WHERE {SINCE} GROUP BY host, pid) AS u
      ON u.host = r.host AND u.pid = toUInt32OrZero(extract(r.culprit, ' [(]pid ([0-9]+)[)]$'))
    WHERE r.{SINCE} AND r.culprit != '' AND r.cause NOT IN ('none', 'unexplained')
    GROUP BY host, cause, culprit, instance, moment"""

SAVED["recurring-causes"] = SavedQuery(
    "recurring-causes",
    "Which causes come back on a schedule (period, phase, and the process behind them)?",
    f"""SELECT host, cause, culprit, period_steps * step AS period_s, phase_steps * step AS phase_s,
       length(starts) AS occurrences,
       round(arrayCount(g -> abs(toInt64(g) - toInt64(period_steps)) <= 1, gaps) / length(gaps), 2) AS regularity,
       starts[1] AS first_seen, starts[-1] AS last_seen, last_instance
FROM (
    SELECT host, cause, culprit, step, starts, arrayReduce('topK(1)', gaps)[1] AS period_steps,
           intDiv(toUInt32(starts[1]), step) % greatest(period_steps, 1) AS phase_steps, gaps, last_instance
    FROM (
        SELECT host, cause, culprit, step, starts, last_instance,
               arrayPopFront(arrayDifference(arrayMap(m -> intDiv(toUInt32(m), step), starts))) AS gaps
        FROM (
            SELECT host, cause, culprit, max(step) AS step, arraySort(groupUniqArray(moment)) AS moments,
                   argMax(instance, moment) AS last_instance,
                   arrayFilter((m, i) -> i = 1 OR toUInt32(m) - toUInt32(moments[i - 1]) > step,
                               moments, arrayEnumerate(moments)) AS starts
            FROM ({RECURRING_SPIKES})
            GROUP BY host, cause, culprit
        )
    )
)
WHERE occurrences >= {{min_occurrences:UInt32}} AND period_steps > 1 AND regularity >= {{min_regularity:Float64}}
ORDER BY regularity DESC, occurrences DESC, host, cause, culprit
LIMIT {{limit:UInt32}}""",
    {"min_ms": ("UInt32", "100"), "min_occurrences": ("UInt32", "3"), "min_regularity": ("Float64", "0.6"),
     "step_s": ("UInt32", "60")},
)

SAVED["ledger"] = SavedQuery("ledger", ledger.QUESTION, ledger.sql(), ledger.PARAMS)  # see reports/ledger.py

DURATION = re.compile(r"(\d+)([smhdw])")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> int:
    """'30m' -> 1800; a bare number is seconds."""
    if text.isdigit():
        return int(text)
    match = DURATION.fullmatch(text.strip())
    if not match:
        raise errors.BadConfig(f"cannot read duration {text!r}: use e.g. 30m, 24h, 7d")
    return int(match[1]) * UNIT_S[match[2]]


def bind(name: str, given: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The saved query's SQL and its parameters: defaults, overridden by
    ``given``; unknown parameter names are an error, not ignored."""
    query = SAVED.get(name)
    if query is None:
        raise errors.BadConfig(f"no saved query {name!r}; saved queries: {', '.join(SAVED)}")
    declared = {**COMMON, **query.params}
    unknown = set(given) - set(declared)
    if unknown:
        raise errors.BadConfig(f"{name} takes {', '.join(sorted(declared))}; not {', '.join(sorted(unknown))}")
    values = {k: given.get(k, default) for k, (_type, default) in declared.items()}
    for key, valid in query.choices.items():
        if values[key] not in valid:
            raise errors.BadConfig(f"{name}: {key}={values[key]!r} is not one of {', '.join(valid)}")
    values["since"] = str(parse_duration(values["since"]))
    return query.sql, values
