"""A bundle activated as the gateway activates it, for the commands that decide without
a gateway (``policy eval``, ``policy diff``): every activation check runs, so a bundle
those commands decide with is one the gateway would serve."""

from __future__ import annotations

import dataclasses
import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING

from portcullis.adapters.cli.common import Failure

if TYPE_CHECKING:
    from portcullis.adapters.config import Config
    from portcullis.engine.activation import ActiveBundle


def activated(path: Path | None, config: Config | None, *, verify_signature: bool = True) -> ActiveBundle:
    """``path`` (a directory or .tar.gz; None: the configuration's own), checked against
    the configuration's providers and PII detectors, and with ``verify_signature`` its
    public keys (``load_bundle``). Without a configuration a bundle is checked against
    the providers its own catalog names. ``verify_signature=False`` judges what the bundle
    decides, not who signed it: a bundle under review is not signed yet, the live one is.
    Without a configuration there are no keys to verify a signature with: it is set aside
    (``policy check --public-key`` verifies one)."""
    from portcullis.adapters.bundles import load_bundle
    from portcullis.engine.activation import activate
    from portcullis.engine.bundle import BundleError, parse_bundle

    today = dt.datetime.now(dt.UTC).date()
    if path is not None and not path.exists():
        raise Failure(f"{path}: no such file or directory")
    try:
        if config is not None:
            if path is not None:
                config = dataclasses.replace(config, bundle_path=path)
            if verify_signature:
                return load_bundle(config, config.provider_regions(), today)
            return activate(parse_bundle(_unsigned(config.bundle_path), []), config.provider_regions(), today, config.pii.detectors())
        if path is None:
            raise Failure("no bundle given and no configuration: name the bundle, or give --config")
        parsed = parse_bundle(_unsigned(path), [])
        catalog = ((parsed.data.get("portcullis") or {}).get("catalog")) or {}
        providers = {target.get("provider") for model in (catalog.get("models") or {}).values() for target in model.get("targets") or []}
        return activate(parsed, {name: None for name in providers if isinstance(name, str)}, today)
    except (BundleError, OSError) as error:
        where = path if path is not None else config.bundle_path if config is not None else ""
        raise Failure(f"the bundle {where} cannot be loaded: {error}") from None


def _unsigned(path: Path) -> dict[str, bytes]:
    """The bundle's files without its signatures (which the digest never covers, so the
    bundle keeps the digest the gateway knows it by)."""
    from portcullis.engine.bundle import read_bundle_files
    from portcullis.engine.signing import SIGNATURES_FILE

    return {name: content for name, content in read_bundle_files(path).items() if name != SIGNATURES_FILE}
