"""``portcullis keys|db|ledger``: the commands that work on the configured store."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from portcullis.adapters.cli.common import IDENTIFIER, Failure, store_call, with_config
from portcullis.adapters.config import Config, load_config

if TYPE_CHECKING:
    from portcullis.adapters.aws_credentials import SealKeys


def register(commands: Any) -> None:
    keys = commands.add_parser("keys", help="manage virtual keys").add_subparsers(title="key commands")
    create = keys.add_parser("create", help="create a key; it is printed once and only its SHA-256 is kept")
    with_config(create)
    create.add_argument("--team", required=True)
    create.add_argument("--user")
    create.add_argument("--name", help="a label to recognise the key by")
    create.add_argument(
        "--aws", action="store_true", help="an AWS-style access key id and secret for SigV4 clients (boto3 bedrock-runtime); the secret is kept sealed"
    )
    create.set_defaults(run=_keys_create)
    reseal = keys.add_parser("reseal", help="re-seal every AWS credential's secret with the newest seal key (after adding one)")
    with_config(reseal)
    reseal.set_defaults(run=_keys_reseal)
    revoke = keys.add_parser("revoke", help="revoke a key by its id")
    with_config(revoke)
    revoke.add_argument("key_id")
    revoke.set_defaults(run=_keys_revoke)
    listing = keys.add_parser("list", help="list keys (ids and owners, never secrets)")
    with_config(listing)
    listing.set_defaults(run=_keys_list)

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


def _keys_create(args: argparse.Namespace) -> int:
    from portcullis.adapters.auth import create_key
    from portcullis.adapters.bundles import load_bundle
    from portcullis.engine.bundle import BundleError

    for label, value in (("team", args.team), ("user", args.user)):
        if value is not None and not IDENTIFIER.fullmatch(value):
            raise Failure(f"--{label} must be 1-128 letters, digits or ._@- and start with a letter or digit, as in the bundle's tenants")
    config = load_config(Path(args.config))
    try:
        bundle = load_bundle(config, config.provider_regions(), dt.datetime.now(dt.UTC).date())
        if args.team not in bundle.bundle.data["portcullis"]["tenants"]["teams"]:
            print(
                f"portcullis: warning: team {args.team!r} is not in bundle revision {bundle.revision!r}; the key will be refused until it is", file=sys.stderr
            )
    except BundleError as error:
        print(f"portcullis: warning: could not check the team against the bundle ({error})", file=sys.stderr)
    if args.aws:
        return _aws_create(config, args)
    record, key = store_call(config, lambda store: create_key(store, args.team, args.user, args.name))
    print(f"key_id: {record.key_id}", file=sys.stderr)
    print(f"team: {record.team}" + (f"  user: {record.user}" if record.user else ""), file=sys.stderr)
    print("The key is shown only now; store it in a secret manager.", file=sys.stderr)
    print(key)
    return 0


def _seal(config: Config) -> SealKeys:
    from portcullis.adapters.aws_credentials import configured_seal

    seal = configured_seal(config.aws_credentials)
    if seal is None:
        raise Failure("AWS credentials need a seal key: set auth.aws_credentials.seal_key_env in the configuration (see docs/operations.md)")
    return seal


def _aws_create(config: Config, args: argparse.Namespace) -> int:
    from portcullis.adapters.aws_credentials import create_aws_credential

    seal = _seal(config)
    record, secret = store_call(config, lambda store: create_aws_credential(store, seal, args.team, args.user, args.name))
    print(f"key_id: {record.key_id}", file=sys.stderr)
    print(f"team: {record.team}" + (f"  user: {record.user}" if record.user else ""), file=sys.stderr)
    print("The secret is shown only now; store it in a secret manager. Clients sign with SigV4, service bedrock, any region.", file=sys.stderr)
    print(f"AWS_ACCESS_KEY_ID={record.key_id}")
    print(f"AWS_SECRET_ACCESS_KEY={secret}")
    return 0


def _keys_reseal(args: argparse.Namespace) -> int:
    from portcullis.adapters.aws_credentials import reseal_all

    config = load_config(Path(args.config))
    seal = _seal(config)
    resealed, unopenable = store_call(config, lambda store: reseal_all(store, seal))
    print(f"resealed {resealed} credential{'s' if resealed != 1 else ''} with seal key {seal.newest_id}")
    if unopenable:
        raise Failure(f"no configured seal key opens {len(unopenable)} credential(s): {', '.join(unopenable)}; add back the key that sealed them")
    return 0


def _keys_revoke(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config))
    revoked = store_call(config, lambda store: store.keys.revoke_key(args.key_id, dt.datetime.now(dt.UTC)))
    if not revoked:
        raise Failure(f"no active key with id {args.key_id!r}")
    print(f"revoked {args.key_id}")
    return 0


def _keys_list(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config))
    for record in store_call(config, lambda store: store.keys.list_keys()):
        state = f"revoked {record.revoked_at.isoformat()}" if record.revoked_at else "active"
        print(f"{record.key_id}  team={record.team}  user={record.user or '-'}  name={record.name or '-'}  created={record.created_at.isoformat()}  {state}")
    return 0


def _db_migrate(args: argparse.Namespace) -> int:
    config = load_config(Path(args.config))

    async def applied(store: Any) -> list[str]:
        return list(store.keys.applied_migrations)

    names = store_call(config, applied, migrate=True)
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
            raise Failure(f"cannot read {args.usage}: {error.strerror}") from None
        for number, line in enumerate(lines, start=1):
            try:
                if line.strip():
                    record = json.loads(line)
                    evidence[str(record["request_id"])] = record
            except (ValueError, KeyError, TypeError):
                raise Failure(f"{args.usage}:{number}: expected a JSON object with a request_id") from None
    try:
        bundle = load_bundle(config, config.provider_regions(), dt.datetime.now(dt.UTC).date())
    except BundleError as error:
        raise Failure(f"the policy bundle is needed for prices and cannot be loaded: {error}") from None

    async def run(store: Any) -> list[Any]:
        if args.reload_counters and hasattr(store.ledger, "reload_counters"):
            print(f"dropped {await store.ledger.reload_counters()} cached counters; they reload from the ledger on next use")
        cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=args.older_than)
        return await reconcile(store.ledger, bundle, cutoff, evidence)

    resolutions = store_call(config, run)
    for item in resolutions:
        if not item.replayed:
            print(f"{item.reservation_id}  was {item.previous_state}  charged {item.cost_micro_usd} micro-USD  ({item.note})")
    done = sum(1 for item in resolutions if not item.replayed)
    print(f"reconciled {done} reservation{'s' if done != 1 else ''}")
    return 0
