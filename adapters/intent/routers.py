"""The active bundle's intent routers, read once per bundle (its keyword sets compiled
once), for the fact sources that gather only for requests a router covers."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from portcullis.engine.intent_routers import IntentRouters, canonical

if TYPE_CHECKING:
    from portcullis.adapters.pipeline import Exchange
    from portcullis.engine.activation import ActiveBundle

KEPT_BUNDLES = 4  # a reload leaves requests on the old bundle for a while, no longer


class BundleRouters:
    def __init__(self) -> None:
        self._by_digest: OrderedDict[str, IntentRouters] = OrderedDict()

    def of(self, bundle: ActiveBundle) -> IntentRouters:
        routers = self._by_digest.get(bundle.digest)
        if routers is None:
            routers = IntentRouters.from_data((bundle.bundle.data.get("portcullis") or {}).get("intent"))
            self._by_digest[bundle.digest] = routers
            while len(self._by_digest) > KEPT_BUNDLES:
                self._by_digest.popitem(last=False)
        return routers

    def covering(self, exchange: Exchange) -> tuple[IntentRouters, Mapping[str, Any]] | None:
        """The bundle's routers and the one covering this request, or None."""
        bundle, principal, request = exchange.bundle, exchange.principal, exchange.request
        if bundle is None or principal is None or request is None:
            return None
        routers = self.of(bundle)
        if not routers.routers:
            return None
        router = routers.router_for(principal.team, canonical(bundle.catalog, request.model))
        return (routers, router) if router is not None else None
