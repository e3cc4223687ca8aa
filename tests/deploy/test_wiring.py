"""deploy/'s wiring, from the rendered manifests: the configuration in the ConfigMap
against the pods that run it (ports, probes, mounts, secrets), the migration Job, the
Services and metrics scraping, the network policies, and what each overlay promises."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from tests.deploy.tools import (
    CONFIG_PATH,
    CONFIG_SCHEMA,
    GATEWAY_RENDERS,
    KUBERNETES,
    SERVE_ARGS,
    Rendered,
    all_containers,
    pod_labels,
    pod_spec,
    rendered,
    selects,
    workloads,
)

# --- the gateway's wiring ------------------------------------------------------------------------


def cpu(quantity: str | int) -> float:
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def gateway(result: Rendered) -> dict[str, Any]:
    found = [item for item in workloads(result) if pod_labels(item).get("app.kubernetes.io/component") == "gateway"]
    assert len(found) == 1, f"{result.name}: expected one gateway workload, found {[item['kind'] for item in found]}"
    return found[0]


def volume_of(spec: dict[str, Any], mount: dict[str, Any]) -> dict[str, Any]:
    return next(volume for volume in spec["volumes"] if volume["name"] == mount["name"])


def mount_for(spec: dict[str, Any], container: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The mount (and its volume) a file path lies on: the longest mount path that is a parent of it, or the file itself."""
    target = PurePosixPath(path)
    candidates = [
        mount
        for mount in container.get("volumeMounts", [])
        if target == PurePosixPath(mount["mountPath"]) or PurePosixPath(mount["mountPath"]) in target.parents
    ]
    assert candidates, f"{path} is on no volume of {container['name']} (the root file system is read-only)"
    mount = max(candidates, key=lambda mount: len(mount["mountPath"]))
    return mount, volume_of(spec, mount)


def env_sources(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable.get("valueFrom", {"value": variable.get("value")}) for variable in container.get("env", [])}


