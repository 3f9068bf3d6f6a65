# SPDX-License-Identifier: Apache-2.0
"""reports/capacity.py draws the run-queue alert level it is given (the
caller passes settings.runq_alert_ms), and defaults to the setting's default."""

from jitterscope.common.settings import Settings
from jitterscope.reports import capacity


def rows(sql, params):
    return [("h100", 1_700_000_000, 4.0, 100)]  # class, hour, worst P99 ms, requests


def test_the_alert_level_follows_the_setting():
    html = capacity.pressure(capacity.Context(rows, 86400, None, runq_alert_ms=8.0))
    assert "headroom below 8 ms" in html and "<td>50%</td>" in html


def test_the_default_is_the_setting_default():
    assert capacity.Context(rows, 86400, None).runq_alert_ms == Settings.model_fields["runq_alert_ms"].default


def test_before_after_says_why_when_one_side_is_empty():
    """A remediation date outside the period once showed only "after",
    without a word: the report says why and how to choose a date."""
    from datetime import datetime, timezone

    from jitterscope.reports import capacity

    def only_after(sql, params):
        return [("after", 1200, 80.0, 95.0, 3)]

    ctx = capacity.Context(only_after, since_s=86400, remediation=datetime(2020, 1, 1, tzinfo=timezone.utc))
    html = capacity.BUILDERS["before-after"](ctx)
    assert "Every request in the period is after 2020-01-01" in html and "now-12h" in html
    # an hour's run: a date inside that hour, not the README's day-long example
    html = capacity.BUILDERS["before-after"](capacity.Context(only_after, 3600, datetime(2020, 1, 1, tzinfo=timezone.utc)))
    assert "--remediation-date now-30m" in html and "now-12h" not in html

    def both(sql, params):
        return [("before", 1000, 900.0, 2400.0, 40), ("after", 1200, 80.0, 95.0, 3)]

    html = capacity.BUILDERS["before-after"](capacity.Context(both, 86400, datetime.now(timezone.utc)))
    assert "2,400 ms → 95 ms" in html and "Every request" not in html


def test_jitterscopes_own_suspect_is_the_cost_of_watching_not_a_neighbour_to_move():
    from jitterscope.reports import capacity

    def rows(sql, params):
        if "runq_minute" in sql:
            return [("jitterscope:python", 40, 1, 2.5), ("logrotate", 30, 3, 1.5)]
        return []

    html = capacity.BUILDERS["actions"](capacity.Context(rows, 86400, None))
    assert "Give jitterscope&#x27;s own python CPUs apart from inference" in html
    assert "Move jitterscope:python" not in html and "Move logrotate off the inference CPUs" in html


def test_a_foreign_process_named_like_jitterscope_gets_a_neighbours_remedy():
    """The collector marks a foreign name spelled like its label
    (``jitterscope:up`` -> ``?jitterscope:up``), so the rollup's names cannot
    claim the cost of watching (issue 40, 8)."""
    from jitterscope.reports import capacity
    from jitterscope.schemas.events import suspect_name

    foreign = suspect_name("jitterscope:up", None)[0]

    def rows(sql, params):
        return [(foreign, 40, 1, 2.5)] if "runq_minute" in sql else []

    html = capacity.BUILDERS["actions"](capacity.Context(rows, 86400, None))
    assert "Move ?jitterscope:up off the inference CPUs" in html and "cost of watching" not in html


def test_the_period_is_shown_as_given():
    """`--since 1h` once read "covering the last 0.0 days"."""
    html = capacity.build(capacity.Context(lambda sql, params: [], 3600, None, since_text="1h"))
    assert "covering the last 1h (" in html and "days" not in html.split("<section")[0]


def test_the_summary_leads_and_agrees_with_the_actions():
    """The summary is the first section; its three actions are the first
    three of "Recommended actions"; hosts and causes come with their cost."""
    def rows(sql, params):
        if "latency_minute" in sql:
            return [("gpu-7", 40.0, 2.0), ("gpu-2", 3.0, 1.0)]  # host, P999 ms, P99 ms
        if "argMax(suspect_comm" in sql:
            return [("gpu-3", 12.5, "<b>cron</b>")]  # host, seconds waited, main neighbour
        if "runq_minute" in sql:
            return [("logrotate", 900, 30, 60.0), ("cron", 100, 2, 5.0)][:params.get("limit", 10)]
        if "request_attribution" in sql and "GROUP BY cause ORDER" in sql:
            return [("runq_starvation", 30.0, 12, 0.9), ("gpu_ioctl_stall", 10.0, 4, 0.8)]
        if "FROM jitterscope.alerts" in sql and "GROUP BY kind" in sql:
            return [("pcie_contention", 2, 20, "a-1", "move the I/O"), ("migration_storm", 1, 2, "b-1", "pin it")]
        return []

    ctx = capacity.Context(rows, 86400, None)
    assert capacity.SECTIONS[0][0] == "summary"
    html = capacity.summary(ctx)
    assert "gpu-7</strong>: run-queue P999 40.00 ms, over the 10 ms alert level" in html and "gpu-2" not in html
    assert "gpu-3</strong>: inference threads waited 12.5 s" in html and "&lt;b&gt;cron&lt;/b&gt;" in html
    assert "runq_starvation</strong>: 30.0 s of excess request latency over 12 request(s), 75% of it" in html
    actions = capacity.actions(ctx)
    first = actions.split("<li>")[1:4]
    assert html.count("<li><strong>Move") + html.count("<li><strong>Fix") == 3
    assert all(item.split("</li>")[0] in html for item in first)


def test_a_trend_of_one_hour_says_its_lines_are_single_points():
    from jitterscope.reports import capacity

    def one_hour(sql, params):
        return [("h100", 1_700_000_000, 1.5, 9.0, 12.0)] if "latency_minute" in sql and "INNER JOIN" in sql else []

    def two_hours(sql, params):
        return [(*row[:1], row[1] + i * 3600, *row[2:]) for i in range(2) for row in one_hour(sql, params)]

    assert "Every line here is one point" in capacity.trends(capacity.Context(one_hour, 3600, None))
    assert "Every line here is one point" not in capacity.trends(capacity.Context(two_hours, 7200, None))
