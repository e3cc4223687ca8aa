"""``portcullis policy``: author, test, sign and build policy bundles."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from portcullis.adapters.cli import policy_check, policy_diff, policy_eval, policy_init, policy_test
from portcullis.adapters.cli.common import Failure


def register(commands: Any) -> None:
    policy = commands.add_parser("policy", help="author, test and sign policy bundles").add_subparsers(title="policy commands")
    policy_init.register(policy)
    policy_test.register(policy)
    policy_eval.register(policy)
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
    policy_check.register(policy)
    policy_diff.register(policy)


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
