"""The ``portcullis`` command line."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from portcullis.adapters.config import Config, ConfigError, load_config

DEFAULT_CONFIG = "portcullis.yaml"
QUICKSTART_CONFIG = "examples/quickstart/config.yaml"
POLICY_TESTS = Path("policy-tests")
IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")  # schemas/bundle-data.schema.json#/$defs/identifier


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return 2
    logging.basicConfig(
        level=os.environ.get("PORTCULLIS_LOG_LEVEL", "INFO").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        return int(args.run(args) or 0)
    except ConfigError as error:
        print(f"portcullis: configuration error: {error}", file=sys.stderr)
        return 2
    except _Failure as error:
        print(f"portcullis: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


class _Failure(Exception):
    """A command failed for a reason the user can act on."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="portcullis", description="Policy-as-code LLM gateway.")
    commands = parser.add_subparsers(title="commands")

    def with_config(command: argparse.ArgumentParser) -> None:
        command.add_argument(
            "--config",
            "-c",
            default=os.environ.get("PORTCULLIS_CONFIG", DEFAULT_CONFIG),
            help="gateway configuration file (default: $PORTCULLIS_CONFIG or ./portcullis.yaml)",
        )

    serve = commands.add_parser("serve", help="run the gateway")
    with_config(serve)
    serve.add_argument("--demo-key", metavar="TEAM[/USER]", help="create a key for TEAM (and USER) and print ready-to-run examples")
    serve.set_defaults(run=_serve)

    keys = commands.add_parser("keys", help="manage virtual keys").add_subparsers(title="key commands")
    create = keys.add_parser("create", help="create a key; it is printed once and only its SHA-256 is kept")
    with_config(create)
    create.add_argument("--team", required=True)
    create.add_argument("--user")
    create.add_argument("--name", help="a label to recognise the key by")
    create.set_defaults(run=_keys_create)
    revoke = keys.add_parser("revoke", help="revoke a key by its id")
    with_config(revoke)
    revoke.add_argument("key_id")
    revoke.set_defaults(run=_keys_revoke)
    listing = keys.add_parser("list", help="list keys (ids and owners, never secrets)")
    with_config(listing)
    listing.set_defaults(run=_keys_list)

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

    audit = commands.add_parser("audit", help="audit log tools").add_subparsers(title="audit commands")
    verify = audit.add_parser("verify", help="check the hash chain; exits non-zero at the first bad record")
    verify.add_argument("path", type=Path, nargs="?", help="the audit log (default: the configuration's audit.path)")
    verify.add_argument("--config", "-c", help="verify this configuration's audit.path (found as for policy test)")
    verify.set_defaults(run=_audit_verify)

    ledger = commands.add_parser("ledger", help="the spend ledger").add_subparsers(title="ledger commands")
    reconcile = ledger.add_parser("reconcile", help="resolve reservations no settlement completed (cut streams, crashed processes)")
    with_config(reconcile)
    reconcile.add_argument(
        "--older-than",
        type=float,
        default=86400,
        metavar="SECONDS",
        help="open reservations older than this are abandoned (default: a day, longer than any live request)",
    )
    reconcile.add_argument("--usage", type=Path, help="JSON lines of provider usage: request_id, input, output, cache_read, cache_write[, served]")
    reconcile.add_argument("--reload-counters", action="store_true", help="shared store: drop Redis counters so they reload from PostgreSQL")
    reconcile.set_defaults(run=_ledger_reconcile)

    db = commands.add_parser("db", help="database schema").add_subparsers(title="database commands")
    migrate = db.add_parser("migrate", help="apply pending migrations to the configured store")
    with_config(migrate)
    migrate.set_defaults(run=_db_migrate)
    return parser


# --- serve ---------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    import uvloop

    from portcullis.adapters.app import serve
    from portcullis.adapters.audit_log import AuditLogError
    from portcullis.adapters.store import StoreUnavailable
    from portcullis.engine.bundle import BundleError

    if args.demo_key:  # the same names `keys create` accepts
        for label, value in zip(("team", "user"), args.demo_key.partition("/")[::2], strict=True):
            if value and not IDENTIFIER.fullmatch(value):
                raise _Failure(f"--demo-key {label} must be 1-128 letters, digits or ._@- and start with a letter or digit, as in the bundle's tenants")
    config = load_config(Path(args.config))
    if not _port_is_free(config, bool(args.demo_key)):
        return 0
    on_ready = None
    if args.demo_key:
        team, _, user = args.demo_key.partition("/")

        async def on_ready(runtime: Any) -> None:
            from portcullis.adapters.quickstart import demo_key, quickstart_text, state_dir

            key, key_id, reused = await demo_key(runtime.store, state_dir(config), team, user or None)
            print(quickstart_text(config, key, key_id, runtime.bundles.active, team, reused), flush=True)

    try:
        uvloop.run(serve(config, on_ready))
    except BundleError as error:
        raise _Failure(f"policy bundle {config.bundle_path} refused: {error}") from None
    except (StoreUnavailable, AuditLogError) as error:
        raise _Failure(str(error)) from None
    return 0


