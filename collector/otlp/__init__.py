# SPDX-License-Identifier: Apache-2.0
"""The collector's OpenTelemetry receiver: OTLP/HTTP traces in, requests out.

Inference servers (vLLM first) export a span per request. Each request span
becomes the fields of a ``jitterscope.schemas.events.RequestSpan`` (everything
but the ``Record`` stamps host/boot_id/seq/ts_ns, which the caller adds; its
``ts_ns`` is the span's end)::

    RequestSpan(**stamp.header(RequestSpan, fields["end_ns"]), **fields)

Which spans are requests: one carrying a request-ID attribute
(``gen_ai.request.id`` by default), else a root or SERVER span, identified
by its trace ID. Other spans (a request's children) are skipped and counted.

The serving process: the process at the other end of the HTTP connection,
looked up in /proc whatever its address (`pid_of_peer`: this network
namespace's socket tables, then those of every other namespace on the host,
a pod's included), else, for a relay, the resource attribute
``process.pid``, else 0 (host level).

Who may speak for whom: a sender on this host (its connection's process is
known) is charged its own spans. Its resource may name another process
(``process.pid``, ``container.id``, ``k8s.pod.uid``) only within the
sender's own container or pod, or, for a sender in its own PID namespace,
its own cgroup; a claim beyond that is refused: the spans are charged to the
sender and counted as ``how="refused_claim"``. Only a relay named in
``trusted_relays`` (setting ``otlp_trusted_relays``: process names as
/proc/PID/comm shows them, executable paths as /proc/PID/exe does, or the
addresses it sends from; an OpenTelemetry Collector) speaks for any process.
A sender whose process is not known (another host, or a socket no process
on this host holds) and that is no relay by address has its claims ignored:
its spans are kept at host level (pid 0), counted as
``how="unverified_claim"``. Its ``process.pid`` would otherwise let anything
that reaches the port (every pod, when the receiver listens on the node IP)
make any process a watched target.

From a container, ``process.pid`` is a pid in the container's PID namespace
(`PidResolver`): where the connection's process is known and its innermost
pid (NSpid) is ``process.pid``, it is the sender; else a resource with
``container.id`` or ``k8s.pod.uid`` is translated through NSpid among that
container's processes (the sender's own container or pod; any container or pod for a relay); a
sender known to be in another PID namespace without those attributes is
translated within its own cgroup. A translation
that finds nothing gives pid 0, never the untranslated pid (which names
some unrelated host process). How each request's pid was found is counted
in ``jitterscope_otlp_pid_resolved_total{how}``.

Bodies are untrusted: sizes are capped before reading and after gunzip, parse
errors answer 400, attribute strings are kept verbatim as data (truncated),
and nothing a sender does makes a handler raise. Frequent events are
counters (``jitterscope_otlp_*``), not log lines.

Spans whose ids or times are impossible are *rejected* one by one, never the
whole export: the others are kept, and the answer is an OTLP partial success
(``rejected_spans`` and a message). Times must fit the store's DateTime64(9)
(epoch ns below 2^63, see ``schemas.events.EpochNs``): a value at or past that
would fail a whole ClickHouse insert later. Beyond that, a span that starts
at 0, ends before it starts, or ends more than ``MAX_FUTURE_NS`` (a day)
after the receiver's clock is a broken clock, not a request. There is no floor
on how old a span may be: spans and kernel events share the host's clock, so
an old-looking clock still joins.

Senders are untrusted too: at most ``max_connections`` connections are served
at once (more wait in the kernel's accept backlog, served as slots free up),
and each request, headers and body, must arrive within ``read_timeout_s``
from when the receiver starts reading it. A client that sent part of a
request by then gets 408 and is disconnected; one that sent nothing (an idle
keep-alive connection) is disconnected quietly. So a slowloris holds a slot
for ``read_timeout_s`` at most.

The parts: `convert` (bodies in, request records out: parsing, which spans
are requests, rejections), `pids` (which process sent them: the loopback
peer, `PidResolver`) and `server` (HTTP, `OtlpReceiver`, and the guards
against slow and too many clients). Everything other modules import is
here too, so ``from jitterscope.collector.otlp import OtlpReceiver`` still
works.
"""

from jitterscope.collector.otlp.convert import (
    DEFAULT_REQUEST_ID_ATTRIBUTES,
    JSON,
    MAX_FUTURE_NS,
    MAX_PHASE_S,
    MAX_STRING_CHARS,
    PHASE_ATTRIBUTES,
    PID_MAX_LIMIT,
    PID_RESOLVED,
    PROTOBUF,
    Converted,
    OtlpError,
    media_type,
    parse_export_request,
    resource_pid,
    resource_string,
    spans_to_requests,
)
from jitterscope.collector.otlp.pids import PidResolver, pid_of_peer
from jitterscope.collector.otlp.server import (
    CONNECTION_ERRORS,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_READ_TIMEOUT_S,
    HTTP_REQUESTS,
    REQUESTS_PRODUCED,
    SPANS_RECEIVED,
    SPANS_REJECTED,
    SPANS_SKIPPED,
    TIMEOUTS,
    TRACES_PATH,
    OtlpReceiver,
    OtlpReceiverUnavailable,
)

__all__ = [
    "CONNECTION_ERRORS", "DEFAULT_MAX_BODY_BYTES", "DEFAULT_MAX_CONNECTIONS", "DEFAULT_READ_TIMEOUT_S",
    "DEFAULT_REQUEST_ID_ATTRIBUTES", "HTTP_REQUESTS", "JSON", "MAX_FUTURE_NS", "MAX_PHASE_S", "MAX_STRING_CHARS",
    "PHASE_ATTRIBUTES", "PID_MAX_LIMIT", "PID_RESOLVED", "PROTOBUF", "REQUESTS_PRODUCED", "SPANS_RECEIVED",
    "SPANS_REJECTED", "SPANS_SKIPPED", "TIMEOUTS", "TRACES_PATH",
    "Converted", "OtlpError", "OtlpReceiver", "OtlpReceiverUnavailable", "PidResolver",
    "media_type", "parse_export_request", "pid_of_peer", "resource_pid", "resource_string", "spans_to_requests",
]
