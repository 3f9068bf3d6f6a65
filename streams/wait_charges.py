# SPDX-License-Identifier: Apache-2.0
"""The charges of every window of a due() batch, from its waits' and edge
parts' splits as columns: streams/wait_columns.py's arithmetic. Pure
logic, no I/O.

Each part (a whole wait, or a part a window clips off one) charges keys as
streams/wait_index.py's ``_shares`` does: its throttled cgroup, the
interrupts (in all, and per source), and of the rest the group's own
threads (in all, and one per holder thread), the idle task, or a suspect
(comm, pid). A window's total per key is the sum over the waits ending
inside it (prefix sums over the waits in end order, searched per key),
less the whole shares of those that start before it, plus its edge parts'
shares: what WaitIndex.charges adds, for every window at once.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from jitterscope.streams.split_columns import Splits
from jitterscope.streams.wait_index import TOP_SUSPECTS, Charged, Tie, rank_suspects

STOLEN, OWN, IDLE = 0, 1, 2  # the keys every batch has; the others follow in blocks


class Keys:
    """The batch's keys: STOLEN, OWN, IDLE, then a block per kind (throttle, irq, own thread, suspect)."""

    def __init__(self) -> None:
        self.blocks: dict[str, tuple[int, list]] = {}  # kind -> (first key, what each key of it names)
        self.size = 3

    def block(self, kind: str, names: list) -> int:
        self.blocks[kind] = (self.size, names)
        self.size += len(names)
        return self.blocks[kind][0]

    def span(self, kind: str) -> slice:
        first, names = self.blocks[kind]
        return slice(first, first + len(names))


