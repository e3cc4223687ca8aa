"""JSON Schemas shipped in ``schemas/`` and the validators built from them.

Errors name the offending field as a dotted path (``providers[1].type``) so an
operator can find it in the file at a glance.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

# The schemas sit beside the package in a checkout (engine/../schemas) and in an
# installed wheel (portcullis/engine/../schemas) alike.
SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


class SchemaError(Exception):
    """A document does not match its schema; the message names the field."""


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check(name: str, document: Any, where: str = "") -> None:
    """Raise ``SchemaError`` for the first (most relevant) violation of schema ``name``."""
    errors = sorted(validator(name).iter_errors(document), key=lambda e: (len(e.absolute_path), str(e.absolute_path)))
    if errors:
        error = jsonschema.exceptions.best_match(errors)
        raise SchemaError(f"{field_path(where, error.absolute_path)}: {error.message}")


def field_path(prefix: str, parts: Iterable[Any]) -> str:
    path = prefix
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path or "(document)"
