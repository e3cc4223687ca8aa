"""What every command shares: the configuration it reads, the store it opens, and how
it fails (a message the user can act on, never a traceback)."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from pathlib import Path
from typing import Any

from portcullis.adapters.config import Config

DEFAULT_CONFIG = "portcullis.yaml"
QUICKSTART_CONFIG = "examples/quickstart/config.yaml"
IDENTIFIER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,127}")  # schemas/bundle-data.schema.json#/$defs/identifier


class Failure(Exception):
    """A command failed for a reason the user can act on."""


def reader_left() -> None:
    """The reader of stdout (`| head`) went away: nothing more is written, and Python's
    own flush at exit finds nowhere to fail (so no traceback)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def emit(text: str) -> None:
    """A command's report, for a command whose exit status must survive its reader
    leaving early (a CI gate piped to `head`)."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        reader_left()


def with_config(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--config",
        "-c",
        default=os.environ.get("PORTCULLIS_CONFIG", DEFAULT_CONFIG),
        help="gateway configuration file (default: $PORTCULLIS_CONFIG or ./portcullis.yaml)",
    )


def config_path(option: str | None, instead: str) -> Path:
    """--config, else $PORTCULLIS_CONFIG, ./portcullis.yaml or the quickstart's, the first that exists."""
    if option:
        return Path(option)
    found = next((Path(c) for c in (os.environ.get("PORTCULLIS_CONFIG"), DEFAULT_CONFIG, QUICKSTART_CONFIG) if c and Path(c).is_file()), None)
    if found is None:
        raise Failure(f"no configuration found ({DEFAULT_CONFIG}, {QUICKSTART_CONFIG}); name the {instead}, or give --config")
    return found


async def _with_store(config: Config, action: Any, migrate: bool = False) -> Any:
    from portcullis.adapters.store import open_store

    store = await open_store(config.store, config.max_auth_failures, config.auth_failure_window, migrate=migrate)
    try:
        return await action(store)
    finally:
        await store.close()


def store_call(config: Config, action: Any, migrate: bool = False) -> Any:
    from portcullis.adapters.store import StoreUnavailable

    try:
        return asyncio.run(_with_store(config, action, migrate))
    except StoreUnavailable as error:
        raise Failure(str(error)) from None
