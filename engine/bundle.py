"""Policy bundles in OPA's layout: a directory or ``.tar.gz`` holding ``.manifest``,
Rego modules (at their package path) and ``data.json`` / ``data.yaml`` documents
(at their directory path), optionally signed with ``.signatures.json``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from portcullis.engine.documents import load_yaml
from portcullis.engine.signing import SIGNATURES_FILE, VerificationKey, file_digest, verify_files

MAX_BUNDLE_BYTES = 64 * 1024 * 1024
DATA_FILES = ("data.json", "data.yaml", "data.yml")


class BundleError(Exception):
    """A bundle cannot be read, is malformed, or fails one of its checks."""


@dataclass(frozen=True)
class Bundle:
    revision: str
    roots: tuple[str, ...]
    digest: str  # sha256 over every file's signature digest: what the audit log records
    modules: dict[str, str]  # policy modules, by file name
    tests: dict[str, str]  # *_test.rego modules, run before activation, never served
    data: dict[str, Any]
    signed_by: str | None
    metadata: dict[str, Any] = field(default_factory=dict)


def read_bundle_files(path: Path) -> dict[str, bytes]:
    """Every regular file of a bundle directory or ``.tar.gz``, by bundle-relative name."""
    if path.is_dir():
        files: dict[str, bytes] = {}
        total = 0
        for item in sorted(path.rglob("*")):
            if item.is_file() and not _hidden_tooling(item.relative_to(path)):
                content = item.read_bytes()
                total += len(content)
                if total > MAX_BUNDLE_BYTES:
                    raise BundleError(f"bundle {path} is larger than {MAX_BUNDLE_BYTES} bytes")
                files[item.relative_to(path).as_posix()] = content
        return files
    if path.is_file():
        return _read_tarball(path.read_bytes())
    raise BundleError(f"bundle {path} does not exist")


def _hidden_tooling(relative: Path) -> bool:
    # Editor and VCS litter is not part of a bundle; dot files OPA knows are.
    return any(part.startswith(".") and part not in (".manifest", SIGNATURES_FILE) for part in relative.parts)


def _read_tarball(blob: bytes) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                total += member.size
                if total > MAX_BUNDLE_BYTES:
                    raise BundleError(f"bundle is larger than {MAX_BUNDLE_BYTES} bytes")
                extracted = archive.extractfile(member)
                if extracted is not None:
                    files[member.name.lstrip("/").removeprefix("./")] = extracted.read()
    except (tarfile.TarError, OSError, EOFError) as error:
        raise BundleError(f"bundle is not a readable .tar.gz: {error}") from None
    return files


def write_tarball(files: Mapping[str, bytes]) -> bytes:
    """A reproducible ``.tar.gz`` of the given bundle files."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for name, content in sorted(files.items()):
            info = tarfile.TarInfo(name=f"/{name}")
            info.size = len(content)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def parse_bundle(files: Mapping[str, bytes], keys: list[VerificationKey]) -> Bundle:
    """Verify and parse bundle files. The signature is checked before anything is parsed."""
    try:
        signed_by = verify_files(files, keys)
    except Exception as error:
        raise BundleError(f"signature check failed: {error}") from None
    manifest = _manifest(files)
    roots = tuple(manifest.get("roots") or [""])
    modules, tests, data = split_sources(files, roots)
    if not modules:
        raise BundleError("bundle has no Rego policy modules")
    digest = hashlib.sha256(
        "".join(f"{name}:{file_digest(name, content)}\n" for name, content in sorted(files.items()) if name != SIGNATURES_FILE).encode()
    ).hexdigest()
    return Bundle(
        revision=str(manifest.get("revision", "")),
        roots=roots,
        digest=digest,
        modules=modules,
        tests=tests,
        data=data,
        signed_by=signed_by,
        metadata=dict(manifest.get("metadata") or {}),
    )


def split_sources(files: Mapping[str, bytes], roots: tuple[str, ...] = ("",)) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """Policy modules, test modules and the merged data document of a set of files."""
    modules: dict[str, str] = {}
    tests: dict[str, str] = {}
    data: dict[str, Any] = {}
    for name, content in sorted(files.items()):
        base = name.rsplit("/", 1)[-1]
        if name.endswith(".rego"):
            source = _text(name, content)
            _check_root(name, _package_of(name, source), roots)
            (tests if name.endswith("_test.rego") else modules)[name] = source
        elif base in DATA_FILES:
            directory = [part for part in name.split("/")[:-1] if part]
            _check_root(name, ".".join(directory), roots)
            _place(data, directory, _data_document(name, content))
    return modules, tests, data


def merge_data(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` deep-merged with ``extra``, the way OPA merges data documents."""
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_data(merged[key], value)
        else:
            merged[key] = value
    return merged


def _manifest(files: Mapping[str, bytes]) -> dict[str, Any]:
    raw = files.get(".manifest")
    if raw is None:
        return {}
    try:
        manifest = json.loads(raw)
    except ValueError as error:
        raise BundleError(f".manifest is not valid JSON: {error}") from None
    if not isinstance(manifest, dict):
        raise BundleError(".manifest must be a JSON object")
    roots = manifest.get("roots")
    if roots is not None and (not isinstance(roots, list) or not all(isinstance(r, str) for r in roots)):
        raise BundleError(".manifest roots must be a list of strings")
    return manifest


def _text(name: str, content: bytes) -> str:
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError:
        raise BundleError(f"{name} is not UTF-8 text") from None


def _package_of(name: str, source: str) -> str:
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("package "):
            return stripped.removeprefix("package ").strip()
    raise BundleError(f"{name} declares no package")


def _check_root(name: str, path: str, roots: tuple[str, ...]) -> None:
    dotted = path.replace("/", ".")
    for root in roots:
        prefix = root.strip("/").replace("/", ".")
        if not prefix or dotted == prefix or dotted.startswith(prefix + "."):
            return
    raise BundleError(f"{name} writes outside the manifest roots {list(roots)}")


def _data_document(name: str, content: bytes) -> Any:
    try:
        if name.endswith(".json"):
            return json.loads(content)
        return load_yaml(content)
    except (ValueError, yaml.YAMLError) as error:
        raise BundleError(f"{name} is not valid {'JSON' if name.endswith('.json') else 'YAML'}: {error}") from None


def _place(tree: dict[str, Any], path: list[str], document: Any) -> None:
    node = tree
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise BundleError(f"data at {'/'.join(path)} collides with another data file")
    if not path:
        if not isinstance(document, dict):
            raise BundleError("root data document must be an object")
        for key, value in document.items():
            _place(tree, [key], value)
        return
    key = path[-1]
    if key in node and isinstance(node[key], dict) and isinstance(document, dict):
        overlap = set(node[key]) & set(document)
        if overlap:
            raise BundleError(f"data at {'/'.join(path)} is defined twice ({sorted(overlap)[0]})")
        node[key].update(document)
    elif key in node:
        raise BundleError(f"data at {'/'.join(path)} is defined twice")
    else:
        node[key] = document
