# SPDX-License-Identifier: Apache-2.0
"""common/settings.py: flags > env > TOML file > defaults, and readable errors."""

import os
from pathlib import Path

import pytest

from jitterscope.common import errors
from jitterscope.common.settings import Settings, load, to_env


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """No JITTERSCOPE_* variables from outside, and none left behind: load()
    writes JITTERSCOPE_CONFIG into os.environ itself, so register it with
    monkeypatch (set, then delete) to have it removed afterwards."""
    for name in [n for n in os.environ if n.startswith("JITTERSCOPE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("JITTERSCOPE_CONFIG", "unset")
    monkeypatch.delenv("JITTERSCOPE_CONFIG")


@pytest.fixture
def config_file(tmp_path) -> Path:
    path = tmp_path / "jitterscope.toml"
    path.write_text(
        'host = "from-file"\n'
        "runq_alert_ms = 30.0\n"
        "target_pids = [7, 8]\n"
        'target_comms = ["vllm*", "tritonserver"]\n'
        "batch_max_records = 250\n"
    )
    return path


def test_defaults():
    s = load()
    assert s.runq_threshold_ms == 5.0
    assert s.runq_alert_ms == 10.0
    assert s.target_pids == [] and s.target_comms == []
    assert not s.filters_targets
    assert s.bootstrap_servers is None


def test_overrides_apply_and_none_means_not_given():
    s = load(host="gpu-a1", runq_alert_ms=15.0, bootstrap_servers=None, target_pids=[])
    assert s.host == "gpu-a1"
    assert s.runq_alert_ms == 15.0
    assert s.bootstrap_servers is None
    assert s.target_pids == []


def test_env_list_as_json(monkeypatch):
    monkeypatch.setenv("JITTERSCOPE_TARGET_PIDS", "[1,2]")
    monkeypatch.setenv("JITTERSCOPE_RUNQ_ALERT_MS", "20")
    s = load()
    assert s.target_pids == [1, 2]
    assert s.runq_alert_ms == 20.0
    assert s.filters_targets


def test_config_file(config_file):
    s = load(config_file=config_file)
    assert s.host == "from-file"
    assert s.runq_alert_ms == 30.0
    assert s.target_pids == [7, 8]
    assert s.target_comms == ["vllm*", "tritonserver"]
    assert s.batch_max_records == 250
    assert s.runq_threshold_ms == 5.0  # not in the file: default
    assert os.environ["JITTERSCOPE_CONFIG"] == str(config_file)  # children inherit it


def test_config_file_from_env(monkeypatch, config_file):
    monkeypatch.setenv("JITTERSCOPE_CONFIG", str(config_file))
    assert load().host == "from-file"


def test_precedence_flag_over_env_over_file(monkeypatch, config_file):
    monkeypatch.setenv("JITTERSCOPE_RUNQ_ALERT_MS", "20")
    assert load(config_file=config_file, runq_alert_ms=15.0).runq_alert_ms == 15.0
    assert load(config_file=config_file).runq_alert_ms == 20.0
    assert load(config_file=config_file, runq_alert_ms=None).runq_alert_ms == 20.0
    monkeypatch.delenv("JITTERSCOPE_RUNQ_ALERT_MS")
    assert load(config_file=config_file).runq_alert_ms == 30.0


def test_env_list_beats_file_list(monkeypatch, config_file):
    monkeypatch.setenv("JITTERSCOPE_TARGET_PIDS", "[1,2]")
    s = load(config_file=config_file)
    assert s.target_pids == [1, 2]
    assert s.target_comms == ["vllm*", "tritonserver"]  # not overridden: still from the file


def test_bad_value_flag():
    with pytest.raises(errors.BadConfig, match=r"runq_alert_ms: .*greater than 0"):
        load(runq_alert_ms=-1.0)


def test_bad_value_env(monkeypatch):
    monkeypatch.setenv("JITTERSCOPE_BROKER_PORT", "not-a-port")
    with pytest.raises(errors.BadConfig, match="broker_port"):
        load()


def test_bad_value_in_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("batch_max_records = 0\n")
    with pytest.raises(errors.BadConfig, match=r"batch_max_records: .*greater than or equal to 1"):
        load(config_file=path)


def test_unknown_key_in_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("runq_alert_msec = 3\n")
    with pytest.raises(errors.BadConfig, match="runq_alert_msec"):
        load(config_file=path)


def test_empty_comm_pattern_is_rejected():
    with pytest.raises(errors.BadConfig, match="empty process-name pattern"):
        load(target_comms=["vllm*", ""])


def test_missing_config_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(errors.BadConfig, match=r"nope\.toml does not exist"):
        load(config_file=missing)
    assert "JITTERSCOPE_CONFIG" not in os.environ


def test_bad_config_exit_code():
    assert errors.BadConfig.exit_code == 78
    assert issubclass(errors.BadConfig, errors.JitterscopeError)


def test_to_env_round_trip(monkeypatch, tmp_path):
    original = load(host="gpu-a1", data_dir=tmp_path / "data", bootstrap_servers="kafka:9092",
                    kafka_idempotence=False, runq_alert_ms=12.5, target_pids=[1, 2],
                    target_comms=["vllm*"], broker_port=0)
    env = to_env(original)
    assert env["JITTERSCOPE_TARGET_PIDS"] == "[1, 2]"
    assert env["JITTERSCOPE_TARGET_COMMS"] == '["vllm*"]'
    assert "JITTERSCOPE_CLICKHOUSE_URL" not in env  # None is left out
    assert all(isinstance(v, str) for v in env.values())

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert Settings() == original


def test_malformed_env_list_is_bad_config_with_a_hint(monkeypatch):
    monkeypatch.setenv("JITTERSCOPE_TARGET_PIDS", "notjson")
    with pytest.raises(errors.BadConfig, match="JSON"):
        load()


def test_toml_syntax_error_is_bad_config(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("host = \n")
    with pytest.raises(errors.BadConfig, match=f"config file {path} is not valid TOML: .*line 1"):
        load(config_file=path)


def test_missing_file_named_by_env_is_bad_config(monkeypatch, tmp_path):
    monkeypatch.setenv("JITTERSCOPE_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(errors.BadConfig, match="does not exist"):
        load()


def test_the_shipped_example_config_loads():
    example = Path(__file__).resolve().parents[3] / "deploy/jitterscope.example.toml"
    s = load(config_file=example)  # every key commented out (tests/unit/common/test_settings_example.py)
    assert s.bootstrap_servers is None and s.runq_alert_ms == Settings.model_fields["runq_alert_ms"].default


def test_every_field_is_in_exactly_one_section():
    from jitterscope.common import settings as settings_mod

    owners: dict[str, list[str]] = {}
    for section in settings_mod.SECTIONS:
        assert issubclass(Settings, section)
        for name in section.model_fields:
            owners.setdefault(name, []).append(section.__name__)
    assert {n: o for n, o in owners.items() if len(o) != 1} == {}
    assert list(owners) == list(Settings.model_fields)  # no field outside a section, in section order


def test_section_names_are_the_documented_ones():
    import re

    from jitterscope.common import settings as settings_mod

    names = [section.__name__ for section in settings_mod.SECTIONS]
    assert names == ["KafkaSettings", "StoreSettings", "CollectorSettings", "StreamsSettings", "ExportSettings",
                     "UpSettings"]
    assert re.findall(r"^- ``(\w+Settings)``", settings_mod.__doc__, re.M) == names
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert all(f"`{name}`" in readme for name in names)


def test_set_gives_an_empty_list_and_an_unset_list_flag_gives_nothing():
    from jitterscope.options import load_settings

    # --set hardware_probes='[]': no hardware probes (it used to load every one)
    assert load_settings(None, ["hardware_probes=[]"]).hardware_probes == []
    # a list flag not given reaches load_settings as [] and leaves the setting alone
    assert load_settings(None, [], target_pids=[]).hardware_probes == Settings().hardware_probes
    assert load_settings(None, ["target_pids=[7]"], target_pids=[]).target_pids == [7]
    assert load_settings(None, ["target_pids=[7]"], target_pids=[8]).target_pids == [8]  # the named flag wins


def test_the_old_probe_name_cfs_is_throttle_with_a_warning(caplog):
    with caplog.at_level("WARNING"):
        s = load(hardware_probes=["cfs", "irq", "throttle"])
    assert s.hardware_probes == ["throttle", "irq"]
    assert "'cfs' is now called 'throttle'" in caplog.text
    with pytest.raises(errors.BadConfig, match="unknown probe"):
        load(hardware_probes=["runqlat"])
