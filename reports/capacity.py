# SPDX-License-Identifier: Apache-2.0
"""The capacity-planning report: one self-contained HTML file (inline CSS
and SVG, no scripts, nothing fetched) built from the fleet store.

    jitterscope report --since 7d --out report.html [--remediation-date 2026-11-29T12:00]

Host class is the host name without its trailing number (``h100-017`` -> ``h100``). Every string
from the store (hosts, process names, devices) is escaped: whoever runs a process chooses its name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape
from typing import Callable

from jitterscope.common.settings import Settings
from jitterscope.reports import charts
from jitterscope.reports.queries import NOT_SERVING, SAVED
from jitterscope.schemas.events import OWN_SUSPECT_PREFIX
from jitterscope.schemas.signals import DATABASE as DB

HOST_CLASS = "replaceRegexpOne(host, '-?[0-9]+$', '')"

SECTIONS = [
    ("summary", "Summary: where the tail comes from, and what to do"),
    ("trends", "Tail latency trends"),
    ("heatmap", "Run-queue wait heatmap per host class"),
    ("causes", "Share of tail latency by root cause"),
    ("behind", "Hosts and processes behind the tail"),
    ("recurring", "Causes that recur on a schedule"),
    ("placement", "NUMA and GPU placement"),
    ("pressure", "Run-queue pressure against load"),
    ("before-after", "Before and after the remediation"),
    ("actions", "Recommended actions"),
]


@dataclass
class Context:
    query: Callable  # (sql, parameters) -> list of rows
    since_s: int
    remediation: datetime | None
    #: the run-queue alert level the charts draw: the caller passes settings.runq_alert_ms
    runq_alert_ms: float = Settings.model_fields["runq_alert_ms"].default
    #: the period as the user wrote it (--since 1h), shown as given
    since_text: str = ""
    #: what watching may cost a host, as a share (settings.self_cost_target_pct / 100, as `doctor` judges it)
    self_cost_target: float = Settings.model_fields["self_cost_target_pct"].default / 100
    #: query results two sections share (the summary's warning and "Cost of watching" read one)
    shared: dict = field(default_factory=dict)


def _rows(ctx: Context, sql: str, **params) -> list:
    return ctx.query(sql, {"since": ctx.since_s, **params})


def _table(headers: list[str], rows: list) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body or '<tr><td>none</td></tr>'}</tbody></table>"


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _worst_hosts(ctx: Context, limit: int) -> list:
    """(host, P999 ms, P99 ms) of run-queue waits, worst P999 first."""
    return _rows(ctx, f"""
        SELECT host, round(q[3] / 1000, 2), round(q[2] / 1000, 2) FROM (
            SELECT host, quantilesTDigestWeightedMerge(0.5, 0.99, 0.999)(quantiles) AS q
            FROM {DB}.latency_minute WHERE probe = 'runq' AND minute > now() - toIntervalSecond({{since:UInt32}})
            GROUP BY host) ORDER BY q[3] DESC, host LIMIT {{limit:UInt32}}""", limit=limit)


def trends(ctx: Context) -> str:
    """Per host class and hour: the class's P99 and P999 of every wait, and
    its worst host's P999. A class's quantiles are those of all its hosts'
    waits together, so one host's contention hardly moves them; the worst
    host's line is where contention shows."""
    rows = _rows(ctx, f"""
        SELECT class, hour, c.q[2] / 1000, c.q[3] / 1000, w.worst / 1000 FROM (
            SELECT {HOST_CLASS} AS class, toUnixTimestamp(toStartOfHour(minute)) AS hour,
                   quantilesTDigestWeightedMerge(0.5, 0.99, 0.999)(quantiles) AS q
            FROM {DB}.latency_minute WHERE probe = 'runq' AND minute > now() - toIntervalSecond({{since:UInt32}})
            GROUP BY class, hour) AS c
        INNER JOIN (
            SELECT class, hour, max(p999) AS worst FROM (
                SELECT {HOST_CLASS} AS class, host, toUnixTimestamp(toStartOfHour(minute)) AS hour,
                       quantilesTDigestWeightedMerge(0.999)(quantiles)[1] AS p999
                FROM {DB}.latency_minute WHERE probe = 'runq' AND minute > now() - toIntervalSecond({{since:UInt32}})
                GROUP BY class, host, hour)
            GROUP BY class, hour) AS w USING (class, hour)
        ORDER BY class, hour""")
    series: dict[str, list[tuple[float, float]]] = {}
    for kind, column in (("P99", 2), ("P999", 3), ("worst host P999", 4)):
        for row in rows:
            series.setdefault(f"{row[0]} {kind}", []).append((row[1], row[column]))
    chart = charts.line_chart(series, y_label="run-queue wait per host class, hourly (log scale)",
                              x_label="hour (UTC)", hline=(ctx.runq_alert_ms, f"{ctx.runq_alert_ms:g} ms alert level"))
    single = ('<p class="note">Every line here is one point: the period holds one hour of data, and the trend is '
              'hourly; a run of a few hours draws one.</p>' if series and max(map(len, series.values())) == 1 else "")
    return (chart + single + _coincide_note(series) + _contention(ctx)
            + "<h3>Worst hosts by run-queue P999</h3>" + _table(["host", "P999 ms", "P99 ms"], _worst_hosts(ctx, 10)))


