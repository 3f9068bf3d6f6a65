# SPDX-License-Identifier: Apache-2.0
"""Alert grouping (streams/alert_groups.py) with synthetic alerts and a fake
clock: first alert at once, repeats folded, one re-announcement per window,
resolution when quiet, bounded memory, hardware kinds untouched."""

from __future__ import annotations

import msgspec

from jitterscope.schemas.events import Alert
from jitterscope.schemas.batches import BatchDecoder, encode_batch
from jitterscope.streams.alert_groups import (FIRING, FOLDED, GROUPED_KINDS, QUIET_PERIOD_NS, RESOLVED,
                                              RESOLVED_SEQ_BIT, AlertGroups, Cooldowns, announced, group_id,
                                              group_key)

S = 1_000_000_000
T0 = 1_700_000_000 * S


def alert(seq: int, wait_ms: float = 15, *, pid: int = 100, suspect: str = "jshog", kind: str = "runq_starvation",
          host: str = "h1", severity: str = "warning", **extra) -> Alert:
    return Alert(host=host, boot_id="b", seq=seq, ts_ns=T0 + seq, raised_ns=T0 + seq, kind=kind,
                 severity=severity, pid=pid, tid=pid, comm="engine", cpu=1, wait_ns=int(wait_ms * 1e6),
                 suspect_pid=7, suspect_comm=suspect, cpus_allowed=[1], summary=f"engine waited {wait_ms} ms",
                 remedy="move jshog", **extra)


def states(alerts):
    return [a.evidence.get("state") for a in alerts]


def test_first_alert_goes_out_at_once_and_repeats_in_the_window_are_folded():
    g = AlertGroups(window_ns=60 * S, quiet_ns=120 * S)
    out = g.offer([alert(1)], T0)
    assert states(out) == [FIRING] and out[0].evidence["group_count"] == "1"
    assert out[0].summary == "engine waited 15 ms"  # a first alert says nothing about a group
    out = g.offer([alert(2, 40), alert(3, 20)], T0 + 10 * S)
    assert states(out) == [FOLDED, FOLDED] and not any(map(announced, out))
    assert out[-1].evidence["group_count"] == "3" and out[-1].evidence["group_worst_ns"] == str(40_000_000)
    assert [a.seq for a in out] == [2, 3], "folded alerts keep their own key: every event is stored"
    assert g.folded == 2


def test_a_firing_group_is_reannounced_once_per_window_with_its_count_and_worst():
    g = AlertGroups(window_ns=60 * S, quiet_ns=120 * S)
    g.offer([alert(1)], T0)
    fired = []
    for i in range(2, 200):  # one alert a second for ~3 windows
        fired += [a for a in g.offer([alert(i, 15 + (i == 50) * 100)], T0 + (i - 1) * S) if announced(a)]
    assert [a.seq for a in fired] == [61, 121, 181]
    assert fired[0].evidence["group_count"] == "61" and fired[0].evidence["group_worst_ns"] == str(115_000_000)
    assert "61 times in 60 s, worst 115.0 ms" in fired[0].summary
    assert fired[1].evidence["group_first_ns"] == str(T0)


def test_tick_reannounces_folded_alerts_when_the_window_is_over_without_a_new_alert():
    g = AlertGroups(window_ns=10 * S, quiet_ns=30 * S)
    g.offer([alert(1)], T0)
    g.offer([alert(2, 50)], T0 + 2 * S)
    assert g.tick(T0 + 9 * S) == []
    again = g.tick(T0 + 10 * S)
    assert states(again) == [FIRING] and again[0].seq == 2 and again[0].evidence["group_count"] == "2"
    assert g.tick(T0 + 25 * S) == [], "nothing new since: not announced again"


def test_a_quiet_group_is_resolved_with_its_totals_under_a_key_of_its_own():
    g = AlertGroups(window_ns=60 * S, quiet_ns=120 * S)
    g.offer([alert(1, 12, severity="warning")], T0)
    g.offer([alert(2, 150, severity="critical"), alert(3, 20)], T0 + 5 * S)
    assert states(g.tick(T0 + 60 * S)) == [FIRING]  # the window is over: the folded two are announced
    assert g.tick(T0 + 124 * S) == []
    (resolved,) = g.tick(T0 + 125 * S)
    assert resolved.kind == "runq_starvation" and resolved.evidence["state"] == RESOLVED
    assert resolved.evidence["group_count"] == "3" and resolved.wait_ns == 150_000_000
    assert resolved.evidence["group_first_ns"] == str(T0) and resolved.evidence["group_last_ns"] == str(T0 + 5 * S)
    assert resolved.seq == 3 | RESOLVED_SEQ_BIT and resolved.raised_ns == T0 + 125 * S
    assert resolved.evidence["group_severity"] == "warning", "the group keeps its first severity"
    assert resolved.summary.startswith("resolved (quiet for 120 s): 3 alert(s)") and announced(resolved)
    assert g.groups == {}
    good, bad = BatchDecoder(Alert).decode(encode_batch([resolved]))  # what readers of the alerts topic do
    assert good == [resolved] and not bad
    # the next alert starts a new group and goes out at once
    assert states(g.offer([alert(4)], T0 + 200 * S)) == [FIRING]


