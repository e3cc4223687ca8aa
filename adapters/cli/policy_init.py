"""``portcullis policy init DIR``: a bundle repository to start from. Its bundle holds
the default bundle's Rego and a starter organisation's data (``starter/``); beside it,
policy tests against that data and a CI workflow running ``ci/policy-ci.sh``: test →
check → lint → diff → sign → build."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from portcullis.adapters.cli.common import Failure

HERE = Path(__file__).resolve().parent
STARTER = HERE / "starter"
# The default bundle sits beside the package folders in a checkout (adapters/../policies)
# and in the installed wheel (portcullis/adapters/../policies, mapped in pyproject.toml)
# alike, as schemas/ does: the starter takes its Rego from there, so there is one copy.
DEFAULT_BUNDLE = HERE.parent.parent / "policies"
BUNDLE = "policies"
TESTS = "policy-tests"
COVERAGE_THRESHOLD = 70  # what ci/policy-ci.sh requires of the starter's tests
# Stored without their dot: setuptools ships no dot folder, and a .gitignore in starter/
# would act on this source tree.
DOTTED = {"gitignore": ".gitignore", "github": ".github"}
EXECUTABLE = frozenset({"ci/policy-ci.sh"})


def register(policy: Any) -> None:
    init = policy.add_parser("init", help="write a bundle repository to start from: a starter bundle, its tests and a CI workflow")
    init.add_argument("directory", type=Path, help="where to write it: a new or empty directory")
    init.add_argument("--force", action="store_true", help="write into a non-empty directory, replacing files of the same name")
    init.set_defaults(run=_policy_init)


def skeleton() -> dict[str, bytes]:
    """The repository's files by relative path: the starter's, then the default Rego."""
    files = {}
    for path in sorted(STARTER.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            relative = path.relative_to(STARTER).parts
            files["/".join(DOTTED.get(part, part) for part in relative)] = path.read_bytes()
    modules = sorted((DEFAULT_BUNDLE / "portcullis").glob("*.rego"))
    if not files or not modules:
        raise Failure(f"this installation of portcullis lacks the starter files ({STARTER}) or the default bundle's Rego ({DEFAULT_BUNDLE}): reinstall it")
    files.update({f"{BUNDLE}/portcullis/{module.name}": module.read_bytes() for module in modules})
    return files


def _policy_init(args: argparse.Namespace) -> int:
    target: Path = args.directory
    if target.exists() and not target.is_dir():
        raise Failure(f"{target} exists and is not a directory")
    present = sorted(entry.name for entry in target.iterdir()) if target.is_dir() else []
    if present and not args.force:
        shown = ", ".join(present[:5]) + (", …" if len(present) > 5 else "")
        raise Failure(f"{target} is not empty ({shown}); choose a new or empty directory, or give --force to write over files of the same name")
    files = skeleton()
    replaced = [name for name in files if (target / name).exists()]
    for name, content in files.items():
        path = target / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            if name in EXECUTABLE:
                path.chmod(0o755)
        except OSError as error:
            raise Failure(f"cannot write {path}: {error.strerror or error}") from None
    _print_summary(target, files, replaced)
    return 0


def _print_summary(target: Path, files: dict[str, bytes], replaced: list[str]) -> None:
    rego = [name for name in files if name.startswith(f"{BUNDLE}/portcullis/") and name.endswith(".rego")]
    print(f"wrote {len(files)} files into {target}" + (f" ({len(replaced)} replaced)" if replaced else "") + ":")
    for name in files:
        if name not in rego:
            print(f"  {name}")
    print(f"  {BUNDLE}/portcullis/*.rego  ({len(rego)} modules: Portcullis's default Rego)")
    print("next:")
    print(f"  cd {target}")
    print(f"  portcullis policy test {BUNDLE} {TESTS} --coverage --threshold {COVERAGE_THRESHOLD}")
    print(f"  portcullis policy check {BUNDLE} --config ci/gateway.yaml   # name your gateways' providers in ci/gateway.yaml")
    print(f"  portcullis policy lint {BUNDLE} {TESTS}")
    print("  ci/policy-ci.sh   # every step, as .github/workflows/policy.yml runs it (README.md says what each file is)")
