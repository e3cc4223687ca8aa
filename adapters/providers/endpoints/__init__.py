"""A provider's pool of self-hosted endpoints (vLLM / SGLang pods): where the pods are
(``dns``: resolved from a headless Service and refreshed, or a fixed list), how loaded
each is (``scraper``: their Prometheus metrics) and which one a request goes to
(``pool``: consistent hashing of the conversation's affinity key, overloaded pods
skipped; the decision itself is pure, in ``engine/endpoint_pick.py``)."""
