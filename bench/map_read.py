# SPDX-License-Identifier: Apache-2.0
"""`bench/run.py map-read`: reading a BPF hash map of the pages signal's
shape ({pid, node} -> two u64 counters) the way the collector does every
histogram interval: key by key (bcc's ``items()``: a next-key and a lookup
syscall per entry, and their ctypes calls) against in batches
(``collector.probes.base.map_items``: BPF_MAP_LOOKUP_BATCH), best of
BENCH_MAP_ROUNDS each, alternating, in one process; and deleting exited
entries one by one against in one batch (``delete_keys``). Run as root."""

from __future__ import annotations

import os
import time

ENTRIES = int(os.environ.get("BENCH_MAP_ENTRIES", "4000"))
ROUNDS = int(os.environ.get("BENCH_MAP_ROUNDS", "7"))
PAGES_LIKE = r"""
struct page_key { u32 pid; s32 node; };
struct page_counts { u64 page_cache_pages; u64 alloc_pages; };
BPF_HASH(counts, struct page_key, struct page_counts, 65536);
"""


def _best(step) -> float:
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - started)
    return best


def bench_map_read() -> str:
    from bcc import BPF

    from jitterscope.collector.probes.base import delete_keys, map_items

    table = BPF(text=PAGES_LIKE)[b"counts"]

    def fill() -> None:
        for i in range(ENTRIES):
            key, value = table.Key(), table.Leaf()
            key.pid, key.node, value.page_cache_pages, value.alloc_pages = i, i % 2, i, i
            table[key] = value

    fill()
    assert len(map_items(table)) == len(list(table.items())) == ENTRIES
    one_by_one, batched = _best(lambda: list(table.items())), _best(lambda: map_items(table))
    keys = [k for k, _ in map_items(table)]
    half = len(keys) // 2

    def delete_each() -> None:
        for key in keys[:half]:
            del table[key]

    started = time.perf_counter()
    delete_each()
    deleted_each = time.perf_counter() - started
    started = time.perf_counter()
    delete_keys(table, keys[half:])
    deleted_batch = time.perf_counter() - started
    assert not map_items(table)
    return (f"| read a {ENTRIES:,}-entry BPF hash map ({{pid, node}} -> 2 counters), best of {ROUNDS} | "
            f"in batches (`map_items`) {batched * 1e3:.2f} ms | key by key (`items()`) {one_by_one * 1e3:.2f} ms | "
            f"{one_by_one / batched:.1f}x faster |\n"
            f"| delete {half:,} of its entries | in one batch (`delete_keys`) {deleted_batch * 1e3:.2f} ms | "
            f"one by one {deleted_each * 1e3:.2f} ms | {deleted_each / deleted_batch:.1f}x faster |")