def _contention(ctx: Context) -> str:
    """Seconds per hour that inference threads waited behind a neighbour
    (waits over the kernel's event threshold, runq_minute): the contention
    the summary's neighbours and actions count, which a fleet's quantiles of
    every wait can hide (a few long waits among thousands of short ones)."""
    rows = _rows(ctx, f"""
        SELECT class, hour, avg(waited_s), max(waited_s) FROM (
            SELECT {HOST_CLASS} AS class, host, toUnixTimestamp(toStartOfHour(minute)) AS hour,
                   sum(waited_ns) / 1e9 AS waited_s
            FROM {DB}.runq_minute WHERE minute > now() - toIntervalSecond({{since:UInt32}}) AND neighbour
                                        AND {NOT_SERVING}
            GROUP BY class, host, hour)
        GROUP BY class, hour ORDER BY class, hour""")
    series: dict[str, list[tuple[float, float]]] = {}
    for kind, column in (("mean host", 2), ("worst host", 3)):
        for row in rows:
            series.setdefault(f"{row[0]} {kind}", []).append((row[1], row[column]))
    chart = charts.line_chart(series, y_label="seconds per hour inference threads waited behind neighbours (log scale)",
                              x_label="hour (UTC)", y_fmt=charts.fmt_seconds)
    return "<h3>Contention: waits behind neighbours</h3>" + chart + _coincide_note(series)


def _coincide_note(series: dict[str, list[tuple[float, float]]]) -> str:
    """Say in words which lines lie on one another: two classes alike is a
    finding, not a missing line."""
    pairs = charts.coinciding(series)
    if not pairs:
        return ""
    said = "; ".join(f"{escape(a)} lies on {escape(b)}" for a, b in pairs)
    return (f'<p class="note">{said} (within 2% every hour): those lines are alike, not missing. '
            "A class's figures pool all its hosts; the worst-host lines show a host's contention.</p>")


def heatmap(ctx: Context) -> str:
    """Every run-queue wait the collectors measured (the log2 histograms, not
    only the tail events), per host class and hour: where the mass of the
    distribution sits and when its tail grows."""
    rows = _rows(ctx, f"""
        SELECT {HOST_CLASS} AS class, toUnixTimestamp(toStartOfHour(ts)) AS hour, slot, sum(count) AS n
        FROM {DB}.latency_histograms ARRAY JOIN slots AS slot, counts AS count
        WHERE probe = 'runq' AND ts > now64(9) - toIntervalSecond({{since:UInt32}})
        GROUP BY class, hour, slot ORDER BY class, hour, slot""")
    by_class: dict[str, dict[tuple[float, int], int]] = {}
    for cls, hour, slot, n in rows:
        by_class.setdefault(cls, {})[(float(hour), int(slot))] = int(n)
    if not by_class:
        return '<p class="empty">no histograms</p>'
    return "".join(f"<h3>{escape(cls)}</h3>" + charts.heatmap(cells, title=f"{cls}: run-queue wait (log scale)")
                   for cls, cells in sorted(by_class.items()))


def _cause_rows(ctx: Context) -> list:
    """(cause, seconds of excess request latency, requests, median share explained), costliest first."""
    return _rows(ctx, f"""
        SELECT cause, round(sum(excess_ns) / 1e9, 1) AS excess_s, count() AS requests, round(median(explained), 2)
        FROM {DB}.request_attribution FINAL
        WHERE ts > now64(9) - toIntervalSecond({{since:UInt32}}) AND cause != 'none'
        GROUP BY cause ORDER BY excess_s DESC, cause""")