def test_groups_are_per_host_victim_kind_and_suspect():
    g = AlertGroups(window_ns=60 * S, quiet_ns=120 * S)
    out = g.offer([alert(1), alert(2, pid=101), alert(3, suspect="tar"), alert(4, host="h2"),
                   alert(5, kind="cfs_throttling"), alert(6)], T0)
    assert states(out) == [FIRING] * 5 + [FOLDED]
    assert len({a.evidence["group"] for a in out}) == 5
    assert out[0].evidence["group"] == group_id(group_key(alert(99))), "the group id is stable"


def test_hardware_kinds_pass_through_untouched():
    g = AlertGroups(window_ns=60 * S, quiet_ns=120 * S)
    hw = [alert(i, kind="numa_cpu_mismatch") for i in range(3)]
    assert g.offer(hw, T0) == hw and g.groups == {}


def test_memory_is_bounded_and_an_evicted_group_is_resolved_not_lost():
    g = AlertGroups(window_ns=60 * S, quiet_ns=120 * S, max_groups=3)
    for pid in (1, 2, 3):
        g.offer([alert(pid, pid=pid)], T0 + pid * S)
    g.offer([alert(10, pid=1)], T0 + 5 * S)  # pid 1 is now the most recent: pid 2 is the one quiet longest
    out = g.offer([alert(11, pid=4)], T0 + 6 * S)
    assert states(out) == [RESOLVED, FIRING] and out[0].pid == 2
    assert len(g.groups) == 3 and g.evicted == 1


def test_host_level_irq_alerts_group_per_cpu_and_interrupt_and_keep_their_evidence():
    def irq(seq, cpu, source):
        return msgspec.structs.replace(
            alert(seq, pid=0, kind="irq", suspect="", evidence={"source": source, "count": "900"}), cpu=cpu)

    g = AlertGroups(window_ns=60 * S, quiet_ns=120 * S)
    out = g.offer([irq(1, 1, "35"), irq(2, 0, "35"), irq(3, 1, "NET_RX"), irq(4, 1, "35")], T0)
    assert states(out) == [FIRING, FIRING, FIRING, FOLDED]
    assert out[3].evidence["count"] == "900" and out[3].evidence["group_count"] == "2", "the rule's count stays"


def test_cfs_throttling_groups_per_quota_cgroup():
    g = AlertGroups(window_ns=60 * S, quiet_ns=120 * S)
    a, b = (alert(i, kind="cfs_throttling", suspect="", evidence={"cgroup": f"/kubepods/pod{i}"}) for i in (1, 2))
    assert states(g.offer([a, b, a], T0)) == [FIRING, FIRING, FOLDED]


def test_a_sampled_finding_is_raised_once_per_quiet_period_per_key():
    cooldowns = Cooldowns({"migration_storm": 60 * S})
    storm = lambda at_s, host="h1": msgspec.structs.replace(  # noqa: E731
        alert(1, kind="migration_storm", host=host), raised_ns=T0 + at_s * S)
    assert cooldowns.fresh(storm(0), 42)
    assert not cooldowns.fresh(storm(30), 42)  # the same thread, within the minute: dropped
    assert cooldowns.fresh(storm(30), 43)  # another thread
    assert cooldowns.fresh(storm(30, host="h2"), 42)  # another host
    assert not cooldowns.fresh(storm(59.9), 42)
    assert cooldowns.fresh(storm(60), 42)  # the period is over: raised again, and the clock restarts
    assert not cooldowns.fresh(storm(119), 42)
    assert not cooldowns.fresh(None, 42)  # no finding
    assert all(cooldowns.fresh(alert(i), 42) for i in range(3))  # a kind with no period is never dropped


def test_every_kind_cooled_down_or_grouped_is_named_in_one_module():
    # the handlers hold no repeat table of their own (one place, this module)
    import jitterscope.streams.handlers as handlers
    assert not [name for name, value in vars(handlers).items() if name.isupper() and isinstance(value, dict)
                and set(value) & (set(QUIET_PERIOD_NS) | GROUPED_KINDS)]
    assert handlers.Handlers(state=None).cooldowns.periods is QUIET_PERIOD_NS


def test_slow_requests_group_per_process_cause_and_suspect():
    g = AlertGroups(window_ns=60 * S, quiet_ns=120 * S)
    slow = lambda seq, cause, suspect="jshog": alert(seq, kind="request_slo", suspect=suspect,  # noqa: E731
                                                    evidence={"cause": cause})
    out = g.offer([slow(1, "runq_starvation"), slow(2, "runq_starvation"), slow(3, "runq_starvation", "backup"),
                   slow(4, "cfs_throttling")], T0)
    assert states(out) == [FIRING, FOLDED, FIRING, FIRING]  # one line per (cause, suspect); the storm folded
    assert len(out) == 4  # and every request's alert still stored
