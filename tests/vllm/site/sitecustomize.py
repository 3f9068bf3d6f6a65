# SPDX-License-Identifier: Apache-2.0
"""Loaded by the vLLM API server the end-to-end test starts (on its
PYTHONPATH), in the API server only (the `vllm` command, not the engine
processes it spawns). Two things:

- Its spans carry ``thread.id`` (OpenTelemetry's semantic conventions), the
  thread that serves the request, which vLLM's own spans leave out: a span
  processor stamps it at span start, on the event loop's thread (the
  snippet docs/requests.md gives users). jitterscope then accounts that
  thread's time, not the most delayed thread of the group's.
- A thread named ``gil-hog`` that, while the file named by
  JITTERSCOPE_GIL_HOG_FILE exists, holds the GIL through blocking calls: a
  C extension that sleeps or does I/O without releasing it (a tokenizer or
  logging binding), called through ctypes.PyDLL, which keeps the GIL. It
  uses almost no CPU, so vLLM's engine keeps its CPUs: the API server's
  event loop waits, for the GIL. Idle, it sleeps (GIL released)."""

import ctypes
import os
import sys
import threading
import time

TRIGGER = os.environ.get("JITTERSCOPE_GIL_HOG_FILE")
HOLD_US = 100_000  # each blocking call holds the GIL this long (a synchronous network call, say)


def _hog() -> None:
    libc = ctypes.PyDLL(None)  # PyDLL: the GIL stays held during the call
    libc.prctl(15, b"gil-hog", 0, 0, 0)  # PR_SET_NAME: the thread name jitterscope should give
    while True:
        if not os.path.exists(TRIGGER):
            time.sleep(0.02)
            continue
        for _ in range(10):
            libc.usleep(HOLD_US)
            sum(range(1000))  # back in bytecode: a waiter's drop request is served here


def _stamp_thread_ids() -> None:
    from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

    class ThreadId(SpanProcessor):
        def on_start(self, span, parent_context=None):
            span.set_attribute("thread.id", threading.get_native_id())

    init = TracerProvider.__init__

    def with_thread_ids(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.add_span_processor(ThreadId())

    TracerProvider.__init__ = with_thread_ids


if os.path.basename(sys.argv[0]) == "vllm":
    _stamp_thread_ids()
    if TRIGGER:
        threading.Thread(target=_hog, name="gil-hog", daemon=True).start()
