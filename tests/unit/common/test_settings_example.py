# SPDX-License-Identifier: Apache-2.0
"""deploy/jitterscope.example.toml is generated from the settings model
(`jitterscope config --example`): it lists every setting, with defaults that
load, and stays current as settings are added."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from jitterscope.common import settings

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "jitterscope.example.toml"
REGENERATE = ".venv/bin/jitterscope config --example > deploy/jitterscope.example.toml"


def test_the_example_file_is_the_generated_one():
    assert EXAMPLE.read_text() == settings.example_toml(), f"out of date: run {REGENERATE}"


def test_every_setting_is_in_the_example_once():
    text = settings.example_toml()
    named = re.findall(r"^# (\w+)(?: = | is unset by default)", text, flags=re.M)
    assert sorted(named) == sorted(settings.Settings.model_fields), "a setting is missing or listed twice"


def test_the_example_values_uncommented_load_as_the_defaults(tmp_path, monkeypatch):
    monkeypatch.delenv("JITTERSCOPE_CONFIG", raising=False)
    assignments = [line[2:] for line in settings.example_toml().splitlines()
                   if re.match(r"# \w+ = ", line) and not line.endswith(")")]  # machine-dependent ones end in (...)
    path = tmp_path / "all.toml"
    path.write_text("\n".join(assignments) + "\n")
    values = tomllib.loads(path.read_text())
    loaded = settings.load(path)
    defaults = settings.Settings()
    for name, value in values.items():
        assert getattr(loaded, name) == getattr(defaults, name), name
