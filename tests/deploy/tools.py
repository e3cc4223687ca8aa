"""What the tests of tests/deploy/ need around deploy/: kubectl, rendered
kustomizations, the vendored CRD schemas and a Containerfile reader.

- ``find_kubectl``: kubectl on PATH, else installed with apt-get (as root, where
  apt-get exists: Debian's ``kubectl`` package), else a ``ToolMissing`` that says how to
  get it. Never a skip: the manifests are tested or the run fails.
- ``render``: ``kubectl kustomize DIR``, parsed into objects.
- ``CrdSchemas``: the vendored CustomResourceDefinitions (deploy/kubernetes/crds/), one
  JSON Schema per served group, version and kind, made strict the way the API server's
  strict field validation is: an unknown field is an error, not silently pruned.
- ``containerfile_stages``: a Containerfile's stages and their instructions.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
CRDS = KUBERNETES / "crds"

Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ToolMissing(Exception):
    """A tool the deploy tests need is not there and could not be installed; the message says how to get it."""


def find_kubectl() -> str:
    """The path of a kubectl with kustomize built in, installing Debian's package if need be."""
    found = shutil.which("kubectl")
    if found:
        return found
    tried = []
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-qq", "kubectl"]
        for attempt in ([install], [["apt-get", "update", "-qq"], install]):
            for command in attempt:
                result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)
                if result.returncode != 0:
                    tried.append(f"`{' '.join(command)}` failed: {(result.stderr or result.stdout).strip()[-300:]}")
                    break
            else:
                tried.append(f"`{' '.join(attempt[-1])}` succeeded, yet no kubectl is on PATH ({os.environ.get('PATH', '')}).")
            found = shutil.which("kubectl")
            if found:
                return found
    else:
        tried.append("not root, or no apt-get: nothing was installed")
    raise ToolMissing(
        "kubectl is needed to render deploy/kubernetes (kubectl kustomize) and is not on PATH; "
        "install it (as root: `apt-get install -y kubectl`, Debian's kubectl package, not kubernetes-client) "
        "and run the tests again. " + " ".join(tried)
    )


def kustomization_dirs() -> list[Path]:
    """Every directory under deploy/kubernetes with a kustomization.yaml, relative to it."""
    return sorted(path.parent.relative_to(KUBERNETES) for path in KUBERNETES.rglob("kustomization.yaml"))


@dataclass
class Rendered:
    """One kustomization's output: its objects, or why ``kubectl kustomize`` failed."""

    name: str
    objects: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [item for item in self.objects if item.get("kind") == kind]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        matches = [item for item in self.of_kind(kind) if item["metadata"]["name"] == name]
        assert len(matches) == 1, f"{self.name}: expected one {kind} {name!r}, found {len(matches)}"
        return matches[0]


def render(kubectl: str, directory: Path) -> Rendered:
    name = str(directory)
    result = subprocess.run([kubectl, "kustomize", str(KUBERNETES / directory)], capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        return Rendered(name, error=(result.stderr or result.stdout).strip())
    objects = [item for item in yaml.load_all(result.stdout, Loader=Loader) if item is not None]
    return Rendered(name, objects)


# --- workloads ---------------------------------------------------------------------------

POD_TEMPLATE_PATHS = {
    "Deployment": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "Job": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "Pod": ("spec",),
}


def pod_spec(item: dict[str, Any]) -> dict[str, Any] | None:
    path = POD_TEMPLATE_PATHS.get(item.get("kind", ""))
    if path is None:
        return None
    spec: Any = item
    for key in path:
        spec = spec[key]
    return spec


def pod_labels(item: dict[str, Any]) -> dict[str, str]:
    template = item["spec"]["jobTemplate"]["spec"]["template"] if item["kind"] == "CronJob" else item["spec"].get("template", item)
    return template.get("metadata", {}).get("labels", {})


def all_containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [*spec.get("initContainers", []), *spec.get("containers", []), *spec.get("ephemeralContainers", [])]


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels and matchExpressions) selects these labels."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


# --- custom resources ------------------------------------------------------------------------


