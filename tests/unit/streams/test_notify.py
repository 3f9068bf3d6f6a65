# SPDX-License-Identifier: Apache-2.0
"""Notification payloads (streams/notify.py): Alertmanager API v2
PostableAlert shape, Prometheus-compatible fingerprints, backoff, and a
target that never blocks its caller."""

from __future__ import annotations

import json
import re
import socket
import time
from datetime import datetime

import pytest
from prometheus_client import REGISTRY

from jitterscope.common import errors
from jitterscope.common.settings import load
from jitterscope.streams import notify
from jitterscope.streams.alert_groups import AlertGroups
from tests.unit.streams.test_alert_groups import S, T0, alert

POSTABLE_KEYS = {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}  # API v2 PostableAlert


def parse(ts: str) -> int:
    assert ts.endswith("Z")
    return int(datetime.fromisoformat(ts[:-1] + "+00:00").timestamp() * 1000)


def test_fingerprint_is_prometheus_label_set_fingerprint():
    # the vectors of prometheus/common model/signature_test.go: Alertmanager shows the same
    assert notify.fingerprint({}) == f"{14695981039346656037:016x}"
    vector = {"name": "garland, briggs", "fear": "love is not enough"}
    assert notify.fingerprint(vector) == f"{5799056148416392346:016x}"
    assert notify.fingerprint({"a": "b"}) != notify.fingerprint({"a": "c"})


def test_a_group_keeps_its_labels_and_fingerprint_from_first_alert_to_resolution():
    g = AlertGroups(window_ns=10 * S, quiet_ns=30 * S)
    first = g.offer([alert(1, severity="warning", pod="vllm-0", namespace="llm", container="engine")], T0)
    later = g.offer([alert(2, 200, severity="critical", pod="vllm-0", namespace="llm", container="engine")],
                    T0 + 11 * S)
    resolved = g.tick(T0 + 60 * S)
    sets = [notify.labels(a) for a in first + later + resolved]
    assert sets[0] == {"alertname": "runq_starvation", "severity": "warning", "host": "h1", "comm": "engine",
                       "pid": "100", "suspect": "jshog", "pod": "vllm-0", "namespace": "llm", "container": "engine"}
    assert sets[0] == sets[1] == sets[2]
    assert len({notify.fingerprint(s) for s in sets}) == 1


def test_alertmanager_payload_firing_and_resolved():
    g = AlertGroups(window_ns=10 * S, quiet_ns=30 * S)
    g.offer([alert(1, 12)], T0)
    (firing,) = g.offer([alert(2, 80)], T0 + 11 * S)
    (resolved,) = g.tick(T0 + 41 * S)
    body = json.loads(notify.alertmanager_body([firing, resolved], resolve_timeout_ns=120 * S,
                                               generator_url="http://grafana/d/js"))
    assert isinstance(body, list) and len(body) == 2
    for posted in body:
        assert set(posted) == POSTABLE_KEYS
        assert all(isinstance(v, str) for part in ("labels", "annotations") for v in posted[part].values())
        assert posted["generatorURL"] == "http://grafana/d/js"
        assert posted["startsAt"] == notify.rfc3339(T0), "a group starts at its first alert"
    fire, done = body
    assert fire["annotations"]["count"] == "2" and fire["annotations"]["worst_ms"] == "80.0"
    assert {"summary", "remedy"} <= set(fire["annotations"]) and "2 times" in fire["annotations"]["summary"]
    assert parse(fire["endsAt"]) == (firing.raised_ns + 120 * S) // 1_000_000, "firing: now + resolve timeout"
    assert parse(done["endsAt"]) == resolved.raised_ns // 1_000_000 <= parse(fire["endsAt"])
    assert done["annotations"]["summary"].startswith("resolved")
    assert "generatorURL" not in json.loads(notify.alertmanager_body([firing], 120 * S))[0]


def test_webhook_payload_carries_the_whole_alert():
    (a,) = AlertGroups(10 * S, 30 * S).offer([alert(5)], T0)
    (item,) = json.loads(notify.webhook_body([a]))["alerts"]
    assert item["state"] == "firing" and item["fingerprint"] == notify.fingerprint(notify.labels(a))
    assert item["alert"]["seq"] == 5 and item["alert"]["evidence"]["group_count"] == "1"


def test_backoff_doubles_up_to_the_cap_with_jitter():
    low = [notify.backoff_s(n, 0.5, 10, rand=lambda: 0.0) for n in range(7)]
    high = [notify.backoff_s(n, 0.5, 10, rand=lambda: 1.0) for n in range(7)]
    assert high == [0.5, 1, 2, 4, 8, 10, 10]
    assert low == [h / 2 for h in high], "at least half the step: retries never come at once"
    assert all(l <= notify.backoff_s(n, 0.5, 10) <= h for n, (l, h) in enumerate(zip(low, high)))


