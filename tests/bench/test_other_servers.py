"""The benchmark against other servers: features they refuse, fields they do not know, failures."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from phi_api.bench import probes, serving
from phi_api.bench.client import StreamResult
from phi_api.bench.common import Target
from phi_api.bench.report import print_report


def _results() -> dict[str, Any]:
    level = {"aggregate_tokens_per_s": 1.0, "per_stream_decode_tokens_per_s": 1.0, "ttft_p50_s": 0.1,
             "ttft_p95_s": 0.1}
    return {"single_stream": {"ttft_s": 0.1, "decode_tokens_per_s": 100.0},
            "concurrency": {"levels": {1: level}, "models_latency_under_load_p50_s": 0.01,
                            "models_latency_under_load_p95_s": 0.02, "models_latency_samples": 3},
            "head_of_line": {"idle_ttft_s": 0.1, "busy_ttft_s": 0.2, "ratio": 2.0}}


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
    monkeypatch.setattr(probes, "stream_completion", _refusing_json_schema(calls))
    costs = probes.measure_feature_costs(Target("other", "http://x", "m"), 16, runs=3)
    assert costs["json_schema grammar"] == {"refused": "HTTP 400"}
    assert sum("response_format" in body for body in calls) == 1
    assert costs["plain"]["decode_tokens_per_s"] == pytest.approx(100.0)
    assert costs["logprobs (top 5)"]["ratio_to_plain"] == pytest.approx(0.5)


def test_the_report_names_a_refused_feature(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(probes, "stream_completion", _refusing_json_schema([]))
    costs = probes.measure_feature_costs(Target("other", "http://x", "m"), 16, runs=1)
    results = {**_results(), "feature_costs": costs}
    print_report({"targets": {"other": results}})
    out = capsys.readouterr().out
    assert "json_schema grammar refused (HTTP 400)" in out
    assert "logprobs (top 5) 50 (0.50x)" in out


@pytest.mark.parametrize(("other", "expected"), [
    (False, {"ignore_eos": True}),
    (True, {"ignore_eos": True, "min_tokens": 64}),  # llama-cpp-python knows min_tokens, not ignore_eos
])
def test_every_server_is_asked_for_full_length_answers(other: bool, expected: dict[str, Any]) -> None:
    assert Target("t", "http://x", "m", other=other).full_length(64) == expected


def test_a_server_that_fails_is_reported_and_the_others_are_kept(monkeypatch: pytest.MonkeyPatch, tmp_path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def measure(target: Target, *args: Any) -> dict[str, Any]:
        if target.other:
            raise RuntimeError(f"{target.url} streamed no text")
        return _results()

    monkeypatch.setattr(serving, "first_model", lambda url: "m")
    monkeypatch.setattr(serving, "measure_target", measure)
    options = type("Options", (), {"concurrency": "1", "runs": 1, "max_tokens": 8, "model_path": None,
                                   "url": "http://phi", "server": [], "compare": ["other=http://other"],
                                   "memory": False, "out": str(tmp_path)})()
    report = serving.run(options)
    assert report["targets"]["phi-api"] == _results()
    assert report["targets"]["other"] == {"failed": "RuntimeError: http://other streamed no text"}
    assert "failed: RuntimeError: http://other streamed no text" in capsys.readouterr().out
    assert (tmp_path / "bench.json").exists() and (tmp_path / "bench.png").exists()


def test_the_models_probe_counts_a_server_that_does_not_answer() -> None:
    from phi_api.bench.client import LatencyProbe
    from tests.support.server import free_port, wait_until

    with LatencyProbe(f"http://127.0.0.1:{free_port()}") as probe:  # nothing listens there
        wait_until(lambda: probe.failures >= 2, timeout=10, message="two failed polls")
    assert len(probe.latencies) >= probe.failures >= 2


def test_one_stream_is_paired_with_the_raw_run_before_it() -> None:
    from types import SimpleNamespace

    def raw(rate: float, prefill: float) -> dict[int, Any]:
        one_thread = SimpleNamespace(decode_rate=1.0, prefill_seconds=9.0)  # never the reference
        return {1: one_thread, 2: SimpleNamespace(decode_rate=rate, prefill_seconds=prefill)}

    results = [StreamResult(ttft=0.30, tokens=101, decode_seconds=1.0),   # 100 tok/s
               StreamResult(ttft=0.25, tokens=101, decode_seconds=2.0),   # 50 tok/s, while the machine was slow
               StreamResult(ttft=0.21, tokens=101, decode_seconds=0.5)]   # 200 tok/s
    paired = serving.paired_ratios(results, [raw(100, 0.2), raw(50, 0.2), raw(250, 0.2)])
    assert paired["decode_ratio"] == pytest.approx(1.0)  # ratios 1.0, 1.0, 0.8
    assert paired["ttft_delta_s"] == pytest.approx(0.05)


def test_the_models_probe_runs_during_a_batch_of_its_own_not_the_measured_ones(monkeypatch) -> None:
    # Polling /v1/models takes CPU from the engine, and the ceiling the batches are set against runs without it.
    from phi_api.bench.client import LoadResult

    probing: list[bool] = []
    batches: list[tuple[int, bool]] = []

    class FakeProbe:
        def __init__(self) -> None:
            self.latencies, self.failures = [0.01, 0.02], 0

        def __enter__(self) -> FakeProbe:
            probing.append(True)
            return self

        def __exit__(self, *exc_info: Any) -> None:
            probing.pop()

    def streams(url: str, body: dict[str, Any], concurrency: int) -> LoadResult:
        batches.append((concurrency, bool(probing)))
        return LoadResult(concurrency, [StreamResult(ttft=0.1, tokens=11, decode_seconds=0.1)], 1.0)

    monkeypatch.setattr(serving, "LatencyProbe", lambda url: FakeProbe())
    monkeypatch.setattr(serving, "concurrent_streams", streams)
    result = serving.measure_concurrency(Target("phi-api", "http://x", "m"), [1, 4], 8, runs=2, raw=None)
    assert batches == [(1, False), (1, False), (4, False), (4, False), (4, True)]
    assert result["models_latency_samples"] == 2