def strict(schema: Any) -> Any:
    """A CRD's structural schema with every object closed: where it lists properties and
    neither allows others nor preserves unknown fields, ``additionalProperties: false``
    (the API server's ``fieldValidation=Strict`` refuses such a field too)."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: strict(value) if key not in ("enum", "default", "example", "x-kubernetes-validations") else value for key, value in schema.items()}
    if "properties" in schema and "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        closed["additionalProperties"] = False
    return closed


@dataclass
class CrdSchemas:
    """The vendored CRDs' schemas, keyed by (apiVersion, kind)."""

    schemas: dict[tuple[str, str], dict[str, Any]]
    sources: dict[tuple[str, str], str]

    @classmethod
    def load(cls, directory: Path = CRDS) -> CrdSchemas:
        schemas: dict[tuple[str, str], dict[str, Any]] = {}
        sources: dict[tuple[str, str], str] = {}
        for path in sorted(directory.glob("*.yaml")):
            for crd in yaml.load_all(path.read_text(), Loader=Loader):
                if not crd or crd.get("kind") != "CustomResourceDefinition":
                    continue
                group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
                for version in crd["spec"]["versions"]:
                    if not version.get("served", False):
                        continue
                    key = (f"{group}/{version['name']}", kind)
                    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
                    schemas[key] = strict(schema)
                    sources[key] = path.name
        return cls(schemas, sources)


# --- Containerfile ---------------------------------------------------------------------------


@dataclass
class Stage:
    """One FROM ... stage: its base (ARG defaults resolved), name and instructions."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def arguments(self, instruction: str) -> list[str]:
        return [argument for name, argument in self.instructions if name == instruction]


def containerfile_stages(text: str) -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults and the stages of a Containerfile (continuations joined, comments dropped)."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1].strip() + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    if pending:
        lines.append(pending.strip())
    arguments: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        instruction, _, rest = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "ARG" and not stages:
            name, _, default = rest.partition("=")
            arguments[name.strip()] = default.strip().strip('"')
        elif instruction == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda match: arguments.get(match.group(1), match.group(0)), words[0])
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif stages:
            stages[-1].instructions.append((instruction, rest.strip()))
    return arguments, stages


# --- lock files ------------------------------------------------------------------------------


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Locked:
    name: str
    version: str
    marker: str | None
    hashes: list[str]


def read_lock(path: Path) -> dict[str, Locked]:
    """A hashed requirements file: each requirement, its pin, marker and hashes; a
    requirement without ``==`` is an error."""
    entries: dict[str, Locked] = {}
    logical = ""
    for raw in [*path.read_text().splitlines(), ""]:
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        if logical.strip():
            requirement, *options = re.split(r"\s+--", " " + logical.strip())
            requirement = " ".join(requirement.split())
            spec, _, marker = requirement.partition(";")
            match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)", spec.strip())
            if not match:
                raise ValueError(f"{path.name}: not an exact pin: {requirement!r}")
            hashes = [option.removeprefix("hash=sha256:") for option in options if option.startswith("hash=")]
            name = normalise(match.group(1))
            entries[name] = Locked(name, match.group(3), marker.strip() or None, hashes)
            if any(not option.startswith("hash=sha256:") for option in options):
                raise ValueError(f"{path.name}: {name}: only --hash=sha256: options are expected, got {options}")
        logical = ""
    return entries


# --- what the deploy test modules share -------------------------------------------------------

# The renders that run the gateway, and the namespace each puts it in.
GATEWAY_RENDERS = {
    "base": "portcullis",
    "overlays/dev": "portcullis-dev",
    "overlays/prod": "portcullis",
    "overlays/node-local": "portcullis",
    "examples/secrets-store-csi": "portcullis",
}
CONFIG_PATH = "/etc/portcullis/config.yaml"
SERVE_ARGS = ["serve", "--config", CONFIG_PATH]
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job", "CronJob", "Pod"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
CONFIG_SCHEMA = json.loads((ROOT / "schemas" / "config.schema.json").read_text())


def workloads(result: Rendered) -> list[dict[str, Any]]:
    return [item for item in result.objects if item["kind"] in WORKLOAD_KINDS]


def rendered(renders: dict[str, Rendered], name: str) -> Rendered:
    result = renders[name]
    assert result.error is None, f"kubectl kustomize deploy/kubernetes/{name} failed:\n{result.error}"
    return result
