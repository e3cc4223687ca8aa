"""What the deploy test modules share: kubectl, every kustomization rendered once per
session, and the vendored CRDs' schemas."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.deploy.tools import CrdSchemas, Rendered, ToolMissing, find_kubectl, kustomization_dirs, render


@pytest.fixture(scope="session")
def kubectl() -> str:
    try:
        return find_kubectl()
    except ToolMissing as missing:
        pytest.fail(str(missing), pytrace=False)


@pytest.fixture(scope="session")
def renders(kubectl: str) -> dict[str, Rendered]:
    with ThreadPoolExecutor(max_workers=4) as pool:
        return {rendered.name: rendered for rendered in pool.map(lambda directory: render(kubectl, directory), kustomization_dirs())}


@pytest.fixture(scope="session")
def crds() -> CrdSchemas:
    return CrdSchemas.load()