def configuration(result: Rendered, spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    mount, volume = mount_for(spec, container, CONFIG_PATH)
    assert "configMap" in volume, f"{CONFIG_PATH} is not mounted from a ConfigMap"
    config_map = result.get("ConfigMap", volume["configMap"]["name"])
    key = mount.get("subPath", PurePosixPath(CONFIG_PATH).name)
    return yaml.safe_load(config_map["data"][key])


def validate_config(config: dict[str, Any]) -> None:
    schema = CONFIG_SCHEMA
    if "telemetry" not in schema["properties"]:  # the metrics listener's keys, before the schema has them
        config = {key: value for key, value in config.items() if key != "telemetry"}
    jsonschema.validators.validator_for(schema)(schema).validate(config)


def env_names_in(config: Any) -> set[str]:
    """Every environment variable a configuration names (every key ending in ``_env``)."""
    found = set()
    if isinstance(config, dict):
        for key, value in config.items():
            if key.endswith("_env") and isinstance(value, str):
                found.add(value)
            else:
                found |= env_names_in(value)
    elif isinstance(config, list):
        for item in config:
            found |= env_names_in(item)
    return found


def named_port(container: dict[str, Any], name: str) -> int:
    ports = {port.get("name"): port["containerPort"] for port in container.get("ports", [])}
    assert name in ports, f"container {container['name']} has no port named {name}"
    return ports[name]


def probe_target(container: dict[str, Any], probe: str) -> tuple[str, int]:
    http = container[probe]["httpGet"]
    port = http["port"]
    return http["path"], named_port(container, port) if isinstance(port, str) else port


@pytest.mark.parametrize("name", sorted(GATEWAY_RENDERS))
def test_the_gateway_runs_its_configuration(renders: dict[str, Rendered], name: str) -> None:
    result = rendered(renders, name)
    item = gateway(result)
    assert item["metadata"]["namespace"] == GATEWAY_RENDERS[name]
    spec = pod_spec(item)
    assert spec is not None
    container = spec["containers"][0]
    assert container.get("args", SERVE_ARGS) == SERVE_ARGS
    config = configuration(result, spec, container)
    validate_config(config)

    # The shared store, its URLs and every other secret the configuration names, from Secrets.
    assert config["store"]["kind"] == "shared"
    sources = env_sources(container)
    for variable in env_names_in(config):
        assert variable in sources, f"the configuration reads ${variable}, which the container does not set"
        assert "secretKeyRef" in sources[variable], f"${variable} must come from a Secret (secretKeyRef)"
    for provider in config["providers"]:
        assert "api_key_file" not in provider, "provider keys come from Secrets as environment variables here"

    # Ports and probes.
    assert config["listen"]["host"] == "0.0.0.0"
    assert named_port(container, "http") == config["listen"]["port"] == 8080
    assert probe_target(container, "livenessProbe") == ("/healthz", 8080)
    assert probe_target(container, "readinessProbe") == ("/readyz", 8080)
    metrics = config["telemetry"]["metrics"]
    assert named_port(container, "metrics") == metrics["listen"]["port"] == 9464
    assert metrics["bearer_token_env"] == "PORTCULLIS_METRICS_TOKEN"

    # The bundle and its keys from ConfigMaps (the bundle without subPath, so a new one reaches the pods).
    assert config["policy"]["public_keys"], "only signed bundles may load"
    mount, volume = mount_for(spec, container, config["policy"]["bundle"])
    assert volume.get("configMap", {}).get("name") == "portcullis-bundle" and "subPath" not in mount
    assert config["policy"]["bundle"].endswith(".tar.gz")
    for key in config["policy"]["public_keys"]:
        _, volume = mount_for(spec, container, key["key_file"])
        assert volume.get("configMap", {}).get("name") == "portcullis-bundle-keys"

    # Everything the gateway writes is on a writable volume of its own.
    for path in (config["store"]["path"], config["audit"]["path"], "/tmp/portcullis"):
        mount, volume = mount_for(spec, container, path)
        assert not mount.get("readOnly") and ("emptyDir" in volume or "persistentVolumeClaim" in volume or "ephemeral" in volume), (
            f"{path} is not on a writable volume"
        )

    # One worker per CPU of the limit at most, and a drain that ends before the kill.
    assert config["workers"] != "auto" and config["workers"] <= cpu(container["resources"]["limits"]["cpu"])
    pause = container.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
    assert pause + config["listen"]["drain_seconds"] < spec["terminationGracePeriodSeconds"]


@pytest.mark.parametrize("name", sorted(GATEWAY_RENDERS))
def test_the_migration_job_migrates_the_same_store(renders: dict[str, Rendered], name: str) -> None:
    result = rendered(renders, name)
    gateway_spec = pod_spec(gateway(result))
    job = result.get("Job", "portcullis-db-migrate")
    spec = pod_spec(job)
    assert gateway_spec is not None and spec is not None
    container, serving = spec["containers"][0], gateway_spec["containers"][0]
    assert container["args"] == ["db", "migrate", "--config", CONFIG_PATH]
    assert container["image"] == serving["image"]
    config = configuration(result, spec, container)
    assert config == configuration(result, gateway_spec, serving)
    sources = env_sources(container)
    for variable in (config["store"]["database_url_env"], config["store"]["redis_url_env"]):
        assert sources[variable] == env_sources(serving)[variable]
    for key in config["policy"]["public_keys"]:  # the configuration is checked whole, key files included
        mount_for(spec, container, key["key_file"])
    assert spec["restartPolicy"] in ("OnFailure", "Never")


@pytest.mark.parametrize("name", sorted(GATEWAY_RENDERS))
def test_services_and_metrics_reach_the_gateway(renders: dict[str, Rendered], name: str) -> None:
    result = rendered(renders, name)
    item = gateway(result)
    labels = pod_labels(item)
    spec = pod_spec(item)
    assert spec is not None
    container = spec["containers"][0]
    clients = result.get("Service", "portcullis")
    assert selects({"matchLabels": clients["spec"]["selector"]}, labels)
    assert [(port["port"], port["targetPort"]) for port in clients["spec"]["ports"]] == [(8080, "http")], "the clients' Service serves 8080 only"
    metrics = result.get("Service", "portcullis-metrics")
    assert selects({"matchLabels": metrics["spec"]["selector"]}, labels)
    (port,) = metrics["spec"]["ports"]
    assert named_port(container, port["targetPort"]) == 9464
    token = env_sources(container)["PORTCULLIS_METRICS_TOKEN"]["secretKeyRef"]
    for monitor in result.of_kind("ServiceMonitor"):
        assert selects(monitor["spec"]["selector"], metrics["metadata"]["labels"])
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
        assert endpoint["authorization"]["credentials"] == {"name": token["name"], "key": token["key"]}
    if name != "overlays/dev":
        assert result.of_kind("ServiceMonitor"), f"{name}: no ServiceMonitor"


# --- network policies ----------------------------------------------------------------------------

ALLOWED_EGRESS = {("UDP", 53), ("TCP", 53), ("TCP", 5432), ("TCP", 6379), ("TCP", 443)}


def policies_for(result: Rendered, item: dict[str, Any]) -> list[dict[str, Any]]:
    namespace, labels = item["metadata"]["namespace"], pod_labels(item)
    return [
        policy for policy in result.of_kind("NetworkPolicy") if policy["metadata"]["namespace"] == namespace and selects(policy["spec"]["podSelector"], labels)
    ]


def ports_of(rule: dict[str, Any]) -> set[tuple[str, int]]:
    return {(port.get("protocol", "TCP"), port["port"]) for port in rule.get("ports", [])}


@pytest.mark.parametrize("name", sorted(GATEWAY_RENDERS))
def test_network_policies_allow_only_what_the_gateway_needs(renders: dict[str, Rendered], name: str) -> None:
    result = rendered(renders, name)
    namespace = GATEWAY_RENDERS[name]
    denials = [
        policy
        for policy in result.of_kind("NetworkPolicy")
        if policy["metadata"]["namespace"] == namespace
        and policy["spec"]["podSelector"] == {}
        and set(policy["spec"].get("policyTypes", [])) == {"Ingress", "Egress"}
        and not policy["spec"].get("ingress")
        and not policy["spec"].get("egress")
    ]
    assert denials, f"{namespace}: no default-deny NetworkPolicy"

    item = gateway(result)
    policies = [policy for policy in policies_for(result, item) if policy not in denials]
    assert policies, "no NetworkPolicy admits anything to the gateway"
    ingress = [rule for policy in policies for rule in policy["spec"].get("ingress", [])]
    by_port: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for rule in ingress:
        assert rule.get("from") and rule.get("ports"), f"an ingress rule open to every source or port: {rule}"
        for port in ports_of(rule):
            by_port.setdefault(port, []).extend(rule["from"])
    assert set(by_port) == {("TCP", 8080), ("TCP", 9464)}, f"the gateway admits ports {sorted(by_port)}"
    for peer in by_port[("TCP", 8080)]:
        assert peer.get("namespaceSelector", {}).get("matchLabels") == {"portcullis/client": "true"}, f"8080 is open to {peer}"
        assert "ipBlock" not in peer
    for peer in by_port[("TCP", 9464)]:
        assert peer == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}, f"9464 is open to {peer}"

    egress = [rule for policy in policies for rule in policy["spec"].get("egress", [])]
    assert egress, "the gateway may reach nothing"
    for rule in egress:
        assert rule.get("ports"), f"an egress rule open to every port: {rule}"
        assert ports_of(rule) <= ALLOWED_EGRESS, f"egress to {sorted(ports_of(rule) - ALLOWED_EGRESS)}"
        if ports_of(rule) & {("UDP", 53), ("TCP", 53)}:
            assert all(peer.get("podSelector", {}).get("matchLabels") == {"k8s-app": "kube-dns"} for peer in rule.get("to", [{}])), "DNS only to kube-dns"
    assert set().union(*(ports_of(rule) for rule in egress)) == ALLOWED_EGRESS

    # Every other pod of the namespace is admitted somewhere by a policy of its own (or stays fully denied on purpose: none here).
    for other in workloads(result):
        if other["metadata"]["namespace"] == namespace:
            assert [policy for policy in policies_for(result, other) if policy not in denials], (
                f"{other['kind']}/{other['metadata']['name']}: no NetworkPolicy but the default deny"
            )