def entries(keys: Keys, splits: Splits, waits, k: np.ndarray, length: np.ndarray, group_pids: np.ndarray,
            grouped: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(part, key, value) of every part's charges (parts: the splits'
    rows; part p is a part of wait k[p], ``length`` ns long)."""
    throttle = keys.block("throttle", [*splits.cgroup_names, ""])  # charged -1 (none) is the last: ""
    irq = keys.block("irq", splits.source_names)
    rest = length - splits.cut - splits.stolen
    spid, stid = waits.spid[k], waits.stid[k]
    own = (rest > 0) & grouped & np.isin(spid, group_pids)
    idle = (rest > 0) & ~own & (spid == 0)
    blamed = (rest > 0) & ~own & ~idle
    threads, thread_key = np.unique(stid[own], return_inverse=True)
    own_thread = keys.block("own thread", threads.tolist())
    suspects, suspect_key = np.unique((waits.comm[k][blamed] << 32) | spid[blamed], return_inverse=True)
    suspect = keys.block("suspect", [(int(s) >> 32, int(s) & 0xFFFFFFFF) for s in suspects.tolist()])
    parts = np.arange(len(k))
    own_at, idle_at, blamed_at = parts[own], parts[idle], parts[blamed]
    return (np.concatenate([parts, parts, splits.part, own_at, own_at, idle_at, blamed_at]),
            np.concatenate([throttle + np.where(splits.charged >= 0, splits.charged, len(splits.cgroup_names)),
                            np.full(len(k), STOLEN), irq + splits.source_code, np.full(len(own_at), OWN),
                            own_thread + thread_key.reshape(-1), np.full(len(idle_at), IDLE),
                            suspect + suspect_key.reshape(-1)]),
            np.concatenate([splits.cut, splits.stolen, splits.ns, rest[own], np.ones(len(own_at), dtype=np.int64),
                            rest[idle], rest[blamed]]))


def totals(keys: Keys, made: tuple, waits, windows: tuple[np.ndarray, np.ndarray], edges: tuple,
           whole: int) -> np.ndarray:
    """Per window (row) and key (column), what its parts charge the key."""
    part, key, value = made
    start, end = windows
    edge_r, edge_k = edges[0], edges[1]
    order = np.argsort(waits.end, kind="stable")  # WaitIndex's waits in end order
    position = np.empty(whole, dtype=np.int64)
    position[order] = np.arange(whole)
    ends = waits.end[order]
    a, b = np.searchsorted(ends, start, "right"), np.searchsorted(ends, end, "right")
    mine = part < whole
    stride = whole + 1
    sort_key = key[mine] * stride + position[part[mine]]
    by = np.argsort(sort_key, kind="stable")
    sort_key, sums = sort_key[by], np.r_[0, np.cumsum(value[mine][by])]
    lane = (np.arange(keys.size, dtype=np.int64) * stride)[None, :]
    out = (sums[np.searchsorted(sort_key, lane + b[:, None], "left")]
           - sums[np.searchsorted(sort_key, lane + a[:, None], "left")])
    # an edge wait ending inside the window was counted whole above: its whole shares out, its part's in
    counted = (waits.begin[edge_k] < start[edge_r]) & (waits.end[edge_k] <= end[edge_r])
    whole_part, whole_key, whole_value = part[mine], key[mine], value[mine]
    by_part = np.argsort(whole_part, kind="stable")
    offsets = np.searchsorted(whole_part[by_part], np.arange(whole + 1))
    r_out, k_out = edge_r[counted], edge_k[counted]
    counts = offsets[k_out + 1] - offsets[k_out]
    at = by_part[np.repeat(offsets[k_out] - np.cumsum(np.r_[0, counts[:-1]]), counts) + np.arange(counts.sum())]
    np.subtract.at(out, (np.repeat(r_out, counts), whole_key[at]), whole_value[at])
    np.add.at(out, (edge_r[part[~mine] - whole], key[~mine]), value[~mine])
    return out


def charged(keys: Keys, table: np.ndarray, runq: list[tuple[int, int, int]], pids: list[set[int]], comm_name,
            first_source) -> tuple[list, np.ndarray]:
    """Every window's charges from its row of totals (Tie where the walk's
    order would decide), and per window the source of interrupts charged
    most (-1: none asked). The throttles name only the one charged most:
    all attribution reads of them (``_culprit``); the sources name all
    (steal is one of them, by its kind).
    ``first_source(window, sources)``: of tied sources, the one the walk
    met first (None: not known here, a Tie)."""
    throttles, sources = table[:, keys.span("throttle")], table[:, keys.span("irq")]
    throttled, irq = throttles.sum(axis=1), table[:, STOLEN]
    tie = (throttled > 0) & _tied(throttles)
    top_throttle = throttles.argmax(axis=1) if throttles.shape[1] else np.zeros(len(table), dtype=np.int64)
    top_source = np.where(irq > 0, sources.argmax(axis=1) if sources.shape[1] else 0, -1)
    for r in np.flatnonzero((irq > 0) & (_tied(sources) | (sources.max(axis=1, initial=0) == 0))).tolist():
        found = first_source(r, np.flatnonzero(sources[r] == sources[r].max()))  # max() keeps the first met
        tie[r] |= found is None
        top_source[r] = -1 if found is None else found
    cgroup_names, source_names = keys.blocks["throttle"][1], keys.blocks["irq"][1]
    suspect_names, thread_names = keys.blocks["suspect"][1], keys.blocks["own thread"][1]
    rows = zip(tie.tolist(), throttled.tolist(), top_throttle.tolist(), irq.tolist(), top_source.tolist(),
               table[:, keys.span("suspect")].tolist(), table[:, keys.span("own thread")].tolist(),
               table[:, OWN].tolist(), table[:, IDLE].tolist(), runq, pids, sources.tolist())
    out: list[Charged | type[Tie]] = []
    for tied, cut, cgroup, stolen, source, suspects, threads, own, idle, window, found, by_source in rows:
        by_suspect: dict[str, dict[int, int]] = defaultdict(dict)
        for (comm, pid), ns in zip(suspect_names, suspects):
            if ns > 0:
                by_suspect[comm_name(comm)][pid] = ns
        sums = [sum(p.values()) for p in by_suspect.values()]
        if tied or len(set(sums)) < len(sums) or any(_tied_values(p.values()) for p in by_suspect.values()):
            out.append(Tie)
            continue
        out.append(Charged(runq=window, suspects=rank_suspects(by_suspect, TOP_SUSPECTS), throttled=cut,
                           throttles={cgroup_names[cgroup]: cut} if cut else {}, irq=stolen,
                           sources=_sources(source_names, source, by_source) if stolen else {}, irq_records={},
                           own_ns=own,
                           own_threads={tid for tid, n in zip(thread_names, threads) if n > 0}, idle_ns=idle,
                           pids=found))
    return out, top_source


def _sources(names: list[tuple], top: int, by_source: list[int]) -> dict[tuple, int]:
    """A window's interrupt ns per source (cpu, kind, source), the one charged most first (on a tie, the
    one the walk met first: ``_culprit`` names the first of the largest); steal is told apart by its kind."""
    found = {names[top]: by_source[top]}
    found.update((name, ns) for name, ns in zip(names, by_source) if ns > 0 and name not in found)
    return found


def _tied_values(values) -> bool:
    """Whether the largest of ``values`` is shared."""
    top = sorted(values, reverse=True)[:2]
    return len(top) == 2 and top[0] == top[1]


def _tied(block: np.ndarray) -> np.ndarray:
    """Per row, whether its largest value is shared."""
    if block.shape[1] < 2:
        return np.zeros(len(block), dtype=bool)
    top = np.partition(block, -2, axis=1)
    return top[:, -1] == top[:, -2]
