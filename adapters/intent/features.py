"""``input.facts.features``: what the intent router reads of a request (see
``engine/intent_features.py``), gathered only for requests a router covers, so a bundle
without routers pays nothing and its decisions cache as before."""

from __future__ import annotations

import logging
from typing import Any

from portcullis.adapters.intent.routers import BundleRouters
from portcullis.adapters.pipeline import Exchange, FactSource
from portcullis.engine.intent_features import features_of

log = logging.getLogger("portcullis.intent")


class FeatureSource(FactSource):
    name = "features"

    def __init__(self, routers: BundleRouters) -> None:
        self._routers = routers

    async def gather(self, exchange: Exchange) -> Any:
        try:
            covered = self._routers.covering(exchange)
            if covered is None:
                return None
            request = exchange.request
            assert request is not None
            return features_of(exchange.conversation(), len(request.tools), len(request.raw), request.client, covered[0].keywords)
        except Exception as error:  # absent, never raised: the policy routes nothing without features
            log.error("request %s: intent features could not be measured: %s", exchange.request_id, type(error).__name__)
            return None
