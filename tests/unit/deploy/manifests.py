# SPDX-License-Identifier: Apache-2.0
"""Helpers the deploy tests share: render a kustomization offline with
`kubectl kustomize` (alone, or with components added the way a user adds
them to an overlay), and pick objects and settings out of the result.
test_deploy.py checks what every variant must be; test_overlays.py what
the trial, the production overlay and each component add."""

from __future__ import annotations

import base64
import os
import subprocess
import tempfile
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy/kubernetes"

#: Every way the manifests are meant to be applied: the base, each overlay,
#: and each component on the overlay a user would add it to.
VARIANTS = ("base", "overlays/trial", "overlays/production",
            "overlays/trial+components/kernel-headers", "overlays/production+components/kernel-headers",
            "overlays/trial+components/podmonitor")


def components() -> list[str]:
    return sorted(p.parent.relative_to(K8S).as_posix() for p in K8S.glob("components/*/kustomization.yaml"))


def overlays() -> list[str]:
    return sorted(p.parent.relative_to(K8S).as_posix() for p in K8S.glob("overlays/*/kustomization.yaml"))


def render(variant: str) -> list[dict]:
    """`kubectl kustomize` of "overlays/x" or "overlays/x+components/y+...":
    the components through a kustomization of their own, as a user writes it
    (kustomize takes only relative paths)."""
    first, *added = variant.split("+")
    if not added:
        return _kustomize(K8S / first)
    with tempfile.TemporaryDirectory() as tmp:
        rel = lambda p: os.path.relpath(K8S / p, tmp)  # noqa: E731
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump(
            {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
             "resources": [rel(first)], "components": [rel(c) for c in added]}))
        return _kustomize(Path(tmp))


def _kustomize(path: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, (kind, name, [o["kind"] for o in objects])
    return found[0]


def config_of(objects: list[dict]) -> dict:
    return tomllib.loads(one(objects, "ConfigMap")["data"]["jitterscope.toml"])


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def containers(obj: dict) -> list[dict]:
    pod = pod_spec(obj)
    return pod.get("initContainers", []) + pod["containers"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def secret_data(secret: dict) -> dict[str, str]:
    """A Secret's values as text, from stringData or base64 data."""
    values = {k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()}
    return values | secret.get("stringData", {})