def _neighbours(ctx: Context, limit: int, by: str = "starvations") -> list:
    """(command, starvations, hosts, seconds of waits behind it) of the
    neighbours that held starved CPUs (never a serving process:
    queries.NOT_SERVING), most starvations first, or ``by="waited"``: the
    most time taken first, as actions rank."""
    order = {"starvations": "starvations DESC", "waited": "waited DESC"}[by]
    return _rows(ctx, f"""
        SELECT suspect_comm, sum(waits) AS starvations, uniqExact(host) AS hosts, round(sum(waited_ns)/1e9, 1) AS waited
        FROM {DB}.runq_minute
        WHERE minute > now() - toIntervalSecond({{since:UInt32}}) AND neighbour AND {NOT_SERVING}
        GROUP BY suspect_comm ORDER BY {order}, suspect_comm LIMIT {{limit:UInt32}}""", limit=limit)


def causes(ctx: Context) -> str:
    rows = _cause_rows(ctx)
    total = sum(r[1] for r in rows) or 1
    phases = _rows(ctx, SAVED["phase-causes"].sql, limit=30)  # where the spans carried vLLM's phases
    return (charts.bar_chart([(r[0], r[1]) for r in rows], unit="s", x_label="seconds of excess request latency")
            + _table(["cause", "excess latency s", "requests", "share", "explained (median)"],
                     [(c, s, n, f"{s / total:.0%}", f"{e:.0%}") for c, s, n, e in rows])
            + ("<h3>By phase of the request</h3>" + _table(["phase", "cause", "requests", "taken s", "of the phase",
                                                            "top culprit"], phases) if phases else ""))


def behind(ctx: Context) -> str:
    hosts = _rows(ctx, f"""
        SELECT host, round(sum(excess_ns) / 1e9, 1) AS excess_s, countIf(slo_breached) AS over_slo,
               topK(1)(cause)[1] AS main_cause
        FROM {DB}.request_attribution FINAL
        WHERE ts > now64(9) - toIntervalSecond({{since:UInt32}}) AND cause != 'none'
        GROUP BY host ORDER BY excess_s DESC LIMIT 10""")
    neighbours = _neighbours(ctx, 10)
    return ("<h3>Hosts</h3>" + _table(["host", "excess latency s", "requests over SLO", "main cause"], hosts)
            + "<h3>Processes that held starved CPUs</h3>"
            + charts.bar_chart([(r[0], r[3]) for r in neighbours], unit="s",
                               x_label="seconds of run-queue waits of inference threads behind it")
            + _table(["command", "starvations", "hosts", "waits caused s"], neighbours))


def recurring(ctx: Context) -> str:
    """The saved query recurring-causes, as a table: a cause on a schedule is a
    job to move or reschedule (the archiver of every 15 minutes)."""
    saved = SAVED["recurring-causes"]
    defaults = {name: (float if kind.startswith("Float") else int)(default)
                for name, (kind, default) in saved.params.items()}
    rows = _rows(ctx, saved.sql, **defaults, limit=20)
    return ("<p>Each host's minutes with a cause (a neighbour that held starved CPUs for 100 ms or more in the "
            "minute, or requests attributed to it), grouped into occurrences; the period is the commonest gap, "
            "the phase where in the period it starts (both in seconds: 900 and 420 are :07, :22, :37, :52).</p>"
            + _table(["host", "cause", "culprit", "period s", "phase s", "occurrences", "regularity",
                      "first seen", "last seen", "last seen as"], rows))


