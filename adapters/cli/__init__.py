"""The ``portcullis`` command line: one module per command group, each registering
its own subcommands."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from portcullis.adapters.cli import audit, capture, policy, serve, store
from portcullis.adapters.cli.common import Failure, reader_left
from portcullis.adapters.config import ConfigError

COMMAND_GROUPS = (serve, store, policy, audit, capture)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
    except Failure as error:
        print(f"portcullis: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        reader_left()
        return 141  # as a shell reports a command SIGPIPE ended


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="portcullis", description="Policy-as-code LLM gateway.")
    commands = parser.add_subparsers(title="commands")
    for group in COMMAND_GROUPS:
        group.register(commands)
    return parser
