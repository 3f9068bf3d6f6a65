# SPDX-License-Identifier: Apache-2.0
"""The signal catalogue (schemas/signals.py) is the one place a signal's
facts live, and what is derived from it agrees with it: every file it names
exists, every table is created by the migration it names, the collector's
probe settings are the catalogue's, README's table is the catalogue's, every
input topic has its table and, where the signal has rules, its handler; and a
new signal with only a rule module and a catalogue line is judged by the
worker (the generic handler)."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path

import pytest

from jitterscope.collector.probes import registry
from jitterscope.common.settings import HARDWARE_PROBES
from jitterscope.schemas import events, signals, topics
from jitterscope.streams import clickhouse
from jitterscope.streams.handlers import Handlers

ROOT = Path(__file__).resolve().parents[2]


def migrations() -> dict[str, str]:
    """schemas/clickhouse/ file name -> its SQL."""
    return {f"{version:03d}_{name}.sql": text for version, name, text in clickhouse.migrations()}


@pytest.mark.parametrize("signal", signals.SIGNALS, ids=lambda s: s.name)
def test_every_file_the_catalogue_names_exists(signal):
    for path in (*signal.kernel, *signal.sources, *signal.rules):
        assert (ROOT / path).exists(), f"{signal.name}: {path} does not exist"


@pytest.mark.parametrize("signal", signals.SIGNALS, ids=lambda s: s.name)
def test_every_table_is_created_by_the_migration_the_catalogue_names(signal):
    sql = migrations()
    assert signal.migration in sql, f"{signal.name}: no migration {signal.migration}"
    assert f"CREATE TABLE IF NOT EXISTS {signals.DATABASE}.{signal.table} (" in sql[signal.migration]


def test_the_outputs_tables_are_created_by_their_migrations():
    sql = migrations()
    for table, migration in signals.OUTPUTS.values():
        assert f"CREATE TABLE IF NOT EXISTS {signals.DATABASE}.{table} (" in sql[migration]


def test_the_probe_settings_are_the_catalogue_s_and_each_has_a_probe():
    named = {p for s in signals.SIGNALS for p in s.probes}
    assert named == set(HARDWARE_PROBES), "common/settings.py HARDWARE_PROBES and the catalogue disagree"
    assert named | set(registry.ALWAYS_ON) == set(registry.PROBES)


def test_names_are_unique_and_the_derived_tables_are_the_catalogue_s():
    assert len(signals.BY_NAME) == len(signals.SIGNALS)
    assert len({s.topic for s in signals.SIGNALS}) == len({s.table for s in signals.SIGNALS}) == len(signals.SIGNALS)
    assert topics.INPUT_TOPICS == {s.topic: s.record for s in signals.SIGNALS}
    assert clickhouse.TABLE_OF == signals.TABLE_OF
    assert all(clickhouse.TABLE_OF[record] for record in topics.INPUT_TOPICS.values())


def test_every_signal_but_the_host_facts_reaches_a_handler():
    table = Handlers(state=None).table
    assert set(table) <= set(topics.INPUT_TOPICS)
    # these only feed the host state and the store (device traffic is judged with GPU driver calls; the
    # serving engine's own metrics are set beside the causes by the report and the dashboard)
    assert {s.name for s in signals.SIGNALS if s.topic not in table} == {"stacks", "topology", "device_io", "serving"}


def test_readme_s_signal_table_is_the_catalogue_s():
    readme = (ROOT / "README.md").read_text()
    assert signals.signal_table() in readme, (
        "README's 'Where each signal lives' table differs from schemas/signals.py; paste "
        "`python -c 'from jitterscope.schemas import signals; print(signals.signal_table())'`")


def test_a_new_signal_needs_only_its_rule_module_and_a_catalogue_line(monkeypatch):
    """The toy signal: a record, a catalogue line and streams/rules/toy.py
    with ``judge`` (and ``repeat_key``); the worker routes its topic to the
    rule with no handler of its own, repeats suppressed per key."""
    toy = signals.Signal("toy", "a toy", events.Migrations, "jitterscope.toy", "toy", "001_init.sql",
                         ("collector/probes/migrate.py",))
    monkeypatch.setattr(signals, "SIGNALS", (*signals.SIGNALS, toy))
    rule = types.ModuleType("jitterscope.streams.rules.toy")

    def judge(record, state, thresholds, now_ns):
        if record.migrations < 10:
            return None
        return events.Alert(host=record.host, boot_id=record.boot_id, seq=record.seq, ts_ns=record.ts_ns,
                            raised_ns=now_ns, kind="migration_storm", severity="warning", pid=record.pid,
                            tid=record.tid, comm=record.comm, cpu=record.last_cpu, wait_ns=0, suspect_pid=0,
                            suspect_comm="", cpus_allowed=[], summary=f"toy {record.tid}", remedy="")

    rule.judge = judge
    rule.repeat_key = lambda record: (record.tid,)
    monkeypatch.setitem(sys.modules, rule.__name__, rule)
    handlers = Handlers(state=None)
    assert "jitterscope.toy" in handlers.table

    def migrations(tid, count, ts_ns):
        return events.Migrations(host="h", boot_id="b", seq=ts_ns, ts_ns=ts_ns, pid=1, tid=tid, comm="c",
                                 interval_ns=1, migrations=count, cross_node=0, last_cpu=0)

    batch = [migrations(1, 50, 1), migrations(1, 60, 2), migrations(2, 3, 3), migrations(3, 99, 4)]
    alerts = asyncio.run(handlers.handle("jitterscope.toy", batch, 10**18))
    # tid 1 once (migration_storm repeats are quiet for a minute), tid 2 under the rule's bar, tid 3 once
    assert [a.summary for a in alerts] == ["toy 1", "toy 3"]