# --- each overlay's promises ----------------------------------------------------------------------


def test_dev_runs_its_own_stores_with_user_created_secrets(renders: dict[str, Rendered]) -> None:
    dev = rendered(renders, "overlays/dev")
    assert [namespace["metadata"]["name"] for namespace in dev.of_kind("Namespace")] == ["portcullis-dev"]
    for store, port in (("postgres", 5432), ("redis", 6379)):
        deployment = dev.get("Deployment", store)
        service = dev.get("Service", store)
        assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels(deployment))
        assert service["spec"]["ports"][0]["port"] == port
    assert not dev.of_kind("Secret")
    postgres = pod_spec(dev.get("Deployment", "postgres"))
    assert postgres is not None
    assert env_sources(postgres["containers"][0])["POSTGRES_PASSWORD"] == {"secretKeyRef": {"name": "portcullis-store", "key": "POSTGRES_PASSWORD"}}
    assert dev.get("HorizontalPodAutoscaler", "portcullis")["spec"]["minReplicas"] == 1
    spec = pod_spec(gateway(dev))
    assert spec is not None
    config = configuration(dev, spec, spec["containers"][0])
    assert [provider["type"] for provider in config["providers"]] == ["mock"], "dev serves the default bundle's mock provider"


def test_prod_scales_further_than_the_base(renders: dict[str, Rendered]) -> None:
    base, prod = rendered(renders, "base"), rendered(renders, "overlays/prod")
    for result in (base, prod):  # the autoscaler owns the count: an apply must not reset it
        assert "replicas" not in result.get("Deployment", "portcullis")["spec"]
    base_hpa, prod_hpa = base.get("HorizontalPodAutoscaler", "portcullis")["spec"], prod.get("HorizontalPodAutoscaler", "portcullis")["spec"]
    assert prod_hpa["minReplicas"] > base_hpa["minReplicas"] and prod_hpa["maxReplicas"] > base_hpa["maxReplicas"]
    assert prod_hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "portcullis"}
    assert prod.get("PodDisruptionBudget", "portcullis")["spec"] != base.get("PodDisruptionBudget", "portcullis")["spec"]
    annotations = prod.get("ServiceAccount", "portcullis")["metadata"].get("annotations", {})
    assert re.fullmatch(r"arn:aws:iam::111122223333:role/[\w+=,.@-]+", annotations.get("eks.amazonaws.com/role-arn", "")), (
        "a placeholder role, never a real account"
    )
    stores = [rule for rule in prod.get("NetworkPolicy", "portcullis-gateway")["spec"]["egress"] if ports_of(rule) & {("TCP", 5432), ("TCP", 6379)}]
    assert stores and all(rule.get("to") and all("ipBlock" in peer for peer in rule["to"]) for rule in stores), (
        "prod narrows the stores' egress to their subnets"
    )


