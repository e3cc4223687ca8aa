"""One gateway process of ``workers: N``, started by the supervisor (``adapters/supervisor.py``)
as ``python -m portcullis.adapters.worker``; not a command for operators.

A worker listens on the supervisor's port with a socket of its own (``SO_REUSEPORT``: the
kernel spreads connections over the workers) and reaches the state every worker shares
through its inherited state channel (``store/state_host.py``).
It writes its own audit chain (one writer per file): worker 0 the configured
``audit.path``, worker k ``<stem>.w<k><suffix>`` beside it. A start-up failure is not
printed here but sent to the supervisor, which prints it once, as a single process would.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from portcullis.adapters.store.state_host import StateClient

log = logging.getLogger("portcullis")


@dataclass
class WorkerLink:
    """What a worker holds from its supervisor."""

    index: int
    listener: socket.socket
    state: StateClient


BACKLOG = 2048  # uvicorn's default


def port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to the port every worker shares (not yet listening)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def worker_audit_path(base: Path, index: int) -> Path:
    return base if index == 0 else base.with_name(f"{base.stem}.w{index}{base.suffix}")


def worker_audit_paths(base: Path) -> list[Path]:
    """The chains beside ``base`` that workers 1, 2, … wrote (those that exist), in worker order."""
    found = []
    for path in base.parent.glob(f"{base.stem}.w*{base.suffix}"):
        index = path.name[len(base.stem) + 2 : len(path.name) - len(base.suffix)]
        if index.isdigit() and worker_audit_path(base, int(index)) == path:
            found.append((int(index), path))
    return [path for _, path in sorted(found)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="portcullis-worker", description="a worker of portcullis serve (started by the supervisor)")
    parser.add_argument("--config", required=True)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--state-fd", type=int, required=True)
    parser.add_argument("--demo-key")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("PORTCULLIS_LOG_LEVEL", "INFO").upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    from portcullis.adapters.cli.common import Failure
    from portcullis.adapters.cli.serve import run_gateway
    from portcullis.adapters.config import ConfigError, load_config

    state = StateClient.from_fd(args.state_fd)
    try:
        config = load_config(Path(args.config))
        try:
            listener = port_socket(config.host, args.port)
            listener.listen(BACKLOG)
        except OSError as error:
            raise Failure(f"cannot listen on {config.host}:{args.port}: {error.strerror}") from None
        run_gateway(config, args.demo_key, WorkerLink(args.index, listener, state))
        return 0
    except ConfigError as error:  # the texts and statuses of the portcullis command itself
        text, status = f"portcullis: configuration error: {error}", 2
    except Failure as error:
        text, status = f"portcullis: {error}", 1
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        log.exception("worker %d failed", args.index)
        text, status = f"portcullis: worker {args.index} failed: {type(error).__name__}", 1
    state.report_failure(text, status)
    return status


if __name__ == "__main__":
    sys.exit(main())
