# SPDX-License-Identifier: Apache-2.0
"""The Helm chart (deploy/helm/jitterscope), offline: no `helm` binary runs
here, so tests/helm_render.py renders the subset of Go templates the chart
uses. Checked: the values schema against the defaults (and a bad value);
every rendered object against the Kubernetes schemas, strictly; the chart's
objects against the kustomize base's for the same settings, field by field
where a pod is defined; Kafka SASL/TLS wired as the production overlay wires
it; and the config is settings jitterscope accepts. Not checked: that Helm
itself renders the chart the same way (docs/kubernetes.md says so)."""

from __future__ import annotations

import copy
import json
import tomllib

import jsonschema
import kubernetes_validate
import pytest
import yaml

from jitterscope.common.settings import load
from tests.helm_render import Chart
from tests.unit.deploy.manifests import ROOT, one, render

CHART = ROOT / "deploy/helm/jitterscope"
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
PRODUCTION = {"kafka": {"bootstrapServers": "kafka-1:9093", "securityProtocol": "SASL_SSL",
                        "saslMechanism": "SCRAM-SHA-512", "saslUsername": "jitterscope",
                        "existingSecret": "jitterscope-kafka"},
              "clickhouse": {"cluster": "fleet"}, "streams": {"replicas": 4}}


def values() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text())


def test_the_values_schema_takes_the_defaults_and_refuses_a_bad_value():
    jsonschema.validate(values(), schema())
    for path, bad in ((("streams", "replicas"), "two"), (("kafka", "securityProtocol"), "TLS"),
                      (("clickhouse", "url"), "clickhouse:8123"), (("collectr",), {})):
        wrong = copy.deepcopy(values())
        *parents, last = path
        node = wrong
        for key in parents:
            node = node[key]
        node[last] = bad
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(wrong, schema())


@pytest.mark.parametrize("overrides", [{}, {"namespace": {"create": True}}, PRODUCTION,
                                       {"clickhouse": {"url": "https://u:p@ch:8443"}}])
def test_every_rendered_object_is_valid_against_the_kubernetes_schemas(overrides):
    objects = Chart(CHART).render(overrides)
    assert {"ServiceAccount", "ConfigMap", "DaemonSet", "Deployment", "Service"} <= {o["kind"] for o in objects}
    for obj in objects:
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def _pod(obj: dict) -> dict:
    """A workload's pod spec as the two renderings should agree on it: the config map by its name without
    kustomize's hash, images without a pull policy the chart sets."""
    spec = copy.deepcopy(obj["spec"]["template"]["spec"])
    for volume in spec.get("volumes", []):
        if "configMap" in volume:
            volume["configMap"]["name"] = volume["configMap"]["name"].rsplit("-", 1)[0] \
                if volume["configMap"]["name"] != "jitterscope-config" else "jitterscope-config"
    for container in spec.get("initContainers", []) + spec["containers"]:
        container.pop("imagePullPolicy", None)
    return spec