def _port_is_free(config: Config, quickstart: bool) -> bool:
    """A second `make run` finds the first one serving: say so (and, for the quickstart,
    where its key is) instead of a bind error. Another program on the port is an error."""
    from portcullis.adapters.quickstart import already_serving_text, probe_port

    occupant = probe_port(config.host, config.port)
    if occupant.kind == "free":
        return True
    if occupant.kind == "other":
        raise _Failure(f"{config.host}:{config.port} is in use by another program (not a Portcullis gateway); stop it or change listen.port in {config.source}")
    print(already_serving_text(config, occupant, quickstart))
    if not quickstart:
        raise _Failure(f"another Portcullis is already serving on http://{config.host}:{config.port}")
    return False


# --- keys ----------------------------------------------------------------------------


async def _with_store(config: Config, action: Any, migrate: bool = False) -> Any:
    from portcullis.adapters.store import open_store

    store = await open_store(config.store, config.max_auth_failures, config.auth_failure_window, migrate=migrate)
    try:
        return await action(store)
    finally:
        await store.close()


def _store_call(config: Config, action: Any, migrate: bool = False) -> Any:
    from portcullis.adapters.store import StoreUnavailable

    try:
        return asyncio.run(_with_store(config, action, migrate))
    except StoreUnavailable as error:
        raise _Failure(str(error)) from None


def _keys_create(args: argparse.Namespace) -> int:
    from portcullis.adapters.auth import create_key
    from portcullis.adapters.bundles import load_bundle
    from portcullis.engine.bundle import BundleError

    for label, value in (("team", args.team), ("user", args.user)):
        if value is not None and not IDENTIFIER.fullmatch(value):
            raise _Failure(f"--{label} must be 1-128 letters, digits or ._@- and start with a letter or digit, as in the bundle's tenants")
    config = load_config(Path(args.config))
    try:
        bundle = load_bundle(config, config.providers.keys(), dt.datetime.now(dt.UTC).date())
        if args.team not in bundle.bundle.data["portcullis"]["tenants"]["teams"]:
            print(
                f"portcullis: warning: team {args.team!r} is not in bundle revision {bundle.revision!r}; the key will be refused until it is", file=sys.stderr
            )
    except BundleError as error:
        print(f"portcullis: warning: could not check the team against the bundle ({error})", file=sys.stderr)
    record, key = _store_call(config, lambda store: create_key(store, args.team, args.user, args.name))
    print(f"key_id: {record.key_id}", file=sys.stderr)
    print(f"team: {record.team}" + (f"  user: {record.user}" if record.user else ""), file=sys.stderr)
    print("The key is shown only now; store it in a secret manager.", file=sys.stderr)
    print(key)
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config))
    revoked = _store_call(config, lambda store: store.keys.revoke_key(args.key_id, dt.datetime.now(dt.UTC)))
    if not revoked:
        raise _Failure(f"no active key with id {args.key_id!r}")
    print(f"revoked {args.key_id}")
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config))
    for record in _store_call(config, lambda store: store.keys.list_keys()):
        state = f"revoked {record.revoked_at.isoformat()}" if record.revoked_at else "active"
        print(f"{record.key_id}  team={record.team}  user={record.user or '-'}  name={record.name or '-'}  created={record.created_at.isoformat()}  {state}")
    return 0


def _db_migrate(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config))

    async def applied(store: Any) -> list[str]:
        return list(store.keys.applied_migrations)

    names = _store_call(config, applied, migrate=True)
    print(f"{config.store.kind} store schema is up to date" + (f" (applied {', '.join(names)})" if names else ""))
    return 0


def _ledger_reconcile(args: argparse.Namespace) -> int:
    from portcullis.adapters.bundles import load_bundle
    from portcullis.adapters.governance import reconcile
    from portcullis.engine.bundle import BundleError

    config = load_config(Path(args.config))
    evidence: dict[str, dict[str, Any]] = {}
    if args.usage:
        try:
            lines = args.usage.read_text().splitlines()
        except OSError as error:
            raise _Failure(f"cannot read {args.usage}: {error.strerror}") from None
        for number, line in enumerate(lines, start=1):
            try:
                if line.strip():
                    record = json.loads(line)
                    evidence[str(record["request_id"])] = record
            except (ValueError, KeyError, TypeError):
                raise _Failure(f"{args.usage}:{number}: expected a JSON object with a request_id") from None
    try:
        bundle = load_bundle(config, config.providers.keys(), dt.datetime.now(dt.UTC).date())
    except BundleError as error:
        raise _Failure(f"the policy bundle is needed for prices and cannot be loaded: {error}") from None

    async def run(store: Any) -> list[Any]:
        if args.reload_counters and hasattr(store.ledger, "reload_counters"):
            print(f"dropped {await store.ledger.reload_counters()} cached counters; they reload from the ledger on next use")
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=args.older_than)
        return await reconcile(store.ledger, bundle, cutoff, evidence)

    resolutions = _store_call(config, run)
    for item in resolutions:
        if not item.replayed:
            print(f"{item.reservation_id}  was {item.previous_state}  charged {item.cost_micro_usd} micro-USD  ({item.note})")
    done = sum(1 for item in resolutions if not item.replayed)
    print(f"reconciled {done} reservation{'s' if done != 1 else ''}")
    return 0


