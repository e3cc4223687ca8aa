"""``POST /v1/responses/input_tokens`` with the openai SDK's ``responses.input_tokens.count``:
the count operation as for Anthropic's count_tokens — the same checks as inference,
forwarded to a Responses provider, estimated (and labelled so) for any other, never billed."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.bundles import TENANTS, deep_copy, write_bundle
from tests.conftest import Fakes, GatewayProcess
from tests.test_served_openai_responses import CODEX, CODEX_UPSTREAM, _catalog, _gateway

pytestmark = pytest.mark.served


@pytest.fixture(scope="module")
def counting(tmp_path_factory: pytest.TempPathFactory, session_fakes: Fakes) -> Iterator[GatewayProcess]:
    directory = tmp_path_factory.mktemp("responses-counts")
    running = _gateway(directory, session_fakes, write_bundle(directory / "bundle", deep_copy(TENANTS), _catalog()))
    yield running
    running.stop()


def _client(gateway: GatewayProcess, team: str = "eng") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.key(team), max_retries=0)


def test_a_responses_provider_counts_the_input(counting: GatewayProcess, fakes: Fakes) -> None:
    raw = _client(counting).responses.input_tokens.with_raw_response.count(model=CODEX, instructions="Be brief.", input="Hello there")
    counted = raw.parse()
    assert counted.input_tokens > 0 and raw.headers["x-portcullis-token-count"] == "provider"
    (sent,) = [r for r in fakes.openai_main.received if r.path == "/v1/responses/input_tokens"]
    assert sent.json["model"] == CODEX_UPSTREAM and sent.json["input"] == "Hello there"
    assert not [r for r in fakes.openai_main.received if r.path == "/v1/responses"]  # a count, not a generation


def test_another_provider_gets_a_labelled_estimate_and_nothing_is_billed(counting: GatewayProcess, fakes: Fakes) -> None:
    raw = _client(counting).responses.input_tokens.with_raw_response.count(model="claude-sonnet-4-5", input="Hello there")
    assert raw.parse().input_tokens > 0 and raw.headers["x-portcullis-token-count"] == "estimate"
    assert fakes.anthropic_us.received == [] and fakes.openai_main.received == []
    outcome = counting.outcome(raw.headers["x-portcullis-request-id"])
    assert outcome["event"] == "tokens_counted" and outcome["count"] == "estimate" and "cost_micro_usd" not in outcome


def test_a_count_is_refused_like_inference(counting: GatewayProcess) -> None:
    with pytest.raises(openai.NotFoundError):
        _client(counting).responses.input_tokens.count(model="no-such-model", input="Hello")
    with pytest.raises(openai.BadRequestError) as stored:
        _client(counting).responses.input_tokens.count(model=CODEX, input="Hello", previous_response_id="resp_1")
    assert "previous_response_id" in str(stored.value)
