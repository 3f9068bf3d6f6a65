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
