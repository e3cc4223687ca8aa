"""``portcullis policy init DIR``: a bundle repository to start from. Its bundle holds
the default bundle's Rego and a starter organisation's data (``starter/``); beside it,
policy tests against that data and a CI workflow running ``ci/policy-ci.sh``: test →
check → lint → diff → sign → build."""

from __future__ import annotations

import argparse
import os
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
    init.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty directory, replacing files of the same name (never bundle data, a .manifest or a symbolic link)",
    )
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
    if present:  # every refusal comes before the first write: a refused run writes nothing
        _refuse_links_and_escapes(target, files)
        _refuse_to_replace_data(target)
    replaced = [name for name in files if (target / name).exists()]
    for name, content in files.items():
        path = target / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a link that appeared since the check is not followed either.
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o666)
            with os.fdopen(descriptor, "wb") as handle:
                handle.write(content)
            if name in EXECUTABLE:
                path.chmod(0o755)
        except OSError as error:
            raise Failure(f"cannot write {path}: {error.strerror or error}") from None
    _print_summary(target, files, replaced)
    return 0


def _refuse_links_and_escapes(target: Path, files: dict[str, bytes]) -> None:
    """Nothing is written through a symbolic link inside DIR (DIR itself may be one), nor
    anywhere that resolves outside DIR; a file's place taken by a folder, or a folder's
    by a file, is refused too, before anything is written."""
    root = target.resolve()
    links: set[str] = set()
    escapes: set[str] = set()
    blocked: set[str] = set()
    for name in files:
        parts = name.split("/")
        for depth in range(1, len(parts) + 1):
            relative = "/".join(parts[:depth])
            path = target / relative
            if path.is_symlink():
                links.add(f"{relative} -> {os.readlink(path)}")
                break
            if not path.exists():
                break
            if not (path.is_file() if depth == len(parts) else path.is_dir()):
                blocked.add(relative)
                break
        if not (target / name).resolve().is_relative_to(root):
            escapes.add(name)
    if links:
        raise Failure(f"{target} holds symbolic links where init would write: {', '.join(sorted(links))}; init does not write through links, and wrote nothing")
    if escapes:
        raise Failure(f"these paths resolve outside {target}: {', '.join(sorted(escapes))}; init wrote nothing")
    if blocked:
        raise Failure(f"{target} has something other than a file or folder where init writes one: {', '.join(sorted(blocked))}; init wrote nothing")


def _refuse_to_replace_data(target: Path) -> None:
    """--force replaces the starter's own files, never a bundle's data or its .manifest."""
    bundle = target / BUNDLE
    found = []
    for folder, _, names in os.walk(bundle):  # links are not followed
        for name in names:
            if name in ("data.yaml", "data.json", ".manifest"):
                found.append((Path(folder) / name).relative_to(target).as_posix())
    if found:
        raise Failure(
            f"{target} already holds bundle data ({', '.join(sorted(found))}): init writes a new repository; it will not replace your data, "
            "even with --force, and wrote nothing. Write it into a new directory and copy over what you want"
        )


def _print_summary(target: Path, files: dict[str, bytes], replaced: list[str]) -> None:
    rego = [name for name in files if name.startswith(f"{BUNDLE}/portcullis/") and name.endswith(".rego")]
    print(f"wrote {len(files)} files into {target}" + (f" ({len(replaced)} replaced)" if replaced else "") + ":")
    for name in files:
        if name not in rego:
            print(f"  {name}")
    print(f"  {BUNDLE}/portcullis/*.rego  ({len(rego)} modules: Portcullis's default Rego)")
    if replaced:
        print(f"replaced (--force; what they held before is gone): {len(replaced)} files")
        for name in replaced:
            print(f"  {name}")
    print("next:")
    print(f"  cd {target}")
    print(f"  portcullis policy test {BUNDLE} {TESTS} --coverage --threshold {COVERAGE_THRESHOLD}")
    print(f"  portcullis policy check {BUNDLE} --config ci/gateway.yaml   # name your gateways' providers in ci/gateway.yaml")
    print(f"  portcullis policy lint {BUNDLE} {TESTS}")
    print("  ci/policy-ci.sh   # every step, as .github/workflows/policy.yml runs it (README.md says what each file is)")
