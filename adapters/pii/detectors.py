"""Detectors: each finds entity types in a batch of texts. ``patterns`` (regex +
checksum, pure, always on) runs inline, or on a worker thread for a large body; the others are optional layers a policy asks
for by name."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Protocol

from portcullis.adapters.offload import off_loop
from portcullis.engine.pii import recognizers
from portcullis.engine.pii.context import MemberValue
from portcullis.engine.pii.recognizers import Finding

if TYPE_CHECKING:
    from portcullis.adapters.pipeline import Exchange


class DetectorFailed(Exception):
    """A detector could not finish; the PII policy's ``on_error`` decides. ``too_large``:
    the request exceeds what the detector takes, which the client can fix."""

    def __init__(self, message: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


class Detector(Protocol):
    name: str

    async def detect(self, texts: Sequence[str], entities: Collection[str], exchange: Exchange) -> list[list[Finding]]:
        """Findings for each text, in the same order."""
        ...


class PatternDetector:
    name = "patterns"

    async def detect(self, texts: Sequence[str], entities: Collection[str], exchange: Exchange) -> list[list[Finding]]:
        wanted = [entity for entity in recognizers.ENTITY_ORDER if entity in entities]
        # overlaps: the policy decides; a member's name is a label (``{"ssn": 412557391}``)
        results = await off_loop(sum(map(len, texts)), _find_each, texts, wanted)  # a large body's scan stays off the event loop
        return recognizers.with_repeats(texts, results)


def _find_each(texts: Sequence[str], wanted: list[str]) -> list[list[Finding]]:
    return [recognizers.find_all(text, wanted, text.member if isinstance(text, MemberValue) else None) if wanted else [] for text in texts]
