"""The metrics parser: what vLLM and SGLang expose is read, anything else is skipped by
its name, and a body that is malformed where it matters, or too big, is refused."""

from __future__ import annotations

import time

import pytest

from portcullis.engine.pod_load import MAX_BYTES, MetricsError, PodLoad, parse_load

VLLM = b"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.42
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.61
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="Qwen/Qwen3-8B"} 5
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="Qwen/Qwen3-8B"} 9
python_gc_objects_collected_total{generation="0"} 1234.0
"""


def test_vllm_queue_adds_up_and_the_fullest_cache_counts() -> None:
    assert parse_load(VLLM) == PodLoad(waiting=5.0, kv_cache_fraction=0.61)


def test_the_older_vllm_name_and_sglang_are_read() -> None:
    assert parse_load(b'vllm:gpu_cache_usage_perc{model_name="m"} 0.93\nvllm:num_requests_waiting 0\n') == PodLoad(0.0, 0.93)
    assert parse_load(b'sglang:num_queue_reqs{model_name="m"} 7\nsglang:token_usage{model_name="m"} 0.5 1700000000000\n') == PodLoad(7.0, 0.5)


def test_a_pod_that_reports_none_of_them_has_an_unknown_load() -> None:
    assert parse_load(b"# nothing here\nprocess_cpu_seconds_total 3.2\n") == PodLoad(None, None)
    assert parse_load(b"") == PodLoad(None, None)
    assert parse_load(b"vllm:num_requests_waiting NaN\n") == PodLoad(None, None)


def test_labels_may_hold_quoted_braces_spaces_commas_and_escapes() -> None:
    body = b'vllm:num_requests_waiting{model_name="a} b, \\"c\\"\\\\",engine="0",} 4\n'
    assert parse_load(body).waiting == 4.0


@pytest.mark.parametrize(
    "body",
    [
        b'vllm:num_requests_waiting{model_name="m"}\n',  # no value
        b'vllm:num_requests_waiting{model_name="m" 3\n',  # unclosed labels
        b"vllm:num_requests_waiting{model_name=m} 3\n",  # unquoted label value
        b'vllm:num_requests_waiting{="m"} 3\n',  # no label name
        b"vllm:num_requests_waiting three\n",
        b"vllm:num_requests_waiting 3 4 5\n",  # too many fields
        b"vllm:num_requests_waiting 3 soon\n",  # timestamp not a number
        b'vllm:num_requests_waiting{model_name="m"}3\n',  # no space before the value
        b"vllm:num_requests_waiting -1\n",
        b"vllm:num_requests_waiting +Inf\n",
        b"vllm:kv_cache_usage_perc 93\n",  # a percentage, not the fraction vLLM reports
        b'{model_name="m"} 3\n',  # no metric name
        b"\xff\xfe not utf-8\n",
    ],
)
def test_malformed_input_is_refused(body: bytes) -> None:
    with pytest.raises(MetricsError):
        parse_load(body)


def test_an_unknown_metric_is_skipped_by_its_name_whatever_follows() -> None:
    assert parse_load(b"some_histogram{weird label syntax here 3 4 5\nvllm:num_requests_waiting 2\n").waiting == 2.0


def test_a_huge_body_is_refused_before_it_is_read() -> None:
    body = b"x_metric 1\n" * (MAX_BYTES // 10)
    assert len(body) > MAX_BYTES
    started = time.perf_counter()
    with pytest.raises(MetricsError, match="over"):
        parse_load(body)
    assert time.perf_counter() - started < 0.05


def test_a_huge_line_is_refused_and_a_full_size_body_parses_quickly() -> None:
    with pytest.raises(MetricsError, match="line 1"):
        parse_load(b'vllm:num_requests_waiting{model_name="' + b"a" * 70_000 + b'"} 1\n')
    filler = b'vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="Qwen/Qwen3-8B"} 5\n'
    body = filler * ((MAX_BYTES - 200) // len(filler)) + b"vllm:num_requests_waiting 9\n"
    started = time.perf_counter()
    assert parse_load(body).waiting == 9.0
    assert time.perf_counter() - started < 0.5  # a 1 MiB exposition, read on the scraper's loop
