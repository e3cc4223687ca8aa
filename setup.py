"""Package discovery for the folder→package mapping in pyproject.toml.

The repository's folders install under ``portcullis`` ([tool.setuptools.package-dir]:
``engine/`` is ``portcullis.engine``). setuptools' ``packages.find`` names what it
finds after the folder (``engine.pii``), never after that mapping, so the packages are
found here: every folder under a mapped one is a package, SQL-only folders included
(PEP 420 discovery), and a subpackage nobody listed still ships in the wheel.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_namespace_packages, setup

ROOT = Path(__file__).resolve().parent


def packages() -> list[str]:
    mapping: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = []
    for package, folder in mapping.items():
        found.append(package)
        found += [f"{package}.{name}" for name in find_namespace_packages(where=str(ROOT / folder))]
    return sorted(found)


setup(packages=packages())
