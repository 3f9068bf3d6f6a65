# SPDX-License-Identifier: Apache-2.0
"""Alert notifications: Alertmanager (``POST <url>/api/v2/alerts``) and a
plain JSON webhook, both optional settings.

Each target has its own bounded queue and its own thread: the stream only
puts alerts in the queue (never waits), a full queue drops and counts, and a
slow or dead receiver holds up nothing but its own thread. A POST is retried
with exponential backoff and jitter; what still fails is counted. Stdlib HTTP
(urllib) only: the sender is a thread, so a blocking client is the simple
choice and adds no dependency.

Alertmanager identifies an alert by its label set, so the labels are the
alert group's identity (kind, host, victim pid and comm, suspect, pod...) and
stay the same from its first announcement to its resolution; what changes
(count, worst wait) goes in the annotations. While a group fires, ``endsAt``
is now + ``resolve_timeout`` (longer than the gap between two announcements
of a firing group), so Alertmanager keeps it firing and resolves it by itself
only if this worker goes away; the resolution sets ``endsAt`` to its time.

Process names, pods and request ids are chosen by whoever runs the process
or sends the span, and Alertmanager hands labels and annotations on to Slack,
e-mail and pagers as they are: a process named ``<!channel>`` would ping a
whole Slack channel. So every value that leaves here is inert text
(``safe_text``): Slack's control characters ``& < >`` as the entities its
formatting reference asks for, anything not printable (a newline that forges
a line, a bidi override) written as a visible escape, the length bounded.
Label names follow Prometheus' rule. The webhook's ``text`` (what a Slack or
Mattermost incoming webhook shows) is built from such values only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import random
import re
import threading
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

import msgspec
from prometheus_client import Counter

from jitterscope.common import errors, outbound
from jitterscope.schemas.events import Alert
from jitterscope.streams.alert_groups import RESOLVED, suspect_of

log = logging.getLogger("jitterscope.streams.notify")

# target="otlp" counts attribution spans (streams/otlp_export.py), the others alerts
SENT = Counter("jitterscope_streams_notifications_sent_total", "alerts (spans) a target accepted", ["target"])
FAILED = Counter("jitterscope_streams_notifications_failed_total",
                 "alerts (spans) a target did not accept after every retry", ["target"])
DROPPED = Counter("jitterscope_streams_notifications_dropped_total",
                  "alerts (spans) not queued for a target because its queue was full", ["target"])

BATCH_MAX = 64  # alerts per POST at most

LABEL_VALUE_MAX = 256  # a Kubernetes pod name (253) fits; a request id sent by a span may not
TEXT_MAX = 2000  # one annotation value, or one line of the webhook's text
WEBHOOK_TEXT_MAX = 39_000  # Slack truncates a message's text at 40,000 characters

# -- untrusted text (pure) ---------------------------------------------------

_LABEL_NAME_BAD = re.compile(r"[^a-zA-Z0-9_]")
_MRKDWN = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def _visible(c: str) -> str:
    if c.isprintable():
        return c
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def safe_text(value: object, limit: int = TEXT_MAX) -> str:
    """``value`` as inert text: printable, ``& < >`` as entities, at most
    ``limit`` characters. A cut value ends in "…" and a hash of the whole, so
    two long values that share a start stay two label sets."""
    text = "".join(map(_visible, str(value))).translate(_MRKDWN)
    if len(text) <= limit:
        return text
    head = text[:limit - 10]
    amp = head.rfind("&")
    if amp >= 0 and ";" not in head[amp:]:  # never half an entity
        head = head[:amp]
    return f"{head}…{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def safe_label_name(name: str) -> str:
    """A Prometheus label name: [a-zA-Z_][a-zA-Z0-9_]*, and not the reserved __ prefix."""
    name = _LABEL_NAME_BAD.sub("_", name) or "_"
    if name[0].isdigit():
        name = "_" + name
    return "x" + name if name.startswith("__") else name

# -- payloads (pure) ---------------------------------------------------------

_FNV_OFFSET, _FNV_PRIME, _SEPARATOR = 14695981039346656037, 1099511628211, 0xFF


def fingerprint(labels: dict[str, str]) -> str:
    """Prometheus' label-set fingerprint (FNV-1a 64 over the sorted names and
    values, each followed by 0xff), as Alertmanager shows it: the same alert
    group has the same fingerprint here, in Alertmanager and across restarts."""
    h = _FNV_OFFSET
    for name in sorted(labels):
        for part in (name, labels[name]):
            for byte in part.encode():
                h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
            h = ((h ^ _SEPARATOR) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def labels(alert: Alert) -> dict[str, str]:
    """The alert's identity: what stays the same while its group fires.
    Empty values are left out (Alertmanager treats empty as absent)."""
    raw = {
        "alertname": alert.kind,
        # a group keeps its first alert's severity: a changed label would be another alert
        "severity": alert.evidence.get("group_severity") or alert.severity,
        "host": alert.host,
        "comm": alert.comm,
        "pid": str(alert.pid) if alert.pid else "",
        "cpu": "" if alert.pid else str(alert.cpu),  # host-level findings (irq): per CPU
        "suspect": suspect_of(alert),
        "pod": alert.pod,
        "namespace": alert.namespace,
        "container": alert.container,
        "request_id": alert.request_id,
    }
    return {safe_label_name(k): safe_text(v, LABEL_VALUE_MAX) for k, v in raw.items() if v}


def rfc3339(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def is_resolved(alert: Alert) -> bool:
    return alert.evidence.get("state") == RESOLVED


def postable_alert(alert: Alert, resolve_timeout_ns: int, generator_url: str | None = None) -> dict:
    """One Alertmanager API v2 PostableAlert."""
    ev = alert.evidence
    annotations = {"summary": alert.summary, "remedy": alert.remedy}
    if "group_count" in ev:
        annotations.update(count=ev["group_count"], worst_ms=f"{int(ev['group_worst_ns']) / 1e6:.1f}")
    annotations = {k: safe_text(v) for k, v in annotations.items()}
    starts = int(ev.get("group_first_ns", alert.ts_ns))
    ends = alert.raised_ns if is_resolved(alert) else alert.raised_ns + resolve_timeout_ns
    body = {"labels": labels(alert), "annotations": annotations, "startsAt": rfc3339(starts),
            "endsAt": rfc3339(ends)}
    if generator_url:
        body["generatorURL"] = generator_url
    return body


def alertmanager_body(alerts: list[Alert], resolve_timeout_ns: int, generator_url: str | None = None) -> bytes:
    return json.dumps([postable_alert(a, resolve_timeout_ns, generator_url) for a in alerts]).encode()


def webhook_text(alerts: list[Alert]) -> str:
    """One mrkdwn line per alert, every part of it escaped."""
    lines: list[str] = []
    for i, a in enumerate(alerts):
        line = " ".join(safe_text(part, TEXT_MAX // 4) for part in (
            f"[{a.evidence.get('state', 'firing')}]", a.kind, "on", f"{a.host}:", a.summary))
        if sum(map(len, lines)) + len(line) + 100 > WEBHOOK_TEXT_MAX:  # whole lines only: no half entity
            lines.append(f"... and {len(alerts) - i} more")
            break
        lines.append(line)
    return "\n".join(lines)


def webhook_body(alerts: list[Alert]) -> bytes:
    """{"text": <mrkdwn>, "alerts": [{"state", "fingerprint", "labels", "alert": <the Alert record>}]}

    ``text`` makes the same POST a Slack/Mattermost incoming-webhook message.
    The record stays whole for programs; ``<`` and ``>`` in it are JSON
    ``\\u`` escapes (as Go's encoder writes them), so no template that works
    on the raw bytes sees markup."""
    body = json.dumps({"text": webhook_text(alerts), "alerts": [{
        "state": a.evidence.get("state", "firing"), "fingerprint": fingerprint(labels(a)), "labels": labels(a),
        "alert": msgspec.to_builtins(a)} for a in alerts]})
    return body.replace("<", "\\u003c").replace(">", "\\u003e").encode()


def backoff_s(attempt: int, base_s: float, cap_s: float, rand: Callable[[], float] = random.random) -> float:
    """Exponential backoff with equal jitter: half of min(cap, base * 2**attempt)
    fixed, half random, so retries of many workers spread out but never retry
    at once."""
    step = min(cap_s, base_s * (2 ** attempt))
    return step / 2 + rand() * step / 2


# -- sending -------------------------------------------------------------------

class Target:
    """One destination: a bounded queue drained by a daemon thread. What it
    carries is the caller's (alerts here; attribution spans for OTLP):
    ``encode`` turns a batch of them into a POST body."""

    def __init__(self, name: str, url: str, encode: Callable[[list], bytes], *,
                 headers: dict[str, str] | None = None, queue_max: int = 1000, timeout_s: float = 5.0,
                 retries: int = 5, backoff_base_s: float = 0.5, backoff_cap_s: float = 30.0,
                 batch_max: int = BATCH_MAX):
        self.name, self.url, self.encode, self.batch_max = name, url, encode, batch_max
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.timeout_s, self.retries = timeout_s, retries
        self.backoff_base_s, self.backoff_cap_s = backoff_base_s, backoff_cap_s
        self.queue: queue.Queue = queue.Queue(maxsize=queue_max)
        # a 3xx is refused, never followed: the Authorization header would go
        # wherever it points; the environment's proxies apply except to loopback
        self._opener = outbound.opener()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"notify-{name}", daemon=True)
        self._thread.start()

    def offer(self, items: Iterable) -> None:
        for item in items:
            try:
                self.queue.put_nowait(item)
            except queue.Full:
                DROPPED.labels(self.name).inc()

    def close(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (one attempt each, no retries), for ``timeout_s`` at most."""
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not (self._stop.is_set() and self.queue.empty()):
            try:
                batch = [self.queue.get(timeout=0.5)]
            except queue.Empty:
                continue
            while len(batch) < self.batch_max:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            try:
                ok = self._deliver(self.encode(batch))
            except Exception:  # the thread must outlive any one bad batch
                log.exception("notification to %s failed", self.name)
                ok = False
            (SENT if ok else FAILED).labels(self.name).inc(len(batch))

    def _deliver(self, body: bytes) -> bool:
        for attempt in range(self.retries + 1):
            if attempt:
                if self._stop.wait(backoff_s(attempt - 1, self.backoff_base_s, self.backoff_cap_s)):
                    return False
            request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
            try:
                with self._opener.open(request, timeout=self.timeout_s) as response:
                    response.read()
                return True
            except urllib.error.HTTPError as exc:
                # a receiver that refuses the payload (or redirects it) will do so again
                if 300 <= exc.code < 400:
                    log.warning("%s answered HTTP %d (a redirect) to %d bytes: not followed, counted as "
                                "failed; point the setting at the final URL", self.name, exc.code, len(body))
                    return False
                if 400 <= exc.code < 500 and exc.code not in (408, 429):
                    log.warning("%s refused %d bytes: HTTP %d", self.name, len(body), exc.code)
                    return False
                why = f"HTTP {exc.code}"
            except (OSError, ValueError) as exc:  # refused, reset, timed out, bad URL
                why = type(exc).__name__
            # the URL may carry credentials: name the target, not the URL
            log.debug("%s: attempt %d failed (%s)", self.name, attempt + 1, why)
        # one line per batch given up (retries take seconds): an outage is not a flood
        log.warning("%s: %d bytes not delivered after %d attempts (%s); counted in "
                    "jitterscope_streams_notifications_failed_total", self.name, len(body), self.retries + 1, why)
        return False


class Notifier:
    """The configured targets (none: every call is a no-op)."""

    def __init__(self, targets: list[Target]):
        self.targets = targets

    @classmethod
    def from_settings(cls, s) -> "Notifier":
        common = dict(queue_max=s.notify_queue_max, timeout_s=s.notify_timeout_s, retries=s.notify_retries)
        resolve_timeout_ns = int(2 * max(s.alert_group_window_s, s.alert_group_quiet_s) * 1e9)
        targets = []
        if s.alertmanager_url:
            url = s.alertmanager_url.rstrip("/") + "/api/v2/alerts"
            generator = s.alertmanager_generator_url
            targets.append(Target("alertmanager", url,
                                  lambda batch: alertmanager_body(batch, resolve_timeout_ns, generator), **common))
        if s.webhook_url:
            headers = {"Authorization": f"Bearer {read_token(s.webhook_token_file)}"} if s.webhook_token_file else {}
            targets.append(Target("webhook", s.webhook_url, webhook_body, headers=headers, **common))
        return cls(targets)

    def offer(self, alerts: list[Alert]) -> None:
        for target in self.targets:
            target.offer(alerts)

    def close(self) -> None:
        for target in self.targets:
            target.close()


def read_token(path: Path) -> str:
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise errors.BadConfig(f"webhook_token_file {path} cannot be read ({exc.strerror}): "
                               "point it at a readable file holding the bearer token") from None
    if not token:
        raise errors.BadConfig(f"webhook_token_file {path} is empty: write the bearer token into it")
    return token
