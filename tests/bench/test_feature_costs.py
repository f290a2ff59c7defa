"""The benchmark's feature costs against a server that does not offer every feature."""

from __future__ import annotations

from typing import Any

import pytest
import requests

import phi_api.bench as bench
from phi_api.bench.client import StreamResult
from phi_api.bench.report import print_report


def _refusing_json_schema(calls: list[dict[str, Any]]):
    def stream(url: str, body: dict[str, Any], session: Any = None, path: str = "") -> StreamResult:
        calls.append(body)
        if "response_format" in body:
            response = requests.Response()
            response.status_code = 400
            raise requests.HTTPError(response=response)
        rate = 50.0 if "logprobs" in body else 100.0
        return StreamResult(ttft=0.1, tokens=101, decode_seconds=100 / rate)
    return stream


def test_a_refused_feature_is_reported_and_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(bench, "stream_completion", _refusing_json_schema(calls))
    costs = bench.measure_feature_costs(bench.Target("other", "http://x", "m"), 16, runs=3)
    assert costs["json_schema grammar"] == {"refused": "HTTP 400"}
    assert sum("response_format" in body for body in calls) == 1
    assert costs["plain"]["decode_tokens_per_s"] == pytest.approx(100.0)
    assert costs["logprobs (top 5)"]["ratio_to_plain"] == pytest.approx(0.5)


def test_the_report_names_a_refused_feature(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench, "stream_completion", _refusing_json_schema([]))
    costs = bench.measure_feature_costs(bench.Target("other", "http://x", "m"), 16, runs=1)
    level = {"aggregate_tokens_per_s": 1.0, "per_stream_decode_tokens_per_s": 1.0, "ttft_p50_s": 0.1,
             "ttft_p95_s": 0.1}
    results = {"single_stream": {"ttft_s": 0.1, "decode_tokens_per_s": 100.0},
               "concurrency": {"levels": {1: level}, "models_latency_under_load_p50_s": 0.01,
                               "models_latency_under_load_p95_s": 0.02, "models_latency_samples": 3},
               "head_of_line": {"idle_ttft_s": 0.1, "busy_ttft_s": 0.2, "ratio": 2.0},
               "feature_costs": costs}
    print_report({"targets": {"other": results}})
    out = capsys.readouterr().out
    assert "json_schema grammar refused (HTTP 400)" in out
    assert "logprobs (top 5) 50 (0.50x)" in out
