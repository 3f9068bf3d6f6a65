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
