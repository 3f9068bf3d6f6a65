# SPDX-License-Identifier: Apache-2.0
"""`jitterscope topics create|check` against a real broker (embedded Tansu),
and `collector`/`streams` refusing a cluster without jitterscope's topics.

The bare broker is Tansu started without the topics EmbeddedBroker makes
for the single-host stack, as a fresh production cluster would be."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jitterscope import broker as broker_mod
from jitterscope import topic_admin as topics
from jitterscope.common import errors
from jitterscope.common.settings import load
from jitterscope.schemas.topics import ALL_TOPICS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bare_broker():
    patch = pytest.MonkeyPatch()
    patch.setattr(broker_mod, "create_topics", lambda *a, **k: None)
    try:
        with broker_mod.EmbeddedBroker() as b:
            patch.undo()
            yield b
    finally:
        patch.undo()


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    # wide enough that rich does not wrap the one-line error
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")} | {"COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "jitterscope.cli", *args], env={**environ, **env},
                          capture_output=True, text=True, timeout=180)


def test_workers_refuse_a_cluster_without_topics_with_the_command_that_fixes_it(bare_broker, tmp_path):
    where = bare_broker.bootstrap_servers
    for command in ("collector", "streams"):
        out = cli(command, "--bootstrap-servers", where, JITTERSCOPE_DATA_DIR=str(tmp_path))
        assert out.returncode == errors.BadConfig.exit_code, out.stdout + out.stderr
        assert f"run jitterscope topics create --bootstrap-servers {where}" in out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr  # one line, no traceback


def test_create_then_check_with_configured_partitions(bare_broker, tmp_path):
    where = bare_broker.bootstrap_servers
    missing = cli("topics", "check", "--bootstrap-servers", where)
    assert missing.returncode == errors.BadConfig.exit_code and missing.stdout.count("missing") == len(ALL_TOPICS)

    created = cli("topics", "create", "--bootstrap-servers", where, "--partitions", "6")
    assert created.returncode == 0, created.stdout + created.stderr
    assert f"created {len(ALL_TOPICS)} topic(s)" in created.stdout
    s = load(bootstrap_servers=where, kafka_partitions=6)
    states = topics.describe(s)
    assert {t.name: (t.partitions, t.replication_factor) for t in states} == {n: (6, 1) for n in ALL_TOPICS}
    assert topics.problems(s, states) == {}
    assert topics.create(s) == []  # idempotent: nothing left to make

    again = cli("topics", "check", "--bootstrap-servers", where, "--partitions", "6")
    assert again.returncode == 0 and again.stdout.count("ok") == len(ALL_TOPICS)

    # the default (4) disagrees with the cluster: the worker's Faust topics would be wrong, so it refuses
    wrong = cli("streams", "--bootstrap-servers", where, JITTERSCOPE_DATA_DIR=str(tmp_path))
    assert wrong.returncode == errors.BadConfig.exit_code
    assert "have 6 partitions, kafka_partitions is 4" in wrong.stderr and "kafka_partitions=6" in wrong.stderr

    # more replicas than this one-broker cluster has: `check` reports it
    rf = load(bootstrap_servers=where, kafka_partitions=6, kafka_replication_factor=3)
    assert set(topics.problems(rf, topics.describe(rf)).values()) == {"replication factor 1, kafka_replication_factor is 3"}


def test_up_style_create_on_an_existing_cluster_uses_the_settings(broker):
    """The module broker already has the single-host topics (4 partitions):
    create adds only what is missing and require accepts them."""
    s = load(bootstrap_servers=broker.bootstrap_servers)
    assert topics.create(s) == []
    topics.require(s)
    with pytest.raises(errors.BadConfig, match="kafka_partitions=4"):
        topics.require(load(bootstrap_servers=broker.bootstrap_servers, kafka_partitions=8))