# --- policy --------------------------------------------------------------------------


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
                raise _Failure(f"{path}: no such file or directory")
            files = {name: content for name, content in read_bundle_files(path).items() if name.endswith((".rego", ".json", ".yaml", ".yml"))}
            found_modules, found_tests, found_data = split_sources(files)
            if not (found_modules or found_tests or found_data):
                raise _Failure(f"no tests found in {path}: it holds no *.rego or data files")
            modules.update({f"{path}/{name}": source for name, source in {**found_modules, **found_tests}.items()})
            data = merge_data(data, found_data)
        results = run_policy_tests(modules, data)
    except (BundleError, PolicyError) as error:
        raise _Failure(str(error)) from None
    if not results:
        raise _Failure(f"no tests found in {', '.join(map(str, paths))} (test rules are named test_* in *.rego files)")
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


def _config_path(option: str | None, instead: str) -> Path:
    """--config, else $PORTCULLIS_CONFIG, ./portcullis.yaml or the quickstart's, the first that exists."""
    if option:
        return Path(option)
    found = next((Path(c) for c in (os.environ.get("PORTCULLIS_CONFIG"), DEFAULT_CONFIG, QUICKSTART_CONFIG) if c and Path(c).is_file()), None)
    if found is None:
        raise _Failure(f"no configuration found ({DEFAULT_CONFIG}, {QUICKSTART_CONFIG}); name the {instead}, or give --config")
    return found


def _configured_test_paths(config_option: str | None) -> list[Path]:
    """No paths given: the bundle the configuration serves, plus policy-tests/ here or
    beside the bundle (the repository's layout) when there is one."""
    config_path = _config_path(config_option, "bundle and tests")
    config = load_config(config_path)
    bundle = Path(os.path.relpath(config.bundle_path))
    tests = next((path for path in (POLICY_TESTS, bundle.parent / POLICY_TESTS) if path.is_dir()), None)
    paths = [bundle] + ([Path(os.path.relpath(tests))] if tests else [])
    print(f"testing {', '.join(map(str, paths))} (bundle of {config_path})", file=sys.stderr)
    return paths


def _policy_sign(args: argparse.Namespace) -> int:
    from portcullis.engine.bundle import BundleError, read_bundle_files
    from portcullis.engine.signing import SIGNATURES_FILE, SignatureError, sign_files

    if not args.bundle.is_dir():
        raise _Failure(f"{args.bundle} is not a bundle directory")
    try:
        files = {name: content for name, content in read_bundle_files(args.bundle).items() if name != SIGNATURES_FILE}
        signatures = sign_files(files, args.signing_key.read_bytes(), args.signing_alg, args.key_id, args.scope)
    except (BundleError, SignatureError, OSError, ValueError) as error:
        raise _Failure(f"cannot sign {args.bundle}: {error}") from None
    (args.bundle / SIGNATURES_FILE).write_bytes(signatures)
    print(f"signed {len(files)} files of {args.bundle} with key {args.key_id!r} ({args.signing_alg})")
    return 0


def _policy_build(args: argparse.Namespace) -> int:
    from portcullis.engine.bundle import BundleError, read_bundle_files, write_tarball

    try:
        args.output.write_bytes(write_tarball(read_bundle_files(args.bundle)))
    except (BundleError, OSError) as error:
        raise _Failure(f"cannot build {args.output}: {error}") from None
    print(f"wrote {args.output}")
    return 0


# --- audit ---------------------------------------------------------------------------


def _audit_verify(args: argparse.Namespace) -> int:
    from portcullis.engine.audit_chain import verify

    if args.path is not None and args.config:
        raise _Failure("give the audit log's path or --config, not both")
    if args.path is None:
        args.path = Path(os.path.normpath(load_config(_config_path(args.config, "audit log")).audit_path))
    try:
        with args.path.open("rb") as handle:
            result = verify(handle)
    except OSError as error:
        raise _Failure(f"cannot read {args.path}: {error.strerror}") from None
    if not result.ok:
        print(f"{args.path}: line {result.bad_line}: {result.problem}")
        print(f"the first {result.records} records are intact (last good seq {result.head.seq})")
        return 1
    print(f"{args.path}: {result.records} records, chain intact (head seq {result.head.seq}, hash {result.head.hash[:16]}…)")
    if result.repairs:
        print(f"torn writes cut at start-up and recorded: {len(result.repairs)} (audit_repaired at seq {', '.join(map(str, result.repairs))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
