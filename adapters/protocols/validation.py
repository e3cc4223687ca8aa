"""Primitives for the ingress validators (one per protocol): type checks that name the
field by the client's own path (``messages[1].content[0].type``), and the caps that
bound how much work one request may ask for. A validator checks every field the
gateway reads before anything else reads it, so a wrong type is a 400 that says where,
never a failure deeper in the pipeline; fields it does not read pass through unchecked."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from portcullis.adapters.config import RequestLimits
from portcullis.engine.errors import ErrorKind, GatewayError, json_type

__all__ = ["RequestLimits", "Walk", "too_many", "wrong_type"]


def wrong_type(where: str, expected: str, value: Any) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_REQUEST, f"{where}: expected {expected}, got {json_type(value)}", code="invalid_request")


def too_many(what: str, limit: int, code: str) -> GatewayError:
    return GatewayError(ErrorKind.REQUEST_TOO_LARGE, f"the request has more {what} than this gateway accepts ({limit})", code=code)


class Walk:
    """One validation pass over a request body: typed reads of its members, plus the
    count of content blocks seen so far against the cap."""

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits
        self._blocks = 0

    # --- counts --------------------------------------------------------------------

    def check_counts(self, body: Mapping[str, Any]) -> None:
        """The caps that need no walk: refused before any per-item work."""
        messages, tools = body.get("messages"), body.get("tools")
        if isinstance(messages, list) and len(messages) > self.limits.max_messages:
            raise too_many("messages", self.limits.max_messages, "too_many_messages")
        if isinstance(tools, list) and len(tools) > self.limits.max_tools:
            raise too_many("tools", self.limits.max_tools, "too_many_tools")
        if _deeper_than(body, self.limits.max_nesting_depth):
            raise _nesting_too_deep(self.limits, "the request")

    def json_text(self, container: Mapping[str, Any], name: str, where: str) -> None:
        """A string member that holds JSON the gateway parses (tool-call arguments): its
        nesting is capped like the body's, since the filters walk it the same way."""
        text = self.string(container, name, where)
        if text is None or text.count("[") + text.count("{") <= self.limits.max_nesting_depth:
            return  # cannot nest deeper than its brackets: no parse needed
        try:
            deep = _deeper_than(json.loads(text), self.limits.max_nesting_depth)
        except RecursionError:
            deep = True
        except ValueError:
            return  # not JSON: read as plain text
        if deep:
            raise _nesting_too_deep(self.limits, f"{where}{name}")

    def blocks(self, count: int) -> None:
        self._blocks += count
        if self._blocks > self.limits.max_content_blocks:
            raise too_many("content blocks", self.limits.max_content_blocks, "too_many_content_blocks")

    # --- typed reads -----------------------------------------------------------------

    @staticmethod
    def object(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise wrong_type(where, "an object", value)
        return value

    @staticmethod
    def optional(container: Mapping[str, Any], name: str, where: str, kinds: type | tuple[type, ...], expected: str) -> Any:
        """The member if present and of ``kinds`` (null counts as absent), else a 400."""
        value = container.get(name)
        if value is None:
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _as_tuple(kinds)):
            raise wrong_type(f"{where}{name}", expected, value)
        return value

    @staticmethod
    def required(container: Mapping[str, Any], name: str, where: str, kinds: type | tuple[type, ...], expected: str) -> Any:
        value = container.get(name)
        if value is None:
            raise GatewayError(ErrorKind.INVALID_REQUEST, f"{where}{name}: field required", code="invalid_request")
        return Walk.optional(container, name, where, kinds, expected)

    def string(self, container: Mapping[str, Any], name: str, where: str, required: bool = False) -> str | None:
        read = self.required if required else self.optional
        return read(container, name, where, str, "a string")

    def number(self, container: Mapping[str, Any], name: str, where: str) -> None:
        self.optional(container, name, where, (int, float), "a number")

    def boolean(self, container: Mapping[str, Any], name: str, where: str) -> None:
        self.optional(container, name, where, bool, "a boolean")

    def mapping(self, container: Mapping[str, Any], name: str, where: str) -> dict[str, Any] | None:
        return self.optional(container, name, where, dict, "an object")

    def array(self, container: Mapping[str, Any], name: str, where: str) -> list[Any] | None:
        return self.optional(container, name, where, list, "an array")

    def strings(self, container: Mapping[str, Any], name: str, where: str, single: bool = False) -> None:
        """An array of strings (or, with ``single``, one string)."""
        value = container.get(name)
        if value is None or (single and isinstance(value, str)):
            return
        expected = "a string or an array of strings" if single else "an array of strings"
        if not isinstance(value, list):
            raise wrong_type(f"{where}{name}", expected, value)
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise wrong_type(f"{where}{name}[{i}]", "a string", item)


def _nesting_too_deep(limits: RequestLimits, what: str) -> GatewayError:
    return GatewayError(ErrorKind.REQUEST_TOO_LARGE, f"{what} nests deeper than this gateway accepts ({limits.max_nesting_depth})", code="nesting_too_deep")


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether containers nest more than ``limit`` levels. Level by level, not recursive
    (a deep body must not exhaust the stack of the check meant to refuse it)."""
    level, depth = [value], 1
    while level:
        if depth > limit:
            return True
        below: list[Any] = []
        for node in level:
            below.extend(child for child in (node.values() if isinstance(node, dict) else node) if isinstance(child, dict | list))
        level, depth = below, depth + 1
    return False