def placement(ctx: Context) -> str:
    # The inventory, condensed: how GPU-using processes are pinned, per host
    # class (a fleet-wide table of every process would bury the pattern).
    inventory = _rows(ctx, f"""
        SELECT {HOST_CLASS} AS class, cpus, count() AS processes, uniqExact(host) AS hosts,
               arrayStringConcat(arraySort(groupUniqArray(3)(comm)), ', ') AS commands
        FROM (SELECT host, pid, argMax(comm, ts) AS comm, argMax(cpus_allowed, ts) AS cpus
              FROM {DB}.processes WHERE notEmpty(gpus) AND ts > now64(9) - toIntervalSecond({{since:UInt32}})
              GROUP BY host, pid)
        GROUP BY class, cpus ORDER BY class, processes DESC LIMIT 50""")
    inventory = [(cls, _cpulist(cpus), n, hosts, commands) for cls, cpus, n, hosts, commands in inventory]
    rows = _rows(ctx, f"""
        SELECT host, pid, any(comm), kind, any(evidence['gpu']), any(evidence['gpu_node']),
               any(evidence['remote_cpus']), count()
        FROM {DB}.alerts FINAL
        WHERE kind IN ('numa_cpu_mismatch', 'numa_remote_memory', 'numa_node_filler')
          AND ts > now64(9) - toIntervalSecond({{since:UInt32}})
        GROUP BY host, pid, kind ORDER BY host, pid LIMIT 200""")
    return ("<h3>Processes using GPUs</h3>"
            + _table(["host class", "allowed CPUs", "processes", "hosts", "commands"], inventory)
            + "<h3>Placement findings</h3>"
            + _table(["host", "pid", "command", "finding", "GPU", "GPU node", "remote CPUs", "alerts"], rows))


def _cpulist(cpus) -> str:
    from jitterscope.schemas.topology import cpu_list

    return cpu_list(list(cpus))


def pressure(ctx: Context) -> str:
    rows = _rows(ctx, f"""
        SELECT l.class, l.hour, round(l.p99, 2), r.requests FROM (
            SELECT {HOST_CLASS} AS class, toStartOfHour(minute) AS hour,
                   quantilesTDigestWeightedMerge(0.5, 0.99, 0.999)(quantiles)[2] / 1000 AS p99
            FROM {DB}.latency_minute WHERE probe = 'runq' AND minute > now() - toIntervalSecond({{since:UInt32}})
            GROUP BY class, hour) AS l
        LEFT JOIN (
            SELECT {HOST_CLASS} AS class, toStartOfHour(minute) AS hour, sum(requests) AS requests
            FROM {DB}.attribution_minute WHERE minute > now() - toIntervalSecond({{since:UInt32}})
            GROUP BY class, hour) AS r USING (class, hour)
        ORDER BY class, hour""")
    series: dict[str, list] = {}
    summary: dict[str, tuple[float, float]] = {}
    for cls, _hour, p99, requests in rows:
        series.setdefault(cls, []).append((requests or 0, p99))
        peak_load, worst = summary.get(cls, (0, 0.0))
        summary[cls] = (max(peak_load, requests or 0), max(worst, p99))
    table = [(c, peak, worst, f"{max(0.0, 1 - worst / ctx.runq_alert_ms):.0%}")
             for c, (peak, worst) in sorted(summary.items())]
    drawn = "".join(charts.line_chart({f"{cls} hourly P99": points}, x_kind="linear", markers=True,
                                      y_label=f"{cls}: run-queue P99 against load (log scale)",
                                      x_label="requests per hour (host class)",
                                      hline=(ctx.runq_alert_ms, f"{ctx.runq_alert_ms:g} ms alert level"))
                    for cls, points in sorted(series.items()))
    note = ('<p class="note">Headroom is the class\'s hourly P99 of every wait against the alert level: room for '
            "more load on the class as a whole. One host's tail can be over the level with the class well under it: "
            'see the worst-host lines and the contention chart under "Tail latency trends".</p>')
    return drawn + _table(["host class", "peak requests/hour", "worst hourly P99 ms",
                            f"headroom below {ctx.runq_alert_ms:g} ms"], table) + note


