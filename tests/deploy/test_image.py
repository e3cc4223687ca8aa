"""deploy/'s image, read statically (no image is built here: no registry is reachable):
the Containerfile's stages, user and installs, the hashed lock files against
pyproject.toml, the CycloneDX SBOM, and the scripts that regenerate them."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement

from tests.deploy.tools import (
    DEPLOY,
    PYPROJECT,
    SERVE_ARGS,
    containerfile_stages,
    normalise,
    read_lock,
)

# --- the image -----------------------------------------------------------------------------------

CONTAINERFILE = DEPLOY / "Containerfile"
COMPILERS = re.compile(r"\b(gcc|g\+\+|cc|c\+\+|clang|build-essential|make|cmake|rustc|cargo|gfortran|python3?-dev|libc6?-dev|musl-dev)\b")


@pytest.fixture(scope="module")
def stages() -> list[Any]:
    _, found = containerfile_stages(CONTAINERFILE.read_text())
    return found


def test_containerfile_is_multi_stage_from_a_pinned_base(stages: list[Any]) -> None:
    assert len(stages) >= 2, "a builder stage and a final stage"
    names = set()
    for stage in stages:
        assert stage.base in names or re.search(r"@sha256:[0-9a-f]{64}$", stage.base), f"FROM {stage.base} is not pinned by digest"
        if stage.name:
            names.add(stage.name)
    text = CONTAINERFILE.read_text()
    assert "imagetools inspect" in text or "crane digest" in text, "say how to refresh the pinned digest"


def test_containerfile_final_stage_runs_as_a_numeric_non_root_user(stages: list[Any]) -> None:
    users = stages[-1].arguments("USER")
    assert users, "the final stage sets no USER (it would run as root)"
    match = re.fullmatch(r"(\d+)(?::(\d+))?", users[-1])
    assert match, f"USER {users[-1]} is not numeric (Kubernetes cannot check runAsNonRoot by name)"
    assert int(match.group(1)) != 0 and match.group(2) != "0"


def test_containerfile_final_stage_has_no_compilers_or_sources(stages: list[Any]) -> None:
    final, builders = stages[-1], stages[:-1]
    for command in final.arguments("RUN"):
        if re.search(r"\b(apt-get|apt|apk|dnf|yum|microdnf)\b.*\binstall\b", command):
            assert not COMPILERS.search(command), f"the final stage installs a compiler: {command}"
        subcommands = re.findall(r"\bpip3?\s+(?:--python\s+\S+\s+|-\S+\s+)*(\w+)", command)
        assert not {"install", "wheel", "download"} & set(subcommands), f"the final stage installs Python packages itself: {command}"
    copies = final.arguments("COPY")
    assert copies and all(copy.startswith("--from=") for copy in copies), f"the final stage copies only from the builder: {copies}"
    built = [command for stage in builders for command in stage.arguments("RUN") if re.search(r"\bpip3?\s+(?:-\S+\s+)*wheel\b|python3? -m build\b", command)]
    assert built, "the wheel is built in the builder"


def test_containerfile_installs_the_lock_with_hashes_and_wheels_only(stages: list[Any]) -> None:
    commands = [command for stage in stages[:-1] for command in stage.arguments("RUN")]
    for lock in ("deploy/requirements.lock", "deploy/build-requirements.lock"):
        installs = [command for command in commands if f"-r {lock}" in command]
        assert installs, f"{lock} is not installed"
        for command in installs:
            assert "--require-hashes" in command and "--only-binary=:all:" in command, f"{lock} must be installed with --require-hashes --only-binary=:all:"
    copied = " ".join(copy for stage in stages for copy in stage.arguments("COPY"))
    assert "deploy/requirements.lock" in copied and "deploy/build-requirements.lock" in copied
    ignore = (DEPLOY / "Containerfile.dockerignore").read_text()
    assert "!deploy/requirements.lock" in ignore and "!deploy/build-requirements.lock" in ignore


def test_containerfile_serves_the_mounted_configuration(stages: list[Any]) -> None:
    final = stages[-1]
    (entrypoint,) = final.arguments("ENTRYPOINT")
    (command,) = final.arguments("CMD")
    argv = json.loads(entrypoint) + json.loads(command)
    assert PurePosixPath(argv[0]).name == "portcullis" and argv[1:] == SERVE_ARGS


# --- the lock files and the SBOM --------------------------------------------------------------------

LOCK = DEPLOY / "requirements.lock"
BUILD_LOCK = DEPLOY / "build-requirements.lock"
SBOM = DEPLOY / "sbom.cdx.json"


def pinned(requirements: list[str]) -> dict[str, Requirement]:
    return {normalise(requirement.name): requirement for requirement in map(Requirement, requirements)}


def test_every_locked_package_is_pinned_with_hashes() -> None:
    for path in (LOCK, BUILD_LOCK):
        locked = read_lock(path)
        assert locked, f"{path.name} pins nothing"
        for entry in locked.values():
            assert entry.hashes, f"{path.name}: {entry.name} has no --hash"
            assert all(re.fullmatch(r"[0-9a-f]{64}", digest) for digest in entry.hashes), f"{path.name}: {entry.name} has a malformed hash"


def test_the_lock_covers_every_runtime_dependency_and_nothing_of_the_extras() -> None:
    locked = read_lock(LOCK)
    runtime = pinned(PYPROJECT["project"]["dependencies"])
    for name, requirement in runtime.items():
        assert name in locked, f"{requirement} is a runtime dependency the lock does not pin"
        assert requirement.specifier.contains(locked[name].version), f"{requirement}: the lock pins {locked[name].version}"
        for extra in requirement.extras:  # e.g. psycopg[binary]: what the extra adds, from the installed package's metadata
            for needed in map(Requirement, importlib.metadata.requires(requirement.name) or []):
                if needed.marker and needed.marker.evaluate({**default_environment(), "extra": extra}) and "extra" in str(needed.marker):
                    assert normalise(needed.name) in locked, f"{requirement} needs {needed.name}, which the lock does not pin"
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra, requirements in extras.items():
        for name in pinned(requirements):
            assert name in runtime or name not in locked, f"{name} (the {extra} extra) is in the image's lock"


def test_the_build_lock_is_the_dev_extras_build_backend() -> None:
    dev = pinned(PYPROJECT["project"]["optional-dependencies"]["dev"])
    backend = pinned([line for line in (DEPLOY / "build-requirements.in").read_text().splitlines() if line.strip() and not line.startswith("#")])
    assert set(backend) == {"setuptools"}
    assert str(backend["setuptools"].specifier) == str(dev["setuptools"].specifier)
    assert read_lock(BUILD_LOCK)["setuptools"].version == str(dev["setuptools"].specifier).removeprefix("==")


def script_pin(script: str, variable: str) -> str:
    match = re.search(rf"^{variable}=(\S+)$", (DEPLOY / script).read_text(), re.MULTILINE)
    assert match, f"deploy/{script} does not pin {variable}"
    return match.group(1)


def test_the_lock_and_sbom_come_from_the_pinned_tools() -> None:
    uv, exclude_newer = script_pin("lock.sh", "UV_VERSION"), script_pin("lock.sh", "EXCLUDE_NEWER")
    assert re.fullmatch(r"\d+\.\d+\.\d+", uv)
    for path in (LOCK, BUILD_LOCK):
        header = path.read_text().split("\n", 3)[1]
        assert f"uv {uv}" in header and f"files uploaded before {exclude_newer}" in header, f"{path.name} was not written by deploy/lock.sh as it stands"
    cyclonedx = script_pin("sbom.sh", "CYCLONEDX_BOM_VERSION")
    sbom = json.loads(SBOM.read_text())
    tools = {(tool["name"], tool.get("version")) for tool in sbom["metadata"]["tools"]["components"]}
    assert ("cyclonedx-py", cyclonedx) in tools, f"the SBOM was not written by cyclonedx-py {cyclonedx}: {tools}"
    assert sbom["metadata"]["timestamp"].startswith(exclude_newer[:10]), "the SBOM's timestamp is the lock's resolution date (reproducible)"
    assert "serialNumber" not in sbom, "a random serial number makes the SBOM irreproducible"


def test_the_sbom_is_cyclonedx_listing_every_locked_package() -> None:
    sbom = json.loads(SBOM.read_text())
    assert sbom["bomFormat"] == "CycloneDX" and sbom["specVersion"] in ("1.5", "1.6", "1.7")
    assert sbom["$schema"] == f"http://cyclonedx.org/schema/bom-{sbom['specVersion']}.schema.json"
    assert isinstance(sbom["version"], int) and sbom["version"] >= 1
    root = sbom["metadata"]["component"]
    assert (root["type"], root["name"], root["version"]) == ("application", "portcullis", PYPROJECT["project"]["version"])
    references = [root["bom-ref"]] + [component["bom-ref"] for component in sbom["components"]]
    assert len(references) == len(set(references)), "bom-refs must be unique"
    for dependency in sbom.get("dependencies", []):
        assert {dependency["ref"], *dependency.get("dependsOn", [])} <= set(references)

    locked = read_lock(LOCK)
    listed = {}
    for component in sbom["components"]:
        assert component["type"] == "library"
        name = normalise(component["name"])
        assert component["purl"] == f"pkg:pypi/{name}@{component['version']}"
        hashes = {
            digest["content"] for reference in component.get("externalReferences", []) for digest in reference.get("hashes", []) if digest["alg"] == "SHA-256"
        }
        hashes |= {digest["content"] for digest in component.get("hashes", []) if digest["alg"] == "SHA-256"}
        listed[name] = (component["version"], hashes)
    assert set(listed) == set(locked), f"the SBOM and the lock differ: {sorted(set(listed) ^ set(locked))}; run deploy/sbom.sh"
    for name, entry in locked.items():
        assert listed[name] == (entry.version, set(entry.hashes)), f"{name}: the SBOM's version or hashes are not the lock's; run deploy/sbom.sh"


def test_the_scripts_are_executable() -> None:
    for script in ("lock.sh", "sbom.sh"):
        path: Path = DEPLOY / script
        assert path.stat().st_mode & 0o111, f"deploy/{script} is not executable"
        assert path.read_text().startswith("#!/usr/bin/env bash\n")
