# SPDX-License-Identifier: Apache-2.0
"""The fleet deployment, checked offline (no container engine or cluster runs
here): the kustomize base, every overlay and every component (manifests.py's
VARIANTS) render with kubectl, every rendered object is valid against the
Kubernetes schemas, the pods are set up
the way the collector and the worker need, the ConfigMaps hold settings
jitterscope accepts, the image definition passes hadolint, and the systemd
units pass systemd-analyze.

kubectl, hadolint and kubernetes-validate come from `make test-deps` and the
test extra (pyproject.toml)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from jitterscope.common.settings import Settings

from .manifests import ROOT, VARIANTS, components, config_of, one, overlays, render

BIN = Path(sys.executable).parent
#: oldest Kubernetes still in support when this was written, and the newest the validator knows
VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())

#: The PodMonitor's fields we use, from the Prometheus Operator's CRD
#: (monitoring.coreos.com/v1); kubernetes-validate knows only built-in kinds.
PODMONITOR_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
                 "properties": {
                     "selector": {"type": "object", "additionalProperties": False, "properties": {
                         "matchLabels": {"type": "object"}, "matchExpressions": {"type": "array"}}},
                     "namespaceSelector": {"type": "object"},
                     "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "required": ["port"],
                         "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                        "interval": {"type": "string", "pattern": r"^\d+[smh]$"}}}}}},
    },
}


@pytest.fixture(scope="module", params=VARIANTS)
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(request.param)


def test_every_overlay_and_component_is_a_variant_tested():
    """A new overlay or component is rendered and validated here without a
    line to add, or this says which is missing."""
    named = {part for variant in VARIANTS for part in variant.split("+")}
    assert set(overlays()) | set(components()) <= named, sorted(set(overlays()) | set(components()) - named)


def test_every_object_is_valid_against_the_kubernetes_schemas(rendered):
    variant, objects = rendered
    kinds = {o["kind"] for o in objects}
    assert {"Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "Deployment", "Service"} <= kinds
    for obj in objects:
        assert obj["metadata"].get("namespace", "jitterscope") == "jitterscope" or obj["kind"] == "Namespace"
        if obj["kind"] == "PodMonitor":
            jsonschema.validate(obj, PODMONITOR_SCHEMA)
            continue
        for version in VERSIONS:
            # strict: an unknown or misspelt field is an error, not ignored
            kubernetes_validate.validate(obj, version, strict=True)
    assert ("PodMonitor" in kinds) == ("podmonitor" in variant or variant.startswith("overlays/production"))


@pytest.mark.parametrize("variant", ["base", *overlays()])
def test_the_cli_validator_agrees(variant, tmp_path):
    """The same check as a person runs it (docs/kubernetes.md gives the command)."""
    objects = render(variant)
    rendered_file = tmp_path / "rendered.yaml"
    rendered_file.write_text(yaml.safe_dump_all([o for o in objects if o["kind"] != "PodMonitor"]))
    out = subprocess.run([str(BIN / "kubernetes-validate"), "--strict", "-k", VERSIONS[0], str(rendered_file)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" passed for resource ") == len([o for o in objects if o["kind"] != "PodMonitor"])


def test_the_default_kustomization_is_the_trial():
    """`kubectl apply -k deploy/kubernetes` by reflex gets the variant that
    works on a fresh cluster, not the base that needs a Kafka and a Secret."""
    assert render(".") == render("overlays/trial")


def test_collector_daemonset_is_set_up_for_bpf_on_gpu_nodes(rendered):
    variant, objects = rendered
    ds = one(objects, "DaemonSet", "jitterscope-collector")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert container["securityContext"]["privileged"] is True
    # the trial watches every node: a trial cluster may have no labelled GPU node
    gpu_nodes = None if variant.startswith("overlays/trial") else {"nvidia.com/gpu.present": "true"}
    assert pod.get("nodeSelector") == gpu_nodes
    assert "memory" in container["resources"]["limits"] and "cpu" not in container["resources"]["limits"]
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == "9464"

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in container["volumeMounts"]}
    host = {path: v["hostPath"]["path"] for path, v in mounts.items() if "hostPath" in v}
    headers = {"/lib/modules": "/lib/modules", "/usr/src": "/usr/src"}
    if "kernel-headers" in variant:  # installed by its init container instead (test_overlays.py)
        headers = {}
    assert host == {"/host": "/", "/sys/kernel/tracing": "/sys/kernel/tracing",
                    "/sys/kernel/debug": "/sys/kernel/debug", "/var/lib/jitterscope": "/var/lib/jitterscope",
                    **headers}
    assert mounts["/etc/jitterscope"]["configMap"]["name"] == one(objects, "ConfigMap")["metadata"]["name"]

    env = {e["name"]: e for e in container["env"]}
    assert env["JITTERSCOPE_HOST_ROOT"]["value"] == "/host"
    assert env["JITTERSCOPE_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["JITTERSCOPE_OTLP_BIND"]["value"] == "$(NODE_IP)"
    assert env["JITTERSCOPE_KUBELET_URL"]["value"] == "https://$(NODE_IP):10250"
    # the kubelet authorizes GET /pods as nodes/proxy: the collector's account may do that and nothing else
    role = one(objects, "ClusterRole", "jitterscope-collector")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]
    binding = one(objects, "ClusterRoleBinding", "jitterscope-collector")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": pod["serviceAccountName"],
                                    "namespace": "jitterscope"}]
    config = config_of(objects)
    assert config["data_dir"] == "/var/lib/jitterscope" and config["collector_metrics_port"] == 9464


def test_streams_deployment_creates_topics_first_and_runs_unprivileged(rendered):
    _variant, objects = rendered
    deployment = one(objects, "Deployment", "jitterscope-streams")
    pod = deployment["spec"]["template"]["spec"]
    assert [c["args"] for c in pod["initContainers"]] == [["topics", "create"]]
    assert [c["args"] for c in pod["containers"]] == [["streams"]]
    assert pod["securityContext"]["runAsNonRoot"] is True
    config = config_of(objects)
    # more workers than partitions would sit idle
    assert deployment["spec"]["replicas"] <= config["kafka_partitions"]
    service = one(objects, "Service", "jitterscope-streams")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert config["streams_web_port"] == service["spec"]["ports"][0]["port"]


def test_configmap_and_env_are_settings_jitterscope_accepts(rendered, tmp_path):
    """The TOML loads through the real settings model (unknown keys are an
    error there), and every JITTERSCOPE_* variable names a setting."""
    _variant, objects = rendered
    config = config_of(objects)
    config_file = tmp_path / "jitterscope.toml"
    config_file.write_text(one(objects, "ConfigMap")["data"]["jitterscope.toml"])
    for name in ("kafka-password", "kafka-ca"):  # the overlay's Secret files
        (tmp_path / name).touch()
    env = {k: v for k, v in os.environ.items() if not k.startswith("JITTERSCOPE_")}
    env["JITTERSCOPE_CONFIG"] = str(config_file)
    out = subprocess.run([sys.executable, "-c", "from jitterscope.common.settings import load; "
                          "s = load(); print(s.kafka_partitions, s.kafka_security_protocol)"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == str(config["kafka_partitions"])
    variables = {e["name"] for o in objects if o["kind"] in ("DaemonSet", "Deployment")
                 for c in o["spec"]["template"]["spec"].get("initContainers", []) + o["spec"]["template"]["spec"]["containers"]
                 for e in c.get("env", []) if e["name"].startswith("JITTERSCOPE_")}
    fields = {f"JITTERSCOPE_{name.upper()}" for name in Settings.model_fields} | {"JITTERSCOPE_CONFIG"}
    assert variables - fields == set()


def test_overlay_wires_kafka_security_from_a_secret():
    objects = render("overlays/production")
    config = config_of(objects)
    assert config["kafka_security_protocol"] == "SASL_SSL" and "kafka_sasl_password" not in config
    secret_dir = str(Path(config["kafka_sasl_password_file"]).parent)
    for kind, name in (("DaemonSet", "jitterscope-collector"), ("Deployment", "jitterscope-streams")):
        pod = one(objects, kind, name)["spec"]["template"]["spec"]
        secret_volumes = {v["name"] for v in pod["volumes"] if v.get("secret", {}).get("secretName") == "jitterscope-kafka"}
        for container in pod.get("initContainers", []) + pod["containers"]:
            assert any(m["mountPath"] == secret_dir and m["name"] in secret_volumes
                       for m in container["volumeMounts"]), (kind, container["name"])
    images = {c["image"] for o in objects if o["kind"] in ("DaemonSet", "Deployment")
              for c in o["spec"]["template"]["spec"]["containers"]}
    assert all(i.startswith("registry.example.internal/") for i in images)


def test_image_definition_passes_hadolint():
    containerfile = ROOT / "deploy/Containerfile"
    out = subprocess.run([str(BIN / "hadolint"), "--failure-threshold", "info", str(containerfile)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    text = containerfile.read_text()
    # BCC from Debian, never PyPI's unrelated `bcc`; each role only its extra, at the tested versions
    assert "python3-bpfcc" in text and "--system-site-packages" in text
    assert '"jitterscope[collector] @' in text and '"jitterscope[streams] @' in text
    assert text.count("-c /wheels/constraints.txt") == 2
    stages = [line.split()[-1] for line in text.splitlines() if line.startswith("FROM ")]
    assert stages == ["build", "collector", "streams"]


def test_systemd_units_verify(tmp_path):
    units = sorted((ROOT / "deploy/systemd").glob("*.service"))
    assert units
    # ExecStart must exist for verify: point the units at this venv's entry point
    for unit in units:
        text = unit.read_text().replace("/opt/jitterscope/.venv/bin/jitterscope", str(BIN / "jitterscope"))
        (tmp_path / unit.name).write_text(text)
    out = subprocess.run([shutil.which("systemd-analyze") or "systemd-analyze", "verify",
                          *(str(tmp_path / u.name) for u in units)], capture_output=True, text=True, timeout=120)
    problems = [line for line in (out.stdout + out.stderr).splitlines() if any(u.name in line for u in units)]
    assert out.returncode == 0 and problems == [], out.stdout + out.stderr
    # hardened: systemd's own exposure score (0 best, 10 worst); the collector
    # must keep BPF capabilities, the worker needs none
    for name, worst in (("jitterscope-collector.service", 5.5), ("jitterscope-streams.service", 3.5)):
        out = subprocess.run(["systemd-analyze", "security", "--offline=true", str(tmp_path / name)],
                             capture_output=True, text=True, timeout=120)
        score = re.search(rf"Overall exposure level for {re.escape(name)}: ([\d.]+)", out.stdout)
        assert score and float(score[1]) <= worst, out.stdout[-3000:] + out.stderr
        unit = (tmp_path / name).read_text()
        assert "Restart=on-failure" in unit and "StateDirectory=" in unit