def test_the_chart_makes_the_kustomize_bases_objects():
    chart = Chart(CHART).render({"namespace": {"create": True}})
    base = render("base")
    assert sorted((o["kind"], o["metadata"]["name"]) for o in chart) == sorted(
        (o["kind"], o["metadata"]["name"].rsplit("-", 1)[0] if o["kind"] == "ConfigMap" else o["metadata"]["name"])
        for o in base)
    for kind, name in (("DaemonSet", "jitterscope-collector"), ("Deployment", "jitterscope-streams")):
        ours, theirs = one(chart, kind, name), one(base, kind, name)
        assert _pod(ours) == _pod(theirs), kind
        assert ours["spec"]["selector"] == theirs["spec"]["selector"]
        assert ours["spec"]["template"]["metadata"]["labels"] == theirs["spec"]["template"]["metadata"]["labels"]
        annotations = dict(ours["spec"]["template"]["metadata"]["annotations"])
        assert len(annotations.pop("checksum/config")) == 64  # a config change rolls the pods
        assert annotations == theirs["spec"]["template"]["metadata"]["annotations"]
    assert one(chart, "Deployment")["spec"]["replicas"] == one(base, "Deployment")["spec"]["replicas"]
    for kind in ("Service", "ClusterRole", "ClusterRoleBinding"):
        ours, theirs = one(chart, kind), one(base, kind)
        assert {k: v for k, v in ours.items() if k != "metadata"} == {k: v for k, v in theirs.items() if k != "metadata"}
    assert one(chart, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    ours = tomllib.loads(one(chart, "ConfigMap")["data"]["jitterscope.toml"])
    theirs = tomllib.loads(one(base, "ConfigMap")["data"]["jitterscope.toml"])
    assert ours == theirs


def test_kafka_sasl_and_tls_are_wired_as_the_production_overlay_wires_them(tmp_path, monkeypatch):
    chart = Chart(CHART).render(PRODUCTION)
    production = render("overlays/production")
    for kind in ("DaemonSet", "Deployment"):
        for objects in (chart, production):
            spec = one(objects, kind)["spec"]["template"]["spec"]
            assert {"name": "kafka", "secret": {"secretName": "jitterscope-kafka", "defaultMode": 0o440}} \
                in spec["volumes"], kind
            mounts = spec["containers"][0]["volumeMounts"]
            assert {"name": "kafka", "mountPath": "/etc/jitterscope/kafka", "readOnly": True} in mounts, kind
    ours = tomllib.loads(one(chart, "ConfigMap")["data"]["jitterscope.toml"])
    theirs = tomllib.loads(one(production, "ConfigMap")["data"]["jitterscope.toml"])
    kafka = [k for k in theirs if k.startswith("kafka_") and k not in ("kafka_partitions", "kafka_replication_factor")]
    assert {k: ours.get(k) for k in kafka} == {k: theirs[k] for k in kafka}
    assert ours["clickhouse_cluster"] == "fleet" and one(chart, "Deployment")["spec"]["replicas"] == 4
    config = tmp_path / "jitterscope.toml"
    config.write_text(one(chart, "ConfigMap")["data"]["jitterscope.toml"])
    monkeypatch.setenv("JITTERSCOPE_CONFIG", str(config))  # undone after the test (load(config_file) would not)
    settings = load()  # every key is a setting jitterscope accepts
    assert (settings.kafka_security_protocol, settings.clickhouse_cluster) == ("SASL_SSL", "fleet")


def test_a_clickhouse_url_value_makes_its_secret_and_the_default_expects_one():
    assert not [o for o in Chart(CHART).render() if o["kind"] == "Secret"]
    (secret,) = [o for o in Chart(CHART).render({"clickhouse": {"url": "https://u:p@ch:8443"}}) if o["kind"] == "Secret"]
    assert secret["metadata"]["name"] == "jitterscope-clickhouse" and secret["stringData"] == {"url": "https://u:p@ch:8443"}
    env = one(Chart(CHART).render(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "JITTERSCOPE_CLICKHOUSE_URL",
            "valueFrom": {"secretKeyRef": {"name": "jitterscope-clickhouse", "key": "url"}}} in env


def test_the_renderer_refuses_what_it_does_not_know(tmp_path):
    """A template that needs more of Go's templates than tests/helm_render.py knows fails, never half-renders."""
    (tmp_path / "templates").mkdir()
    (tmp_path / "values.yaml").write_text("x: [1]\n")
    (tmp_path / "Chart.yaml").write_text("name: t\n")
    (tmp_path / "templates" / "a.yaml").write_text("{{ range .Values.x }}{{ . }}{{ end }}\n")
    with pytest.raises(NotImplementedError):
        Chart(tmp_path).render()
    (tmp_path / "templates" / "a.yaml").write_text("a: {{ upper .Values.x }}\n")
    with pytest.raises(NotImplementedError):
        Chart(tmp_path).render()


