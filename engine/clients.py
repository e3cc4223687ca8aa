"""Which client sent a request, as a small closed set of names read from its
User-Agent. The routing layers may route by it (an agent's loop is not a chat), and the
decision cache keys on it, so it is an enum, never the header itself (which carries
versions, platforms and whatever a client likes).

How each client identifies itself (measured against the real programs):

- Claude Code: ``claude-cli/2.1.x (external, cli)``
- Codex CLI: ``codex_exec/0.171.0 (...)`` for ``codex exec``, ``codex_cli_rs/...`` interactive
- opencode: a User-Agent naming ``opencode``
- the anthropic SDKs: ``Anthropic/Python 0.x`` / ``Anthropic/JS ...``
- the openai SDKs: ``OpenAI/Python 1.x`` / ``OpenAI/JS ...``
- boto3 / botocore: ``Boto3/1.x md/Botocore#1.x ...`` (``Botocore/...`` alone from botocore)

The agents come first: an agent built on an SDK may name both."""

from __future__ import annotations

CLIENTS = ("claude-code", "codex", "opencode", "anthropic-sdk", "openai-sdk", "boto3", "other")

# (client, prefixes or fragments of the lower-cased User-Agent), tried in order
_SIGNATURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("claude-code", ("claude-cli/", "claude-code/")),
    ("codex", ("codex_exec/", "codex_cli_rs/", "codex/")),
    ("opencode", ("opencode",)),
    ("anthropic-sdk", ("anthropic/",)),
    ("openai-sdk", ("openai/",)),
    ("boto3", ("boto3/", "botocore/")),
)
_PREFIX_ONLY = frozenset({"claude-code", "codex", "anthropic-sdk", "openai-sdk", "boto3"})
MAX_USER_AGENT = 512  # read no further: a longer header is still one client or "other"


def client_of(user_agent: str | None) -> str:
    """The client's name in ``CLIENTS``; ``other`` when it is none of them."""
    if not user_agent:
        return "other"
    agent = user_agent[:MAX_USER_AGENT].lower()
    for client, signatures in _SIGNATURES:
        if client in _PREFIX_ONLY:
            if agent.startswith(signatures):
                return client
        elif any(signature in agent for signature in signatures):
            return client
    return "other"
