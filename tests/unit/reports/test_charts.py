# SPDX-License-Identifier: Apache-2.0
"""The report's hand-written SVG (reports/charts.py): ticks, log scales,
text that fits, strings as data. How Chromium renders a whole report is
tests/integration/test_fleet.py."""

from __future__ import annotations

import re

from jitterscope.reports import charts


def test_log_ticks_are_powers_of_ten_or_of_two_over_a_narrow_range():
    assert charts.log_ticks(0.7, 98) == [0.1, 1.0, 10.0, 100.0]
    assert charts.log_ticks(3, 7) == [2.0, 4.0, 8.0]


def test_nice_ticks_cover_the_range_in_round_steps():
    assert charts.nice_ticks(0, 2494.8) == [0, 500, 1000, 1500, 2000, 2500]


def test_untrusted_names_are_escaped_and_shortened_to_fit():
    hostile = "<script>alert('x')</script>" * 3
    svg = charts.bar_chart([(hostile, 2494.8), ("b", 1.0)], unit="s", x_label="seconds")
    assert "<script" not in svg and "&lt;script&gt;" in svg
    assert "2,494.8 s</text>" in svg, "the value label is whole"
    names = re.findall(r'class="tick"[^>]*>([^<]*)</text>', svg)
    assert any(n.endswith("…") for n in names)
    line = charts.line_chart({hostile: [(1, 2.0), (2, 3.0)]}, x_label="<x>", y_label="<y>")
    assert "<script" not in line and "&lt;x&gt;" in line


def test_a_line_on_top_of_another_is_named_in_the_legend():
    svg = charts.line_chart({"a": [(0, 1.0), (1, 1.0)], "b": [(0, 1.0), (1, 1.0)], "c": [(0, 5.0), (1, 9.0)]},
                            x_label="t", y_label="ms")
    assert "b (= a)" in svg and "c (=" not in svg
