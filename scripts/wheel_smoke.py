"""The wheel is what users install, so `make wheel-check` tests the wheel itself.

1. Builds it (pip, the dev extra's pinned setuptools, no build isolation) from a copy of
   the files git knows, so neither a stale ``build/`` nor a local leftover reaches it.
2. Checks its contents: every module and data file under the folders pyproject.toml maps
   into ``portcullis`` is in it, and nothing outside ``portcullis/`` and its dist-info.
3. Installs it, with its dependencies, into a fresh venv (pip's cache makes this quick)
   and proves that venv imports the installed copy: no checkout on sys.path, not editable.
4. Imports every module the wheel holds there, so a module that needs a dev-only
   dependency fails here, not at a user's first request.
5. Runs what a user runs: ``portcullis --help``, ``portcullis policy test`` on the default
   bundle, ``portcullis policy init`` (whose starter's tests and checks pass, from the
   wheel's files alone), and the quickstart (``serve --config
   examples/quickstart/config.yaml`` on a free port, the bundle and configuration copied
   beside it as in a checkout), answering one Anthropic Messages and one OpenAI Chat
   request, then a clean SIGTERM stop.

Any missing module or data file fails loudly, naming what is missing. ``--dist DIR``
keeps the wheel that passed, so the artifact shipped is the one tested.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = Path("examples/quickstart/config.yaml")
QUICKSTART_DATA = ("policies", "policy-tests")  # beside the configuration, as in a checkout
START_TIMEOUT = 30.0
STARTER_THRESHOLD = "70"  # the coverage the starter's ci/policy-ci.sh requires


class Failure(Exception):
    """The wheel is broken; the message says how."""


def main() -> int:
    parser = argparse.ArgumentParser(description="Build the wheel, install it into a fresh venv and run the quickstart from it.")
    parser.add_argument("--dist", type=Path, help="copy the wheel here once it passed")
    args = parser.parse_args()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="portcullis-wheel-") as scratch:
            work = Path(scratch)
            with phase("build the wheel"):
                wheel = build_wheel(work)
            with phase("check its contents"):
                modules = check_contents(wheel)
            with phase("install it into a fresh venv"):
                python = install(wheel, work / "venv")
            with phase("check what the venv imports"):
                check_installed(python, work)
                check_modules_import(python, modules, work)
            run = quickstart_checkout(work / "checkout")
            with phase("portcullis --help, policy test and policy init"):
                check_commands(python.parent / "portcullis", run)
            with phase("serve the quickstart"):
                check_quickstart(python.parent / "portcullis", run)
            if args.dist:
                args.dist.mkdir(parents=True, exist_ok=True)
                shutil.copy2(wheel, args.dist / wheel.name)
    except Failure as failure:
        print(f"wheel-check FAILED: {failure}", file=sys.stderr)
        return 1
    print(f"wheel-check passed in {time.monotonic() - started:.1f}s")
    return 0


@contextmanager
def phase(name: str) -> Iterator[None]:
    started = time.monotonic()
    yield
    print(f"  {name}: {time.monotonic() - started:.1f}s")


def package_dirs() -> dict[str, str]:
    """pyproject.toml's folder→package mapping (``portcullis.engine`` → ``engine``)."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


def known_files(*paths: str) -> list[Path]:
    """Files git tracks or would track (new, not ignored) that exist, relative to the root."""
    listed = run_checked(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *paths])
    return sorted({Path(name) for name in listed.split("\0") if name and (ROOT / name).is_file()})


def build_wheel(work: Path) -> Path:
    source = work / "source"
    for relative in known_files():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, source / relative)
    dist = work / "dist"
    run_checked([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "--wheel-dir", str(dist), str(source)])
    wheels = list(dist.glob("portcullis-*.whl"))
    if len(wheels) != 1:
        raise Failure(f"expected one portcullis wheel in {dist}, found {[w.name for w in wheels]}")
    return wheels[0]


