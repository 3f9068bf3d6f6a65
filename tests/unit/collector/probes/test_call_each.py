# SPDX-License-Identifier: Apache-2.0
"""One signal's fault stops that signal, not the collector
(collector/probes/interface.py ``call_each``): the failing probe is closed,
removed and counted; the others' calls and results go on in order."""

from __future__ import annotations

from jitterscope.collector.probes.interface import SIGNALS_DROPPED, call_each


class FakeProbe:
    def __init__(self, name: str, fail: Exception | None = None, fail_close: bool = False):
        self.name, self.fail, self.fail_close = name, fail, fail_close
        self.calls, self.closed = 0, False

    def periodic(self) -> list[str]:
        self.calls += 1
        if self.fail:
            raise self.fail
        return [self.name]

    def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise OSError("already broken")


def dropped(name: str) -> float:
    return SIGNALS_DROPPED.labels(name)._value.get()


def test_a_failing_probe_is_closed_dropped_and_counted_and_the_others_run(caplog):
    runq, migrate, pages = FakeProbe("runq"), FakeProbe("migrate", Exception("Bad file descriptor"), True), FakeProbe("pages")
    probes = [runq, migrate, pages]
    before = dropped("migrate")
    assert call_each(probes, "periodic", lambda p: p.periodic()) == [["runq"], ["pages"]]
    assert probes == [runq, pages]
    assert migrate.closed and not runq.closed and not pages.closed
    assert dropped("migrate") == before + 1
    assert "migrate" in caplog.text or any(getattr(r, "fields", {}).get("probe") == "migrate" for r in caplog.records)
    assert call_each(probes, "periodic", lambda p: p.periodic()) == [["runq"], ["pages"]]
    assert (runq.calls, migrate.calls, pages.calls) == (2, 1, 2)


def test_no_probe_fails_nothing_changes():
    probes = [FakeProbe("runq"), FakeProbe("pages")]
    assert call_each(list(probes), "periodic", lambda p: p.periodic()) == [["runq"], ["pages"]]
    assert not any(p.closed for p in probes)
