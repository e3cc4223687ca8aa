"""The classifier detector: a model asked to point out personal data that patterns and
NER miss ("my manager's salary", a name in Korean).

It is a billable call the gateway makes on the request's behalf, so it follows the
main call's contract and goes through the same dispatcher (key capacity, failover,
cool-downs): its bound is reserved on the request's counters
before it is sent — a refusal refuses the request — and its usage is settled after;
a later refusal of the main call does not refund it. It reads raw text, so the plan
only ever names an internal target for it (the policy decides which model).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from portcullis.adapters.dispatch import Dispatcher, DispatchFailed
from portcullis.adapters.pii.detectors import DetectorFailed
from portcullis.adapters.protocols import registry
from portcullis.adapters.protocols.interfaces import Wire
from portcullis.adapters.subcall_answer import ask
from portcullis.engine.governance import bound_for
from portcullis.engine.pii.recognizers import Finding

if TYPE_CHECKING:
    from portcullis.adapters.governance import Governance
    from portcullis.adapters.pipeline import Exchange

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

    def __init__(self, dispatcher: Dispatcher, governance: Governance) -> None:
        self._dispatcher = dispatcher
        self._governance = governance

    async def detect(self, texts: Sequence[str], entities: Collection[str], exchange: Exchange) -> list[list[Finding]]:
        assert exchange.plan is not None and exchange.plan.pii is not None and exchange.bundle is not None
        target = exchange.plan.pii.classifier
        if target is None:
            raise DetectorFailed("the policy names no internal target for the classifier")
        protocol_name = self._dispatcher.protocol_of(target)
        max_output = exchange.plan.pii.classifier_max_output_tokens
        body = _request(registry.protocol(protocol_name).wire, target.model, sorted(entities), list(texts), max_output)
        price = exchange.bundle.price_for(target, exchange.day)
        bound = bound_for([(len(body) + 64, max_output, price)], "upper-bound:utf8-bytes")  # bytes bound tokens from above
        reservation = await self._governance.reserve_subcall(exchange, SUBCALL, bound)  # a refusal refuses the request
        call = (exchange.request_id, protocol_name, (target,), body, bound.tokens)
        try:
            answer = await ask(self._dispatcher, self._governance, reservation, price, call, MAX_ANSWER_BYTES, _answer_text)
        except DispatchFailed as failed:
            raise DetectorFailed(f"the classifier could not be called ({failed.error.code or 'no answer'})") from None
        except ValueError:
            raise DetectorFailed("the classifier's answer is not JSON") from None
        return _findings(answer, texts, entities)


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
