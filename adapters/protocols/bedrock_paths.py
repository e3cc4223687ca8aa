"""Bedrock Runtime's paths: ``/model/{modelId}/{action}``, the model and the operation
(and so whether it streams) named in the path, never the body. Converse and InvokeModel
read the route's path and write the upstream one alike, so both do it here."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import quote

from portcullis.adapters.protocols.jsonbody import invalid

MAX_MODEL_ID = 2048  # Bedrock's own limit on a modelId (ids, ARNs, inference profiles)


def path_model(path: Mapping[str, str]) -> str:
    """The model id (or ARN) the route's path names, refused when empty, too long or not text."""
    model = path.get("model") or ""
    if not model:
        raise invalid("modelId: the path names no model")
    if len(model) > MAX_MODEL_ID:
        raise invalid(f"modelId: longer than {MAX_MODEL_ID} characters")
    if not model.isprintable():
        raise invalid("modelId: contains characters no model id has")
    return model


def model_path(model: str, action: str) -> str:
    # Ids, ARNs and inference profiles alike: ':' and '/' are encoded so the id stays one segment.
    return f"/model/{quote(model, safe='')}/{action}"
