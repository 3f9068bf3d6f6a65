# SPDX-License-Identifier: Apache-2.0
"""JSON log lines for daemons (one object a line on stderr)."""

from __future__ import annotations

import json
import logging
import sys
import time


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def setup(level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def fields(**kw) -> dict:
    """logger.info("msg", extra=fields(a=1)) adds a=1 to the JSON line."""
    return {"fields": kw}


#: The same JSON lines through logging.config, for frameworks that set up
#: logging themselves (Faust's worker).
DICT_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": "jitterscope.common.logs.JsonFormatter"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}},
    "root": {"level": "INFO", "handlers": ["stderr"]},
}


# C0 (with tab and newline: a printed line must stay one line), DEL and C1
# controls, and the bidirectional overrides/isolates that can make text read
# differently from what it holds ("Trojan Source"). Everything else, printable
# unicode included, passes unchanged.
_UNPRINTABLE = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}
_UNPRINTABLE.update({c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))})
# and the line separators that are not control characters: a terminal or a
# log reader that splits on them would show one record as several lines
_UNPRINTABLE.update({c: f"\\u{c:04x}" for c in (0x2028, 0x2029)})


def printable(text: str) -> str:
    """``text`` safe for an operator's terminal: control characters become
    visible escapes (``\\x1b``) instead of acting on the terminal. For every
    untrusted string (process names, span attributes) printed to a console."""
    return text.translate(_UNPRINTABLE)
