"""``portcullis policy``: author, test, sign and build policy bundles."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from portcullis.adapters.cli.common import DEFAULT_CONFIG, QUICKSTART_CONFIG, Failure, config_path
from portcullis.adapters.config import load_config

POLICY_TESTS = Path("policy-tests")


def register(commands: Any) -> None:
    policy = commands.add_parser("policy", help="author, test and sign policy bundles").add_subparsers(title="policy commands")
    test = policy.add_parser("test", help="run *_test.rego tests (test_* rules) the way `opa test` does")
    test.add_argument("paths", nargs="*", type=Path, help="bundle directories or directories of tests (default: the configured bundle and ./policy-tests)")
    test.add_argument(
        "--config",
        "-c",
        help=f"configuration whose bundle is tested when no paths are given (default: $PORTCULLIS_CONFIG, ./{DEFAULT_CONFIG} or {QUICKSTART_CONFIG})",
    )
    test.add_argument("--verbose", "-v", action="store_true", help="print passing tests too")
    test.set_defaults(run=_policy_test)
    sign = policy.add_parser("sign", help="write .signatures.json into a bundle directory (OPA format)")
    sign.add_argument("bundle", type=Path)
    sign.add_argument("--signing-key", required=True, type=Path, help="PEM private key (RSA for RS256, P-256 for ES256)")
    sign.add_argument("--signing-alg", default="RS256", choices=["RS256", "ES256"])
    sign.add_argument("--key-id", default="default", help="the id the gateway's policy.public_keys knows the key by")
    sign.add_argument("--scope", default="")
    sign.set_defaults(run=_policy_sign)
    build = policy.add_parser("build", help="pack a bundle directory into a .tar.gz")
    build.add_argument("bundle", type=Path)
    build.add_argument("--output", "-o", required=True, type=Path)
    build.set_defaults(run=_policy_build)


def _policy_test(args: argparse.Namespace) -> int:
    from portcullis.engine.bundle import BundleError, merge_data, read_bundle_files, split_sources
    from portcullis.engine.policy_tests import run_policy_tests
    from portcullis.engine.rego import PolicyError

    paths = list(args.paths) or _configured_test_paths(args.config)
    modules: dict[str, str] = {}
    data: dict[str, Any] = {}
    try:
        for path in paths:
            if not path.exists():
                raise Failure(f"{path}: no such file or directory")
            files = {name: content for name, content in read_bundle_files(path).items() if name.endswith((".rego", ".json", ".yaml", ".yml"))}
            found_modules, found_tests, found_data = split_sources(files)
            if not (found_modules or found_tests or found_data):
                raise Failure(f"no tests found in {path}: it holds no *.rego or data files")
            modules.update({f"{path}/{name}": source for name, source in {**found_modules, **found_tests}.items()})
            data = merge_data(data, found_data)
        results = run_policy_tests(modules, data)
    except (BundleError, PolicyError) as error:
        raise Failure(str(error)) from None
    if not results:
        raise Failure(f"no tests found in {', '.join(map(str, paths))} (test rules are named test_* in *.rego files)")
    failed = [result for result in results if not result.passed]
    current_file = None
    for result in results:
        if args.verbose or not result.passed:
            if result.file != current_file:
                current_file = result.file
                print(f"{result.file}:")
            where = "" if result.passed else f" at {result.file}:{result.line}"
            print(f"  {result.path}: {'PASS' if result.passed else 'FAIL'} ({result.duration_us}µs){where}")
            for line in result.output:
                print(f"    {line}")
    print("-" * 60)
    print(f"PASS: {len(results) - len(failed)}/{len(results)}" + (f"\nFAIL: {len(failed)}/{len(results)}" if failed else ""))
    return 1 if failed else 0


def _configured_test_paths(config_option: str | None) -> list[Path]:
    """No paths given: the bundle the configuration serves, plus policy-tests/ here or
    beside the bundle (the repository's layout) when there is one."""
    source = config_path(config_option, "bundle and tests")
    config = load_config(source)
    bundle = Path(os.path.relpath(config.bundle_path))
    tests = next((path for path in (POLICY_TESTS, bundle.parent / POLICY_TESTS) if path.is_dir()), None)
    paths = [bundle] + ([Path(os.path.relpath(tests))] if tests else [])
    print(f"testing {', '.join(map(str, paths))} (bundle of {source})", file=sys.stderr)
    return paths


def _policy_sign(args: argparse.Namespace) -> int:
    from portcullis.engine.bundle import BundleError, read_bundle_files
    from portcullis.engine.signing import SIGNATURES_FILE, SignatureError, sign_files

    if not args.bundle.is_dir():
        raise Failure(f"{args.bundle} is not a bundle directory")
    try:
        files = {name: content for name, content in read_bundle_files(args.bundle).items() if name != SIGNATURES_FILE}
        signatures = sign_files(files, args.signing_key.read_bytes(), args.signing_alg, args.key_id, args.scope)
    except (BundleError, SignatureError, OSError, ValueError) as error:
        raise Failure(f"cannot sign {args.bundle}: {error}") from None
    (args.bundle / SIGNATURES_FILE).write_bytes(signatures)
    print(f"signed {len(files)} files of {args.bundle} with key {args.key_id!r} ({args.signing_alg})")
    return 0


def _policy_build(args: argparse.Namespace) -> int:
    from portcullis.engine.bundle import BundleError, read_bundle_files, write_tarball

    try:
        args.output.write_bytes(write_tarball(read_bundle_files(args.bundle)))
    except (BundleError, OSError) as error:
        raise Failure(f"cannot build {args.output}: {error}") from None
    print(f"wrote {args.output}")
    return 0