def test_a_full_queue_drops_and_counts_without_blocking():
    hung = socket.socket()  # listens, never accepts: a receiver that hangs
    hung.bind(("127.0.0.1", 0))
    hung.listen(1)
    target = notify.Target("unit-hung", f"http://127.0.0.1:{hung.getsockname()[1]}/", notify.webhook_body,
                           queue_max=5, timeout_s=30, retries=0)
    try:
        dropped_now = lambda: REGISTRY.get_sample_value(  # noqa: E731
            "jitterscope_streams_notifications_dropped_total", {"target": "unit-hung"}) or 0
        before = dropped_now()
        started = time.monotonic()
        target.offer([alert(i) for i in range(200)])
        assert time.monotonic() - started < 0.5
        dropped = dropped_now() - before
        assert 200 - 5 - notify.BATCH_MAX <= dropped <= 200 - 5
    finally:
        target.close(0.1)
        hung.close()


def test_settings_build_targets_and_read_the_token_from_a_file(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    s = load(data_dir=tmp_path, alertmanager_url="http://am:9093/", webhook_url="https://hooks/x",
             webhook_token_file=token)
    n = notify.Notifier.from_settings(s)
    try:
        am, hook = n.targets
        assert am.url == "http://am:9093/api/v2/alerts"
        assert hook.headers["Authorization"] == "Bearer s3cret"
        assert notify.Notifier.from_settings(load(data_dir=tmp_path)).targets == []
    finally:
        n.close()
    with pytest.raises(errors.BadConfig, match="bearer token"):
        notify.read_token(tmp_path / "missing")


def test_irq_alerts_are_told_apart_by_cpu_and_interrupt():
    import msgspec

    a = msgspec.structs.replace(alert(1, pid=0, kind="irq", suspect="", evidence={"source": "NET_RX"}), cpu=3, comm="")
    assert notify.labels(a) == {"alertname": "irq", "severity": "warning", "host": "h1", "cpu": "3",
                                "suspect": "NET_RX"}


# -- untrusted names (issue 40, item 9) -----------------------------------------

SAFE_VALUE = re.compile(r"[^<>\x00-\x1f\x7f]*")  # printable, and no mrkdwn markup


def hostile(seq: int = 1, **extra):
    import msgspec

    a = alert(seq, suspect="<!here>", pod="p\n*forged line*", request_id="r" * 5000, **extra)
    return msgspec.structs.replace(a, comm="<!channel>", summary="<!channel> waited\r\n<@U024BE7LH> & co",
                                   remedy="renice <!everyone>\u202e")


def test_safe_text_escapes_slack_markup_and_control_characters():
    assert notify.safe_text("<!channel> & <@U1>") == "&lt;!channel&gt; &amp; &lt;@U1&gt;"
    assert notify.safe_text("a\nb\rc\td\x1b\u202e") == "a\\x0ab\\x0dc\\x09d\\x1b\\u202e"
    cut = notify.safe_text("<" * 100, limit=40)
    assert len(cut) <= 40 and "…" in cut and "&lt" not in cut.replace("&lt;", ""), "never half an entity"
    assert notify.safe_text("<" * 100, 40) != notify.safe_text("<" * 99 + ">", 40), "a cut keeps values apart"


def test_label_names_follow_prometheus_rules():
    assert notify.safe_label_name("pod.name-1") == "pod_name_1"
    assert notify.safe_label_name("1x") == "_1x" and notify.safe_label_name("__x") == "x__x"
    assert notify.safe_label_name("") == "_"


def test_hostile_names_reach_no_channel_as_markup():
    (a,) = AlertGroups(10 * S, 30 * S).offer([hostile()], T0)
    am_bytes = notify.alertmanager_body([a], 120 * S)
    hook_bytes = notify.webhook_body([a])
    for raw in (am_bytes, hook_bytes):
        assert b"<!" not in raw and b"<@" not in raw
    assert b"\\n*forged" not in am_bytes, "no forged line in what Alertmanager passes on"
    (posted,) = json.loads(am_bytes)
    assert posted["labels"]["comm"] == "&lt;!channel&gt;" and posted["labels"]["suspect"] == "&lt;!here&gt;"
    assert posted["labels"]["pod"] == "p\\x0a*forged line*"
    for part in ("labels", "annotations"):
        for name, value in posted[part].items():
            assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) and not name.startswith("__")
            assert SAFE_VALUE.fullmatch(value) and value.isprintable(), (name, value)
    assert len(posted["labels"]["request_id"]) <= notify.LABEL_VALUE_MAX
    assert "&lt;!everyone&gt;\\u202e" in posted["annotations"]["remedy"]
    hook = json.loads(hook_bytes)
    assert "&lt;!channel&gt;" in hook["text"] and "\n" not in hook["text"]
    assert SAFE_VALUE.fullmatch(hook["text"])
    (item,) = hook["alerts"]
    assert item["labels"] == posted["labels"] and item["fingerprint"] == notify.fingerprint(posted["labels"])
    assert item["alert"]["comm"] == "<!channel>", "the record itself stays whole, for programs"


def test_webhook_text_stays_within_slacks_limit():
    alerts = AlertGroups(10 * S, 30 * S).offer([hostile(i, pid=100 + i) for i in range(64)], T0)
    text = json.loads(notify.webhook_body(alerts))["text"]
    assert len(text) <= notify.WEBHOOK_TEXT_MAX and text.count("\n") == len(alerts) - 1