def test_node_local_is_a_daemonset_behind_a_local_service(renders: dict[str, Rendered]) -> None:
    base, local = rendered(renders, "base"), rendered(renders, "overlays/node-local")
    assert not local.of_kind("Deployment") and not local.of_kind("HorizontalPodAutoscaler") and not local.of_kind("PodDisruptionBudget")
    daemonset = local.get("DaemonSet", "portcullis")
    assert daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxSurge"] == 1
    spec, deployment = pod_spec(daemonset), pod_spec(base.get("Deployment", "portcullis"))
    assert spec is not None and deployment is not None
    assert not spec.get("hostNetwork") and not any("hostPort" in port for container in all_containers(spec) for port in container.get("ports", []))
    mine, theirs = dict(spec["containers"][0]), dict(deployment["containers"][0])
    mine.pop("resources"), theirs.pop("resources")
    assert mine == theirs, "the DaemonSet's container is the Deployment's, but for its resources"
    assert local.get("Service", "portcullis")["spec"]["internalTrafficPolicy"] == "Local"
    (ingress,) = [rule for rule in local.get("NetworkPolicy", "portcullis-gateway")["spec"]["ingress"] if ("TCP", 8080) in ports_of(rule)]
    assert ingress["from"] == [
        {"namespaceSelector": {"matchLabels": {"portcullis/client": "true"}}, "podSelector": {"matchLabels": {"portcullis/client": "true"}}}
    ]


def test_inference_pool_example_routes_to_its_pool(renders: dict[str, Rendered]) -> None:
    example = rendered(renders, "examples/inference-pool")
    (pool,) = example.of_kind("InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    (route,) = example.of_kind("HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    backends = [backend for rule in route["spec"]["rules"] for backend in rule["backendRefs"]]
    assert backends == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": pool["metadata"]["name"]}]
    (parent,) = route["spec"]["parentRefs"]
    gateway_object = example.get("Gateway", parent["name"])
    assert parent["sectionName"] in [listener["name"] for listener in gateway_object["spec"]["listeners"]]
    picker = pool["spec"]["endpointPickerRef"]
    service = example.get("Service", picker["name"])
    assert picker["port"]["number"] in [port["port"] for port in service["spec"]["ports"]]
    epp = [item for item in example.of_kind("Deployment") if selects({"matchLabels": service["spec"]["selector"]}, pod_labels(item))]
    assert len(epp) == 1
    epp_spec = pod_spec(epp[0])
    assert epp_spec is not None
    args = " ".join(epp_spec["containers"][0]["args"])
    assert f"--pool-name={pool['metadata']['name']}" in args and f"--pool-namespace={pool['metadata']['namespace']}" in args

    # Portcullis's side: the provider snippet is valid configuration, and points at the route.
    snippet = yaml.safe_load((KUBERNETES / "examples" / "inference-pool" / "portcullis-provider.yaml").read_text())
    validate_config({"policy": {"bundle": "bundle.tar.gz"}, **snippet})
    (provider,) = snippet["providers"]
    url = urlsplit(provider["base_url"])
    assert url.hostname == f"{gateway_object['metadata']['name']}.{gateway_object['metadata']['namespace']}.svc.cluster.local"
    prefixes = [match["path"]["value"] for rule in route["spec"]["rules"] for match in rule["matches"]]
    assert any(url.path.startswith(prefix) for prefix in prefixes)
    egress = example.get("NetworkPolicy", "portcullis-to-inference-gateway")
    assert egress["metadata"]["namespace"] == "portcullis"
    assert egress["spec"]["egress"][0]["to"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": gateway_object["metadata"]["namespace"]}}}
    ]