def _halfway(since_s: int) -> str:
    """A --remediation-date halfway through the period, as `now-<ago>`
    (the README's now-12h is inside a day, not inside an hour's run)."""
    half = max(60, since_s // 2)
    for unit, seconds in (("d", 86400), ("h", 3600), ("m", 60)):
        if half % seconds == 0 or unit == "m":
            break
    return f"now-{half // seconds}{unit}"


def before_after(ctx: Context) -> str:
    if ctx.remediation is None:
        return "<p>No remediation date given (--remediation-date).</p>"
    at = int(ctx.remediation.timestamp())
    rows = _rows(ctx, f"""
        SELECT if(toUnixTimestamp(ts) < {{at:UInt32}}, 'before', 'after') AS side, count(),
               round(quantile(0.99)(duration_ns) / 1e6, 1), round(quantile(0.999)(duration_ns) / 1e6, 1),
               countIf(slo_breached)
        FROM {DB}.request_attribution FINAL WHERE ts > now64(9) - toIntervalSecond({{since:UInt32}})
        GROUP BY side ORDER BY side = 'after'""", at=at)
    by_side = {r[0]: r for r in rows}
    headline = ""
    if "before" in by_side and "after" in by_side:
        headline = (f"<p class=\"headline\">Request P999 {by_side['before'][3]:,.0f} ms → "
                    f"{by_side['after'][3]:,.0f} ms after {escape(ctx.remediation.isoformat())}</p>")
    elif rows:  # one side only: say why, rather than show half a comparison
        side, other = ("after", "before") if "after" in by_side else ("before", "after")
        headline = (f"<p>Every request in the period is {side} {escape(ctx.remediation.isoformat())}, so there "
                    f"is nothing {other} it to compare with: choose a date inside the period "
                    f"(--since), e.g. --remediation-date {_halfway(ctx.since_s)}.</p>")
    return headline + _table(["", "requests", "P99 ms", "P999 ms", "over SLO"], rows)


def ranked_actions(ctx: Context) -> list[tuple[float, str, str]]:
    """(weight, what to do, its evidence), ranked by the latency each would
    take away (seconds of waits or of excess; an alert counts one)."""
    found: list[tuple[float, str, str]] = []
    # the rollup keeps names only; the label is unforgeable there: the
    # collector gives it to its own processes by pid and marks a foreign name
    # spelled like it (schemas/events.py suspect_name)
    for comm, count, hosts, waited in _neighbours(ctx, 3, by="waited"):  # time taken from requests, not counts
        what = (f"Give jitterscope's own {comm.removeprefix(OWN_SUSPECT_PREFIX)} CPUs apart from inference "
                f"(CPUAffinity= of its unit, or a cpuset) on {hosts} host(s): the cost of watching"
                if comm.startswith(OWN_SUSPECT_PREFIX) else
                f"Move {comm} off the inference CPUs (cpuset / taskset) on {hosts} host(s)")
        found.append((waited, what,
                      f"it held a CPU an inference thread waited for {count:,} times, {waited:,.0f} s of waits"))
    for kind, hosts, count, example, what in _rows(ctx, f"""
            SELECT kind, uniqExact(host), count(), any(host), any(remedy) FROM {DB}.alerts FINAL
            WHERE ts > now64(9) - toIntervalSecond({{since:UInt32}}) AND kind IN
                  ('numa_cpu_mismatch', 'numa_remote_memory', 'numa_node_filler', 'migration_storm', 'pcie_contention',
                   'xid', 'gpu_throttle')
            GROUP BY kind"""):
        found.append((float(count), f"Fix {kind.replace('_', ' ')} on {hosts} host(s), e.g. {example}: {what}",
                      f"{count:,} alert(s)"))
    for cause, excess in _rows(ctx, f"""
            SELECT cause, sum(excess_ns) / 1e9 FROM {DB}.request_attribution FINAL
            WHERE ts > now64(9) - toIntervalSecond({{since:UInt32}}) AND cause = 'gpu_ioctl_stall' GROUP BY cause"""):
        found.append((excess, "Look into GPU driver stalls (throttling, Xid errors, PCIe neighbours)",
                      f"{excess:,.0f} s of request excess latency"))
    found.sort(key=lambda a: -a[0])
    return found


def _action_list(found: list[tuple[float, str, str]]) -> str:
    items = "".join(f"<li><strong>{escape(what)}</strong><br><span class=\"evidence\">{escape(why)}</span></li>"
                    for _, what, why in found)
    return f"<ol class=\"actions\">{items or '<li>nothing to do</li>'}</ol>"


def actions(ctx: Context) -> str:
    """Every action, ranked, each with its evidence."""
    return _action_list(ranked_actions(ctx))


def _crowded_hosts(ctx: Context, limit: int) -> list:
    """(host, seconds waited behind neighbours, the neighbour behind most of it), most first."""
    return _rows(ctx, f"""
        SELECT host, round(sum(s), 1) AS waited, argMax(suspect_comm, s) FROM (
            SELECT host, suspect_comm, sum(waited_ns) / 1e9 AS s FROM {DB}.runq_minute
            WHERE minute > now() - toIntervalSecond({{since:UInt32}}) AND neighbour AND {NOT_SERVING}
            GROUP BY host, suspect_comm)
        GROUP BY host ORDER BY waited DESC, host LIMIT {{limit:UInt32}}""", limit=limit)


def summary(ctx: Context) -> str:
    """The answer first: the worst hosts, the costliest causes and
    neighbours, and the three actions that would take away the most; the
    sections below hold the evidence (the same queries, at more length)."""
    # a tail over the alert level, or the most time lost behind neighbours: the two ways a host is worst
    over = [row for row in _worst_hosts(ctx, 3) if row[1] >= ctx.runq_alert_ms]
    hosts = "".join(f"<li><strong>{escape(h)}</strong>: run-queue P999 {p999:,.2f} ms, over the "
                    f"{ctx.runq_alert_ms:g} ms alert level (P99 {p99:,.2f} ms)</li>" for h, p999, p99 in over)
    hosts += "".join(f"<li><strong>{escape(h)}</strong>: inference threads waited {waited:,.1f} s behind "
                     f"neighbours, most behind {escape(culprit)}</li>" for h, waited, culprit in _crowded_hosts(ctx, 3))
    cause_rows = _cause_rows(ctx)
    total = sum(r[1] for r in cause_rows) or 1
    costs = [f"<li><strong>{escape(c)}</strong>: {sec:,.1f} s of excess request latency over {n:,} request(s), "
             f"{sec / total:.0%} of it</li>" for c, sec, n, _e in cause_rows if sec >= 0.05][:3]  # 0.0 s: none
    costs += [f"<li>neighbour <strong>{escape(comm)}</strong>: {waited:,.1f} s of waits of inference threads, "
              f"{count:,} starvation(s) on {on:,} host(s)</li>" for comm, count, on, waited in _neighbours(ctx, 3)]
    over_target = [(h, mean) for h, _n, mean, *_ in _watch_costs(ctx) if mean > ctx.self_cost_target]
    watching = (f'<p class="cost-warning">Watching cost {len(over_target):,} host(s) more than the '
                f'{ctx.self_cost_target:.2%} target, the worst {escape(over_target[0][0])} at {over_target[0][1]:.2%} '
                'of its CPU: see "Cost of watching".</p>' if over_target else "")
    return ('<div class="summary">' + watching +
            f'<h3>Worst hosts</h3><ul class="worst-hosts">{hosts or "<li>no run-queue data</li>"}</ul>'
            f'<h3>Top causes, by what they cost</h3><ul class="top-causes">{"".join(costs) or "<li>none</li>"}</ul>'
            f'<h3>Do these three first</h3>{_action_list(ranked_actions(ctx)[:3])}'
            '<p class="evidence">Each figure is from the sections below: worst hosts from "Tail latency trends" '
            'and its contention chart, '
            'causes from "Share of tail latency by root cause" and "Hosts and processes behind the tail", '
            'actions from "Recommended actions".</p></div>')


BUILDERS = {"summary": summary, "trends": trends, "heatmap": heatmap, "causes": causes, "behind": behind,
            "recurring": recurring, "placement": placement, "pressure": pressure,
            "before-after": before_after, "actions": actions}

STYLE = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:980px;color:#111}
h1{font-size:1.6em}h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f5f5f5}svg{width:100%;height:auto;margin:.5em 0}.empty,.evidence,.note{color:#666}
.summary{background:#f8fafc;border:1px solid #cbd5e1;border-radius:6px;padding:.2em 1.2em}
.summary h3{margin:.8em 0 .2em}.headline{font-size:1.3em;font-weight:600}.actions li{margin:.5em 0}"""


def build(ctx: Context, progress: Callable[[str], None] = lambda _name: None) -> str:
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = []
    for key, title in SECTIONS:
        progress(title)
        body.append(f'<section id="{key}"><h2>{escape(title)}</h2>{BUILDERS[key](ctx)}</section>')
    return (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>jitterscope capacity report</title><style>{STYLE}</style></head><body>"
            f"<h1>jitterscope capacity-planning report</h1><p>Generated {generated}, {escape(_period(ctx))}.</p>"
            f"{''.join(body)}</body></html>")


def _period(ctx: Context) -> str:
    """The period as the user gave it (--since 1h), with the moments it spans."""
    end = datetime.now(timezone.utc)
    start = datetime.fromtimestamp(end.timestamp() - ctx.since_s, timezone.utc)
    given = ctx.since_text or f"{ctx.since_s}s"
    return f"covering the last {given} ({start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC)"


# -- cost of watching (collector/selfcost.py) ----------------------------------
def _watch_costs(ctx: Context) -> list:
    """(host, stats intervals, mean share, worst share, max RSS MB, CPUs) of
    jitterscope's own cost per host, the costliest first (queried once a report)."""
    if "watch_costs" not in ctx.shared:
        ctx.shared["watch_costs"] = _rows(ctx, f"""
        SELECT host, count() AS intervals, avg(overhead_share) AS mean_share, max(overhead_share) AS worst_share,
               max(rss_bytes) / 1e6 AS rss_mb, argMax(online_cpus, ts) AS cpus
        FROM {DB}.collector_stats FINAL
        WHERE online_cpus > 0 AND ts > now() - toIntervalSecond({{since:UInt32}})
        GROUP BY host ORDER BY mean_share DESC, host""")
    return ctx.shared["watch_costs"]


def cost_of_watching(ctx: Context) -> str:
    """Per host: the share of its CPU time spent on jitterscope's BPF programs
    and collector (mean and worst stats interval), and the collector's RSS,
    against self_cost_target_pct (the target `jitterscope doctor` uses)."""
    rows = _watch_costs(ctx)
    target = ctx.self_cost_target
    table = [(host, intervals, f"{mean:.3%}", f"{worst:.3%}", round(float(rss), 1), cpus,
              "yes" if mean <= target else "no")
             for host, intervals, mean, worst, rss, cpus in rows]
    note = (f"<p>BPF run time (the kernel's BPF statistics) plus the collector's CPU time, as a share of "
            f"all the host's CPU time over each stats interval; the target is under {target:.2%} "
            "(<code>self_cost_target_pct</code>, the one <code>jitterscope doctor</code> judges against).</p>")
    return note + _table(["host", "intervals", "mean share of CPU", "worst interval", "max collector RSS MB",
                          "CPUs", f"under {target:.2%}"], table) + _own_bursts(ctx)


def _own_bursts(ctx: Context) -> str:
    """Per host: the collector's longest run on a CPU (CollectorStats.
    longest_run_ns, collector/pacing.py) and how often a thread waited for a
    CPU behind one of jitterscope's own processes (run-queue waits whose
    suspect is own, by pid: RunqEvent.suspect_own), of all the waits seen."""
    longest = dict(_rows(ctx, f"""
        SELECT host, max(longest_run_ns) / 1e6 FROM {DB}.collector_stats FINAL
        WHERE ts > now() - toIntervalSecond({{since:UInt32}}) GROUP BY host"""))
    waits = _rows(ctx, f"""
        SELECT host, sumIf(waits, suspect_own) AS behind, sum(waits) AS total,
               maxIf(wait_ns, suspect_own AND waits <= 1) / 1e6 AS worst_ms,
               topKIf(1)(suspect_comm, suspect_own)[1] AS who
        FROM {DB}.runq_events
        WHERE ts > now() - toIntervalSecond({{since:UInt32}}) GROUP BY host HAVING behind > 0""")
    behind = {host: (n, total, worst, who) for host, n, total, worst, who in waits}
    table = [(host, round(float(longest.get(host, 0.0)), 2), n, f"{n / total:.2%}" if total else "-",
              round(float(worst), 2), who)
             for host in sorted(set(longest) | set(behind))
             for n, total, worst, who in [behind.get(host, (0, 0, 0.0, ""))]]
    note = ("<p>jitterscope as a culprit: the collector's longest run on a CPU without offering it up (its "
            "work is paced to runs well under 1 ms), and the run-queue waits over the threshold whose "
            "culprit was one of jitterscope's own processes (known by pid). Confine jitterscope to "
            "housekeeping CPUs with <code>own_cpus</code> where these are not near zero.</p>")
    return note + _table(["host", "collector's longest run ms", "waits behind jitterscope", "share of waits",
                          "longest such wait ms", "most often"], table)


SECTIONS.append(("cost", "Cost of watching"))
BUILDERS["cost"] = cost_of_watching


# -- top culprit stacks (reports/stacks.py) -------------------------------------
from jitterscope.reports import stacks as _stacks  # noqa: E402  (its own module: it queries, this one lays out)

SECTIONS.append(("stacks", "Top culprit stacks"))
BUILDERS["stacks"] = _stacks.section
