"""deploy/ as operators take it, checked offline: the image's Containerfile, its lock
files and SBOM, and the Kubernetes manifests (deploy/kubernetes: the kustomize base, its
overlays and the examples).

1. Every kustomization renders with ``kubectl kustomize`` (once per session).
2. Every rendered object validates against Kubernetes' own schemas for each of
   ``K8S_VERSIONS`` (kubernetes-validate, strict: an unknown field fails), and every
   custom resource against the vendored CRD of its kind (deploy/kubernetes/crds).
3. Every workload passes the restricted Pod Security profile and more: non-root with a
   numeric UID, no privilege escalation, a read-only root file system, every
   capability dropped, RuntimeDefault seccomp, requests and limits on every container,
   no host ports or host namespaces, pinned images; Services are never LoadBalancer or
   NodePort; no manifest holds a secret value.
The wiring (configuration against pods, network policies, each overlay's promises) is
``test_wiring.py``'s; the image, its lock files and SBOM ``test_image.py``'s.

kubectl comes from PATH or Debian's package (tests/deploy/tools.py); kubernetes-validate
from the dev extra.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.tools import (
    CRDS,
    KUBERNETES,
    ROOT,
    CrdSchemas,
    Rendered,
    all_containers,
    kustomization_dirs,
    pod_spec,
    rendered,
    workloads,
)

# The oldest and the newest Kubernetes minor release the manifests are validated for.
K8S_VERSIONS = ("1.32", "1.37")
KUBERNETES_VALIDATE = "kubernetes-validate==1.37.0"
KUSTOMIZATIONS = [str(path) for path in kustomization_dirs()]
REQUIRED = {"base", "overlays/dev", "overlays/prod", "overlays/node-local", "examples/inference-pool"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PriorityClass", "StorageClass", "GatewayClass"}

# --- rendering -------------------------------------------------------------------------------


def test_every_required_kustomization_exists() -> None:
    assert set(KUSTOMIZATIONS) >= REQUIRED, f"missing kustomizations: {sorted(REQUIRED - set(KUSTOMIZATIONS))}"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_kustomization_renders(renders: dict[str, Rendered], name: str) -> None:
    result = rendered(renders, name)
    assert result.objects, f"{name} renders no object"
    problems = []
    for item in result.objects:
        where = f"{item.get('kind')}/{item.get('metadata', {}).get('name')}"
        if not item.get("apiVersion") or not item.get("kind") or not item.get("metadata", {}).get("name"):
            problems.append(f"{where}: no apiVersion, kind or name")
        if item.get("kind") not in CLUSTER_SCOPED and not item["metadata"].get("namespace"):
            problems.append(f"{where}: namespaced, but no namespace is set (it would land in the client's current one)")
    identities = [(item["apiVersion"].split("/")[0], item["kind"], item["metadata"].get("namespace"), item["metadata"]["name"]) for item in result.objects]
    assert len(identities) == len(set(identities)), f"{name}: an object appears twice"
    assert not problems, "\n".join(problems)


# --- schemas ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kubernetes_validate() -> Any:
    try:
        import kubernetes_validate
        import kubernetes_validate.utils
    except ImportError:
        pytest.fail(f"kubernetes-validate is needed to validate the manifests offline: pip install '{KUBERNETES_VALIDATE}' (the dev extra)", pytrace=False)
    shipped = {version.rsplit(".", 1)[0] for version in kubernetes_validate.utils.all_versions()}
    missing = [version for version in K8S_VERSIONS if version not in shipped]
    assert not missing, f"kubernetes-validate {kubernetes_validate.__version__} ships no schemas for Kubernetes {missing}; it has {sorted(shipped)}"
    return kubernetes_validate


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network: a connection attempt fails the test (the schemas must come from disk)."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"the schema validation tried to reach the network: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_objects_validate_against_kubernetes_schemas(
    renders: dict[str, Rendered], crds: CrdSchemas, kubernetes_validate: Any, offline: None, name: str
) -> None:
    problems = []
    checked = 0
    for item in rendered(renders, name).objects:
        if (item["apiVersion"], item["kind"]) in crds.schemas:
            continue  # a custom resource: the next test
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(item, version, strict=True)
                checked += 1
            except kubernetes_validate.ValidationError as error:
                location = "/".join(str(part) for part in error.path)
                problems.append(f"{item['kind']}/{item['metadata']['name']} (Kubernetes {version}) at {location or '/'}: {error.message}")
            except kubernetes_validate.SchemaNotFoundError:
                problems.append(
                    f"{item['kind']}/{item['metadata']['name']}: {item['apiVersion']} is neither Kubernetes' own (for {version}) nor a vendored CRD"
                )
    assert not problems, "\n".join(problems)
    assert checked, f"{name}: no object was validated against Kubernetes' schemas"


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_custom_resources_validate_against_vendored_crds(renders: dict[str, Rendered], crds: CrdSchemas, name: str) -> None:
    problems = []
    for item in rendered(renders, name).objects:
        schema = crds.schemas.get((item["apiVersion"], item["kind"]))
        if schema is None:
            continue
        body = {key: value for key, value in item.items() if key != "status"}
        validator = jsonschema.Draft202012Validator(schema)
        for error in sorted(validator.iter_errors(body), key=lambda error: list(error.path)):
            location = "/".join(str(part) for part in error.path)
            problems.append(
                f"{item['kind']}/{item['metadata']['name']} at {location or '/'} ({crds.sources[(item['apiVersion'], item['kind'])]}): {error.message}"
            )
    assert not problems, "\n".join(problems)


def test_the_crd_schemas_refuse_what_the_api_server_would(crds: CrdSchemas) -> None:
    """The strict schemas catch a misspelt field and a wrong type, as strict field validation does."""
    schema = crds.schemas[("inference.networking.k8s.io/v1", "InferencePool")]
    pool = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "p"},
        "spec": {"selector": {"matchLabels": {"app": "p"}}, "targetPorts": [{"number": 8000}]},
    }
    jsonschema.validate(pool, schema)
    misspelt = json.loads(json.dumps(pool))
    misspelt["spec"]["targetPort"] = misspelt["spec"].pop("targetPorts")
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(misspelt))
    wrong = json.loads(json.dumps(pool))
    wrong["spec"]["targetPorts"] = [{"number": "8000"}]
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(wrong))


def test_vendored_crds_are_the_upstream_files_and_attributed(crds: CrdSchemas) -> None:
    sums = dict(reversed(line.split()) for line in (CRDS / "SHA256SUMS").read_text().splitlines() if line.strip())
    files = sorted(path.name for path in CRDS.glob("*.yaml"))
    assert sorted(sums) == files, "SHA256SUMS must list exactly the vendored CRD files"
    for file in files:
        assert hashlib.sha256((CRDS / file).read_bytes()).hexdigest() == sums[file], f"{file} differs from the upstream file SHA256SUMS names"
    readme = (CRDS / "README.md").read_text()
    for file in files:
        assert file in readme, f"crds/README.md does not say where {file} comes from"
    assert "Apache License" in (CRDS / "LICENSE-Apache-2.0.txt").read_text()
    assert "Apache" in readme
    for key in [
        ("inference.networking.k8s.io/v1", "InferencePool"),
        ("gateway.networking.k8s.io/v1", "HTTPRoute"),
        ("gateway.networking.k8s.io/v1", "Gateway"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ]:
        assert key in crds.schemas, f"no vendored schema for {key}"


# --- workloads and secrets ---------------------------------------------------------------------

IMAGE = re.compile(r"^(?P<name>[a-z0-9][a-z0-9._/:-]*?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?(?:@sha256:(?P<digest>[0-9a-f]{64}))?$")
SECRET_NAME = re.compile(r"(KEY|SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|AUTH|_URL$|_URI$|DSN|CONNECTION)", re.IGNORECASE)
CREDENTIAL_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s/:@]+:[^\s/@]+@", re.IGNORECASE)
KEY_MATERIAL = re.compile(
    "|".join(
        [
            r"sk-ant-[A-Za-z0-9_-]{8,}",  # Anthropic
            r"\bsk-[A-Za-z0-9]{20,}",  # OpenAI
            r"\b(AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
            r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
            r"\bgh[pousr]_[A-Za-z0-9]{20,}",  # GitHub
            r"\bxox[abprs]-[A-Za-z0-9-]{10,}",  # Slack
        ]
    )
)
RANDOM_LOOKING = re.compile(r"^(?=.*\d)(?=.*[A-Za-z])[A-Za-z0-9+/_-]{32,}={0,2}$")


def image_problem(image: str) -> str | None:
    match = IMAGE.match(image)
    if not match:
        return f"image {image!r} is not a valid reference"
    if not match.group("tag") and not match.group("digest"):
        return f"image {image!r} has neither a tag nor a digest (it means :latest)"
    if match.group("tag") == "latest":
        return f"image {image!r} uses :latest"
    return None


def bound_service_accounts(result: Rendered) -> set[tuple[str, str]]:
    """(namespace, name) of every ServiceAccount a RoleBinding or ClusterRoleBinding of the render grants something."""
    bound = set()
    for binding in [*result.of_kind("RoleBinding"), *result.of_kind("ClusterRoleBinding")]:
        for subject in binding.get("subjects", []):
            if subject.get("kind") == "ServiceAccount":
                bound.add((subject.get("namespace", binding["metadata"].get("namespace")), subject["name"]))
    return bound


def workload_problems(item: dict[str, Any], bound: set[tuple[str, str]]) -> list[str]:
    spec = pod_spec(item)
    assert spec is not None
    where = f"{item['kind']}/{item['metadata']['name']}"
    problems = []
    pod = spec.get("securityContext", {})
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            problems.append(f"{where}: {flag}")
    problems += [f"{where}: hostPath volume {volume['name']}" for volume in spec.get("volumes", []) if "hostPath" in volume]
    account = (item["metadata"].get("namespace"), spec.get("serviceAccountName", "default"))
    if spec.get("automountServiceAccountToken") is not False and account not in bound:
        problems.append(f"{where}: mounts an API token (automountServiceAccountToken is not false) but its ServiceAccount is granted nothing")
    if pod.get("runAsUser") == 0 or pod.get("runAsGroup") == 0:
        problems.append(f"{where}: the pod runs as root")
    for container in all_containers(spec):
        at = f"{where} container {container['name']}"
        own = container.get("securityContext", {})

        def effective(key: str, own: dict[str, Any] = own) -> Any:
            return own.get(key, pod.get(key))

        if effective("runAsNonRoot") is not True:
            problems.append(f"{at}: runAsNonRoot is not true")
        user = effective("runAsUser")
        if isinstance(user, bool) or not isinstance(user, int) or user <= 0:
            problems.append(f"{at}: runAsUser is {user!r}, not a numeric non-root UID")
        if own.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{at}: allowPrivilegeEscalation is not false")
        if own.get("privileged"):
            problems.append(f"{at}: privileged")
        if own.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{at}: readOnlyRootFilesystem is not true")
        capabilities = own.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{at}: capabilities do not drop ALL")
        if capabilities.get("add"):
            problems.append(f"{at}: adds capabilities {capabilities['add']}")
        if (effective("seccompProfile") or {}).get("type") != "RuntimeDefault":
            problems.append(f"{at}: seccompProfile is not RuntimeDefault")
        resources = container.get("resources", {})
        for kind in ("requests", "limits"):
            missing = [resource for resource in ("cpu", "memory") if resource not in resources.get(kind, {})]
            if missing:
                problems.append(f"{at}: no {kind} for {', '.join(missing)}")
        problems += [f"{at}: hostPort {port['hostPort']}" for port in container.get("ports", []) if "hostPort" in port]
        image = image_problem(container.get("image", ""))
        if image:
            problems.append(f"{at}: {image}")
    return problems


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_workloads_are_restricted_and_pinned(renders: dict[str, Rendered], name: str) -> None:
    result = rendered(renders, name)
    assert workloads(result), f"{name} renders no workload"
    bound = bound_service_accounts(result)
    problems = [problem for item in workloads(result) for problem in workload_problems(item, bound)]
    for namespace in result.of_kind("Namespace"):
        labels = namespace["metadata"].get("labels", {})
        if labels.get("pod-security.kubernetes.io/enforce") != "restricted":
            problems.append(f"Namespace/{namespace['metadata']['name']}: Pod Security admission does not enforce restricted")
    for service in result.of_kind("Service"):
        spec = service["spec"]
        if spec.get("type", "ClusterIP") != "ClusterIP":
            problems.append(f"Service/{service['metadata']['name']}: type {spec['type']} (only private ClusterIP Services)")
        if spec.get("externalIPs") or any("nodePort" in port for port in spec.get("ports", [])):
            problems.append(f"Service/{service['metadata']['name']}: exposed outside the cluster")
    assert not problems, "\n".join(problems)


def strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Every string in an object, with where it is."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from strings(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from strings(item, f"{path}[{index}]")
    elif isinstance(value, str):
        yield path, value


def secret_problems(item: dict[str, Any]) -> list[str]:
    where = f"{item['kind']}/{item['metadata']['name']}"
    problems = []
    if item["kind"] == "Secret" and (item.get("data") or item.get("stringData")):
        problems.append(f"{where}: a Secret with values in the manifests")
    for path, text in strings(item):
        if CREDENTIAL_URL.search(text):
            problems.append(f"{where}{path}: a URL with credentials in it")
        if KEY_MATERIAL.search(text):
            problems.append(f"{where}{path}: what looks like a key or token")
    spec = pod_spec(item)
    for container in all_containers(spec) if spec else []:
        for variable in container.get("env", []):
            if "value" not in variable:
                continue
            if SECRET_NAME.search(variable["name"]):
                problems.append(f"{where} container {container['name']}: {variable['name']} is a literal value; take it from a Secret (valueFrom.secretKeyRef)")
            elif RANDOM_LOOKING.match(str(variable["value"])):
                problems.append(f"{where} container {container['name']}: {variable['name']} holds what looks like a secret")
    return problems


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_no_secret_values_in_any_manifest(renders: dict[str, Rendered], name: str) -> None:
    problems = [problem for item in rendered(renders, name).objects for problem in secret_problems(item)]
    assert not problems, "\n".join(problems)


def test_no_kustomization_generates_secrets() -> None:
    """A secretGenerator would put a value in the repository (literals) or build one from a file the repository should not hold."""
    offenders = [str(path.relative_to(ROOT)) for path in KUBERNETES.rglob("kustomization.yaml") if "secretGenerator" in yaml.safe_load(path.read_text())]
    assert not offenders, f"secretGenerator in {offenders}: create the Secrets outside the manifests (docs/deploy.md#secrets)"


@pytest.mark.parametrize(
    "mutation, expected",
    [
        (lambda pod, container: container["securityContext"].update(runAsUser=0), "not a numeric non-root UID"),
        (lambda pod, container: container["securityContext"].update(allowPrivilegeEscalation=True), "allowPrivilegeEscalation"),
        (lambda pod, container: container["securityContext"].update(readOnlyRootFilesystem=False), "readOnlyRootFilesystem"),
        (lambda pod, container: container["securityContext"]["capabilities"].update(drop=["NET_RAW"]), "drop ALL"),
        (lambda pod, container: container["securityContext"].update(seccompProfile={"type": "Unconfined"}), "seccompProfile"),
        (lambda pod, container: container["resources"].pop("limits"), "no limits"),
        (lambda pod, container: container["ports"].append({"containerPort": 80, "hostPort": 80}), "hostPort"),
        (lambda pod, container: pod.update(hostNetwork=True), "hostNetwork"),
        (lambda pod, container: container.update(image="registry.example.com/portcullis:latest"), ":latest"),
        (lambda pod, container: container.update(image="registry.example.com/portcullis"), "neither a tag nor a digest"),
        (lambda pod, container: pod.pop("automountServiceAccountToken"), "mounts an API token"),
    ],
)
def test_the_workload_rules_catch_each_violation(renders: dict[str, Rendered], mutation: Any, expected: str) -> None:
    deployment = json.loads(json.dumps(rendered(renders, "base").get("Deployment", "portcullis")))
    assert workload_problems(deployment, set()) == []
    spec = pod_spec(deployment)
    assert spec is not None
    mutation(spec, spec["containers"][0])
    assert any(expected in problem for problem in workload_problems(deployment, set()))


@pytest.mark.parametrize(
    "variable",
    [
        {"name": "POSTGRES_PASSWORD", "value": "hunter2"},
        {"name": "DATABASE_URL", "value": "postgresql://portcullis@db/portcullis"},
        {"name": "UPSTREAM", "value": "https://user:pass@example.com/v1"},
        {"name": "EXTRA", "value": "sk-ant-api03-abcdefghijklmnop"},
        {"name": "SEED", "value": "Zm9vYmFyYmF6cXV4cXV1eHF1dXhxdXV4cXV1eA12"},
    ],
)
def test_the_secret_rules_catch_literal_values(renders: dict[str, Rendered], variable: dict[str, str]) -> None:
    deployment = json.loads(json.dumps(rendered(renders, "base").get("Deployment", "portcullis")))
    assert secret_problems(deployment) == []
    spec = pod_spec(deployment)
    assert spec is not None
    spec["containers"][0]["env"].append(variable)
    assert secret_problems(deployment)
