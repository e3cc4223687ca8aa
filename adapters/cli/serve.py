"""``portcullis serve``: run the gateway."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from portcullis.adapters.cli.common import IDENTIFIER, Failure, with_config
from portcullis.adapters.config import Config, load_config

if TYPE_CHECKING:
    from portcullis.adapters.worker import WorkerLink


def register(commands: Any) -> None:
    serve = commands.add_parser("serve", help="run the gateway")
    with_config(serve)
    serve.add_argument("--demo-key", metavar="TEAM[/USER]", help="create a key for TEAM (and USER) and print ready-to-run examples")
    serve.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    if args.demo_key:  # the same names `keys create` accepts
        for label, value in zip(("team", "user"), args.demo_key.partition("/")[::2], strict=True):
            if value and not IDENTIFIER.fullmatch(value):
                raise Failure(f"--demo-key {label} must be 1-128 letters, digits or ._@- and start with a letter or digit, as in the bundle's tenants")
    config = load_config(Path(args.config))
    if not _port_is_free(config, bool(args.demo_key)):
        return 0
    if config.workers > 1:  # a supervisor that imports none of the gateway's heavy parts
        from portcullis.adapters.supervisor import supervise

        return supervise(config, Path(args.config), args.demo_key)
    run_gateway(config, args.demo_key)
    return 0


def run_gateway(config: Config, demo_key: str | None, worker: WorkerLink | None = None) -> None:
    """Serve until stopped: the single process, or one worker of several (``worker``).
    Start-up failures are raised as the ``Failure`` the command prints."""
    import uvloop

    from portcullis.adapters.app import serve
    from portcullis.adapters.audit_log import AuditLogError
    from portcullis.adapters.store import StoreUnavailable
    from portcullis.adapters.telemetry.config import TelemetryConfigError
    from portcullis.engine.bundle import BundleError

    on_ready = None
    if demo_key:
        team, _, user = demo_key.partition("/")

        async def on_ready(runtime: Any) -> None:
            from portcullis.adapters.quickstart import demo_key as make_demo_key
            from portcullis.adapters.quickstart import quickstart_text, state_dir

            key, key_id, reused = await make_demo_key(runtime.store, state_dir(config), team, user or None)
            print(quickstart_text(config, key, key_id, runtime.bundles.active, team, reused), flush=True)

    try:
        uvloop.run(serve(config, on_ready, worker))
    except BundleError as error:
        raise Failure(f"policy bundle {config.bundle_path} refused: {error}") from None
    except (StoreUnavailable, AuditLogError, TelemetryConfigError) as error:
        raise Failure(str(error)) from None


def _port_is_free(config: Config, quickstart: bool) -> bool:
    """A second `make run` finds the first one serving: say so (and, for the quickstart,
    where its key is) instead of a bind error. Another program on the port is an error."""
    from portcullis.adapters.quickstart import already_serving_text, probe_port

    occupant = probe_port(config.host, config.port)
    if occupant.kind == "free":
        return True
    if occupant.kind == "other":
        raise Failure(f"{config.host}:{config.port} is in use by another program (not a Portcullis gateway); stop it or change listen.port in {config.source}")
    print(already_serving_text(config, occupant, quickstart))
    if not quickstart:
        raise Failure(f"another Portcullis is already serving on http://{config.host}:{config.port}")
    return False
