"""``portcullis policy check`` (every activation check, offline, every problem at once)
and ``portcullis policy lint`` (this engine's traps in a bundle's Rego)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

from portcullis.adapters.cli.common import DEFAULT_CONFIG, QUICKSTART_CONFIG, Failure, config_path
from portcullis.adapters.config import Config, ConfigError, load_config

FORMATS = ("pretty", "json")


def register(policy: Any) -> None:
    """Add ``check`` and ``lint`` to the ``portcullis policy`` subcommands."""
    config_help = f"gateway configuration (default: $PORTCULLIS_CONFIG, ./{DEFAULT_CONFIG} or {QUICKSTART_CONFIG}, the first that exists)"
    check = policy.add_parser("check", help="run every activation check offline, reporting every problem with file:line and a fix")
    check.add_argument("bundle", nargs="?", type=Path, help="bundle directory or .tar.gz (default: the configuration's bundle)")
    check.add_argument("--config", "-c", help=f"{config_help}; its providers, PII detectors and public keys are checked against")
    check.add_argument(
        "--public-key",
        action="append",
        default=[],
        metavar="[ID=]PEM",
        help="verify the signature with this PEM public key (RSA: RS256, P-256: ES256); ID: its key id (default: the id the signature names); repeatable",
    )
    check.add_argument("--format", choices=FORMATS, default="pretty")
    check.set_defaults(run=_policy_check)
    lint = policy.add_parser("lint", help="find this engine's traps in Rego: costly request paths, OPA/regorus differences")
    lint.add_argument("paths", nargs="*", type=Path, help="bundle directories, .tar.gz bundles or .rego files (default: the configuration's bundle)")
    lint.add_argument("--config", "-c", help=f"{config_help}; used only when no paths are given")
    lint.add_argument("--format", choices=FORMATS, default="pretty")
    lint.set_defaults(run=_policy_lint)


def _policy_check(args: argparse.Namespace) -> int:
    from portcullis.engine.bundle import BundleError, read_bundle_files
    from portcullis.engine.policy_check import Context, check_files, report_json

    config, source = _config(args.config)
    bundle = args.bundle or (Path(os.path.relpath(config.bundle_path)) if config else None)
    if bundle is None:
        raise Failure(f"no bundle given and no configuration found ({DEFAULT_CONFIG}, {QUICKSTART_CONFIG}); name the bundle, or give --config")
    try:
        files = read_bundle_files(bundle)
    except BundleError as error:
        raise Failure(str(error)) from None
    keys = _keys(args.public_key, files) if args.public_key else (config.public_keys if config and config.public_keys else None)
    context = Context(
        today=dt.datetime.now(dt.UTC).date(),
        config=str(source) if source else None,
        providers=config.provider_regions() if config else None,
        detectors=config.pii.detectors() if config else None,
    )
    report = check_files(files, keys, context)
    shown = {finding: f"{bundle}/{finding.file}" if finding.file else str(bundle) for finding in report.findings}
    if args.format == "json":
        document = report_json(report)
        for entry, finding in zip(document["findings"], report.findings, strict=True):
            entry["file"] = shown[finding] if finding.file else None
        print(json.dumps({"bundle": str(bundle), "config": context.config, **document}, indent=2))
        return 0 if report.ok else 1
    _print_check(report, bundle, shown, context.config)
    return 0 if report.ok else 1


def _print_check(report: Any, bundle: Path, shown: dict[Any, str], config: str | None) -> None:
    from portcullis.engine.policy_check import LABELS

    revision = f" (revision {report.revision!r})" if report.revision else ""
    for finding in report.findings:
        line = f":{finding.line}" if finding.line else ""
        print(f"{shown[finding]}{line}: {finding.check}: {finding.message}")
        if finding.hint:
            print(f"    hint: {finding.hint}")
    against = f" against {config}" if config else ""
    if report.findings:
        print(f"FAIL: {len(report.findings)} problem{'s' if len(report.findings) != 1 else ''} in {bundle}{revision}{against}")
    else:
        print(f"ok: {bundle}{revision}{against}: {len(report.passed)} checks passed")
    for check in report.passed:
        print(f"  passed   {check}: {LABELS[check]}" + (f" (key {report.signed_by!r})" if check == "signature" and report.signed_by else ""))
    for check, why in report.skipped.items():
        print(f"  skipped  {check}: {why}")


def _policy_lint(args: argparse.Namespace) -> int:
    from portcullis.engine.bundle import BundleError, read_bundle_files
    from portcullis.engine.policy_lint import lint_modules

    paths = list(args.paths)
    if not paths:
        config = load_config(config_path(args.config, "paths to lint"))
        paths = [Path(os.path.relpath(config.bundle_path))]
    modules: dict[str, str] = {}
    for path in paths:
        if not path.exists():
            raise Failure(f"{path}: no such file or directory")
        try:
            files = {path.name: path.read_bytes()} if path.suffix == ".rego" else read_bundle_files(path)
        except (BundleError, OSError) as error:
            raise Failure(str(error)) from None
        for name, content in sorted(files.items()):
            if name.endswith(".rego"):
                display = str(path) if path.suffix == ".rego" else f"{path}/{name}"
                try:
                    modules[display] = content.decode("utf-8")
                except UnicodeDecodeError:
                    raise Failure(f"{display} is not UTF-8 text") from None
    if not modules:
        raise Failure(f"no Rego modules in {', '.join(map(str, paths))}")
    findings = lint_modules(modules)
    if args.format == "json":
        entries = [{"file": f.file, "line": f.line, "rule": f.rule, "message": f.message} for f in findings]
        print(json.dumps({"ok": not findings, "modules": len(modules), "findings": entries}, indent=2))
    else:
        for finding in findings:
            print(finding)
        count = f"{len(findings)} finding{'s' if len(findings) != 1 else ''}"
        print(f"{'ok' if not findings else 'FAIL'}: {count} in {len(modules)} module{'s' if len(modules) != 1 else ''}")
    return 1 if findings else 0


def _config(option: str | None) -> tuple[Config | None, Path | None]:
    """--config, else the one `policy test` would find; a found one that does not load is
    reported and left out (the checks that need it are skipped), a named one is an error."""
    if option:
        return load_config(Path(option)), Path(option)
    try:
        source = config_path(None, "bundle")
    except Failure:
        return None, None
    try:
        return load_config(source), source
    except ConfigError as error:
        print(f"portcullis: {source} does not load, so nothing is checked against it: {error}", file=sys.stderr)
        return None, None


def _keys(options: list[str], files: dict[str, bytes]) -> list[Any]:
    from portcullis.engine.policy_check import algorithm_of, signature_key_id
    from portcullis.engine.signing import VerificationKey

    keys = []
    for option in options:
        key_id, _, name = option.partition("=") if "=" in option and not Path(option).exists() else ("", "", option)
        try:
            pem = Path(name).read_bytes()
        except OSError as error:
            raise Failure(f"--public-key {option}: {error.strerror}") from None
        algorithm = algorithm_of(pem)
        if algorithm is None:
            raise Failure(f"--public-key {option}: not a PEM RSA or P-256 public key")
        keys.append(VerificationKey(key_id or signature_key_id(files) or "default", algorithm, pem))
    return keys