def check_contents(wheel: Path) -> list[str]:
    """Every source module and data file is in the wheel; returns the wheel's modules."""
    expected = set()
    for package, folder in package_dirs().items():
        for path in known_files(folder):
            if "__pycache__" not in path.parts:
                expected.add("/".join([*package.split("."), *path.relative_to(folder).parts]))
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    missing = sorted(expected - names)
    if missing:
        raise Failure(
            f"{wheel.name} lacks {len(missing)} file(s) of the source tree: {', '.join(missing)}\n"
            "  (a package setup.py does not find, or data that [tool.setuptools.package-data] does not match)"
        )
    stray = sorted(name for name in names if not name.startswith("portcullis/") and not re.match(r"portcullis-[^/]+\.dist-info/", name))
    if stray:
        raise Failure(f"{wheel.name} holds files outside the portcullis package: {', '.join(stray)}")
    print(f"    {wheel.name}: {len(names)} files, all {len(expected)} source files present")
    modules = []
    for name in sorted(names):
        if name.endswith(".py") and name.startswith("portcullis/"):
            parts = name.removesuffix(".py").split("/")
            modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def install(wheel: Path, venv: Path) -> Path:
    """A venv without pip of its own: the dev venv's pip installs into it (and its cache serves the dependencies)."""
    run_checked([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    run_checked([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-input", "--no-compile", str(wheel)])
    return python


def clean_env() -> dict[str, str]:
    """The caller's environment without what could point Python or Portcullis elsewhere."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "PORTCULLIS_", "VIRTUAL_ENV"))}
    env["PORTCULLIS_LOG_LEVEL"] = "INFO"
    return env


_WHERE_FROM = """
import importlib.metadata, importlib.util, json, sys
import portcullis.adapters.cli
direct_url = importlib.metadata.distribution("portcullis").read_text("direct_url.json") or "{}"
print(json.dumps({
    "cli": portcullis.adapters.cli.__file__,
    "namespace": list(portcullis.__path__),
    "sys_path": sys.path,
    "top_level_engine": importlib.util.find_spec("engine") is not None,
    "editable": json.loads(direct_url).get("dir_info", {}).get("editable", False),
}))
"""


def check_installed(python: Path, work: Path) -> None:
    """The venv imports the wheel's copy: under its site-packages, not editable, no checkout on sys.path."""
    found = json.loads(run_checked([str(python), "-I", "-c", _WHERE_FROM], cwd=work, env=clean_env()))
    site = python.parent.parent.resolve()
    if not Path(found["cli"]).resolve().is_relative_to(site) or any(not Path(p).resolve().is_relative_to(site) for p in found["namespace"]):
        raise Failure(f"the venv imports portcullis from outside itself: {found['cli']} (namespace {found['namespace']})")
    on_path = [entry for entry in found["sys_path"] if entry and Path(entry).resolve().is_relative_to(ROOT) and not Path(entry).resolve().is_relative_to(site)]
    if on_path or found["top_level_engine"]:
        raise Failure(f"the checkout is on the venv's sys.path: {on_path or found['sys_path']}")
    if found["editable"]:
        raise Failure("portcullis is installed editable in the venv")
    print(f"    imports {Path(found['cli']).relative_to(site)}")


def check_modules_import(python: Path, modules: list[str], work: Path) -> None:
    script = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    run_checked([str(python), "-I", "-c", script, *modules], cwd=work, env=clean_env())
    print(f"    {len(modules)} modules import")


def quickstart_checkout(run: Path) -> Path:
    """The quickstart configuration and the bundles it names, laid out as in a checkout;
    only the port changes, to a free one."""
    config = yaml.safe_load((ROOT / QUICKSTART).read_text())
    config["listen"]["port"] = free_port()
    (run / QUICKSTART).parent.mkdir(parents=True)
    (run / QUICKSTART).write_text(yaml.safe_dump(config))
    for folder in QUICKSTART_DATA:
        for relative in known_files(folder):
            (run / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / relative, run / relative)
    return run


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_commands(portcullis: Path, run: Path) -> None:
    usage = run_checked([str(portcullis), "--help"], cwd=run, env=clean_env())
    if "serve" not in usage or "policy" not in usage:
        raise Failure(f"`portcullis --help` does not list its commands:\n{usage}")
    result = run_checked([str(portcullis), "policy", "test", *QUICKSTART_DATA], cwd=run, env=clean_env())
    print(f"    policy test: {result.strip().splitlines()[-1] if result.strip() else 'passed'}")
    # The starter repository comes from the installed package alone: its Rego included.
    starter = run.parent / "starter"
    run_checked([str(portcullis), "policy", "init", str(starter)], cwd=run.parent, env=clean_env())
    tested = run_checked([str(portcullis), "policy", "test", "policies", "policy-tests", "--threshold", STARTER_THRESHOLD], cwd=starter, env=clean_env())
    run_checked([str(portcullis), "policy", "check", "policies"], cwd=starter, env=clean_env())
    print(f"    policy init: the starter's tests pass ({tested.strip().splitlines()[-1]}), policy check ok")


def check_quickstart(portcullis: Path, run: Path) -> None:
    port = yaml.safe_load((run / QUICKSTART).read_text())["listen"]["port"]
    output = run / "serve.out"
    command = [str(portcullis), "serve", "--config", str(QUICKSTART), "--demo-key", "demo/alice"]
    with output.open("w") as sink:
        process = subprocess.Popen(command, cwd=run, env=clean_env(), stdout=sink, stderr=subprocess.STDOUT)
    try:
        text = wait_for_ready(process, output, f"http://127.0.0.1:{port}/readyz")
        key = re.search(r"export PORTCULLIS_KEY=(\S+)", text)
        models = re.findall(r'"model": "([^"]+)"', text)  # the Anthropic example's model, then the OpenAI one
        if key is None or len(models) < 2:
            raise Failure(f"the quickstart text lacks the key or the example models:\n{text}")
        base = f"http://127.0.0.1:{port}"
        message = post(
            f"{base}/v1/messages",
            {"x-api-key": key.group(1), "anthropic-version": "2023-06-01"},
            {"model": models[0], "max_tokens": 64, "messages": [{"role": "user", "content": "Hello"}]},
        )
        if message.get("type") != "message" or not message.get("content") or not message["content"][0].get("text"):
            raise Failure(f"the Anthropic Messages answer is not a message: {message}")
        chat = post(
            f"{base}/v1/chat/completions",
            {"authorization": f"Bearer {key.group(1)}"},
            {"model": models[1], "messages": [{"role": "user", "content": "Hello"}]},
        )
        if chat.get("object") != "chat.completion" or not chat["choices"][0]["message"].get("content"):
            raise Failure(f"the OpenAI Chat answer is not a completion: {chat}")
        print(f"    answered {models[0]} (Anthropic Messages) and {models[1]} (OpenAI Chat)")
        process.send_signal(signal.SIGTERM)
        if (code := process.wait(timeout=20)) != 0:
            raise Failure(f"`portcullis serve` exited {code} on SIGTERM:\n{output.read_text()}")
    except Failure as failure:
        raise Failure(f"{failure}\n--- serve output ---\n{output.read_text()}") from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def wait_for_ready(process: subprocess.Popen[bytes], output: Path, readyz: str) -> str:
    """The quickstart text, once printed and /readyz answers: the text comes out just
    before the listening socket is bound."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if process.poll() is not None:
            raise Failure(f"`portcullis serve` exited {process.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise Failure(f"`portcullis serve` not ready after {START_TIMEOUT:.0f}s")
        if "export PORTCULLIS_KEY=" in (text := output.read_text()):
            try:
                with urllib.request.urlopen(readyz, timeout=2) as response:
                    if response.status == 200:
                        return text
            except OSError:
                pass  # not listening yet
        time.sleep(0.05)


def post(url: str, headers: dict[str, str], body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={**headers, "content-type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=20) as response:
            return json.loads(response.read())
    except (OSError, ValueError) as error:  # HTTPError included: anything but a 200 with JSON
        detail = error.read().decode(errors="replace") if isinstance(error, urllib.error.HTTPError) else ""
        raise Failure(f"POST {url} failed: {error} {detail}") from None


def run_checked(command: list[str], cwd: Path = ROOT, env: dict[str, str] | None = None) -> str:
    """The command's standard output; a non-zero exit is a failure that shows its output."""
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise Failure(f"`{' '.join(command)}` exited {result.returncode}:\n{result.stdout}{result.stderr}")
    return result.stdout


if __name__ == "__main__":
    sys.exit(main())
