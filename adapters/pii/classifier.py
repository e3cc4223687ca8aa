"""The classifier detector: a model asked to point out personal data that patterns and
NER miss ("my manager's salary", a name in Korean).

It is a billable call the gateway makes on the request's behalf, so it follows the
main call's contract (seed §2.2): its bound is reserved on the request's counters
before it is sent — a refusal refuses the request — and its usage is settled after;
a later refusal of the main call does not refund it. It reads raw text, so the plan
only ever names an internal target for it (the policy decides which model).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from portcullis.adapters.pii.detectors import DetectorFailed
from portcullis.adapters.protocols import registry
from portcullis.adapters.protocols.interfaces import Wire, WireProtocol
from portcullis.adapters.providers import Provider, UpstreamUnreachable
from portcullis.adapters.providers.keys import KeyPool
from portcullis.adapters.store import StoreUnavailable
from portcullis.engine.governance import bound_for
from portcullis.engine.pii.recognizers import Finding
from portcullis.engine.pricing import Usage

if TYPE_CHECKING:
    from portcullis.adapters.gateway import Exchange
    from portcullis.adapters.governance import Governance

log = logging.getLogger("portcullis.pii")

SUBCALL = "pii_classifier"
MAX_ANSWER_BYTES = 1024 * 1024
INSTRUCTIONS = (
    "You find personal data in texts for a data-protection filter. The user message is a JSON array of texts. "
    'Answer with one JSON object and nothing else: {"findings": [{"text": <index of the text>, "type": <type>, '
    '"value": <the exact characters as they appear in that text>}]}. Report only these types: {types}. '
    'Report nothing that is not personal data. With nothing to report, answer {"findings": []}.'
)
_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


class ClassifierDetector:
    name = "classifier"

    def __init__(self, providers: Mapping[str, Provider], pools: Mapping[str, KeyPool], governance: Governance) -> None:
        self._providers = providers
        self._pools = pools
        self._governance = governance

    async def detect(self, texts: Sequence[str], entities: Collection[str], exchange: Exchange) -> list[list[Finding]]:
        assert exchange.plan is not None and exchange.plan.pii is not None and exchange.bundle is not None
        target = exchange.plan.pii.classifier
        if target is None:
            raise DetectorFailed("the policy names no internal target for the classifier")
        protocol = registry.protocol(self._providers[target.provider].protocol or registry.DEFAULT_UPSTREAM)
        max_output = exchange.plan.pii.classifier_max_output_tokens
        body = _request(protocol.wire, target.model, sorted(entities), list(texts), max_output)
        price = exchange.bundle.price_for(target, exchange.day)
        bound = bound_for([(len(body) + 64, max_output, price)], "upper-bound:utf8-bytes")  # bytes bound tokens from above
        reservation = await self._governance.reserve_subcall(exchange, SUBCALL, bound)  # a refusal refuses the request
        call = _Call()
        try:
            answer = await self._call(call, protocol, target.provider, body, bound.tokens)
            return _findings(answer, texts, entities)
        finally:
            if reservation is not None:
                cost = price.cost(call.usage) if call.usage is not None else 0
                await self._governance.settle_subcall(reservation, call.usage, cost, target if call.served else None)

    async def _call(self, call: _Call, protocol: WireProtocol, provider: str, body: bytes, tokens: int) -> str:
        try:
            key, _ = await self._pools[provider].take(tokens)
        except StoreUnavailable:
            raise DetectorFailed("the classifier's provider capacity cannot be checked") from None
        if key is None:
            raise DetectorFailed("the classifier's provider has no capacity")
        headers = protocol.wire.upstream_headers(key.secret, {})
        try:
            upstream = await self._providers[provider].send(protocol.wire.UPSTREAM_PATH, "", headers, body)
            call.served = upstream.status < 300  # from here the provider may have done (and billed) the work
            try:
                raw = await upstream.read(MAX_ANSWER_BYTES)
            finally:
                upstream.release()
        except UpstreamUnreachable as failure:
            raise DetectorFailed(f"the classifier is unreachable ({failure.reason})") from None
        if upstream.status >= 300:
            raise DetectorFailed(f"the classifier answered status {upstream.status}")
        try:
            document = json.loads(raw)
        except ValueError:
            raise DetectorFailed("the classifier's answer is not JSON") from None
        call.usage = protocol.wire.usage_of(document) if isinstance(document, dict) else None
        return _answer_text(protocol.wire, document)


@dataclass
class _Call:
    served: bool = False
    usage: Usage | None = None


def _request(wire: Wire, model: str, types: list[str], texts: list[str], max_output: int) -> bytes:
    instructions = INSTRUCTIONS.replace("{types}", ", ".join(types))
    content = json.dumps(texts, ensure_ascii=False)
    return json.dumps(wire.compose(model, instructions, content, max_output), ensure_ascii=False).encode()


def _answer_text(wire: Wire, document: Any) -> str:
    try:
        return wire.answer_text(document)
    except ValueError:
        raise DetectorFailed("the classifier's answer has an unexpected shape") from None


def _findings(answer: str, texts: Sequence[str], entities: Collection[str]) -> list[list[Finding]]:
    """Every occurrence of each value the model reported, in the text it named. A
    value that is not in that text is ignored: the model may only point, not invent."""
    match = _OBJECT.search(answer)
    try:
        reported = json.loads(match.group())["findings"] if match else None
    except (ValueError, KeyError, TypeError):
        reported = None
    if not isinstance(reported, list):
        raise DetectorFailed("the classifier's answer has no findings list")
    found: list[list[Finding]] = [[] for _ in texts]
    for item in reported:
        if not isinstance(item, dict):
            continue
        index, entity, value = item.get("text"), item.get("type"), item.get("value")
        if not (isinstance(index, int) and 0 <= index < len(texts) and entity in entities and isinstance(value, str) and value.strip()):
            continue
        for occurrence in re.finditer(re.escape(value), texts[index]):
            found[index].append(Finding(entity, occurrence.start(), occurrence.end(), 0.9, "classifier"))
    return found
