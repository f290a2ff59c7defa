"""The client's figures for a batch of concurrent streams."""

from __future__ import annotations

import pytest

from phi_api.bench.client import LoadResult, StreamResult


def _stream(first: float, rate: float, count: int, tokens_per_piece: int = 1) -> StreamResult:
    arrivals = tuple(first + index / rate for index in range(count))
    return StreamResult(ttft=first, tokens=count * tokens_per_piece, decode_seconds=arrivals[-1] - arrivals[0],
                        arrivals=arrivals)


def test_the_steady_rate_counts_only_the_time_every_stream_decodes():
    # While the server works on b's prompt (0 to 1 s), a gets 5 pieces; then both get 40 pieces/s until 2 s.
    during_prompt = tuple(index / 5 for index in range(5))
    together = tuple(1.0 + (index + 1) / 40 for index in range(40))
    a = StreamResult(ttft=0.0, tokens=45, decode_seconds=together[-1], arrivals=during_prompt + together)
    b = _stream(first=1.0, rate=40, count=41)  # 1.0 .. 2.0
    batch = LoadResult(2, [a, b], wall_seconds=2.0)
    assert batch.steady_rate == pytest.approx(80, rel=0.03)
    assert batch.decode_rate < 65  # a's rate counts the time spent on b's prompt


def test_the_steady_rate_counts_tokens_not_pieces():
    streams = [_stream(first=0.0, rate=50, count=51, tokens_per_piece=2), _stream(first=0.0, rate=50, count=51)]
    assert LoadResult(2, streams, wall_seconds=1.0).steady_rate == pytest.approx(150, rel=0.03)


def test_a_single_stream_s_steady_rate_is_its_decode_rate():
    stream = _stream(first=0.3, rate=120, count=121)
    assert LoadResult(1, [stream], wall_seconds=2.0).steady_rate == pytest.approx(stream.decode_rate)


def test_streams_that_never_decode_together_have_no_steady_rate():
    early, late = _stream(first=0.0, rate=100, count=50), _stream(first=1.0, rate=100, count=50)
    assert LoadResult(2, [early, late], wall_seconds=2.0).steady_rate is None
    assert LoadResult(1, [StreamResult(ttft=0.1, tokens=5, decode_seconds=1.0)], wall_seconds=1.0).steady_rate is None


def test_a_run_s_ratios_pair_its_rates_with_the_raw_stream_and_the_ceiling():
    from phi_api.bench.serving import _ratios

    both = LoadResult(2, [_stream(first=0.0, rate=50, count=51), _stream(first=0.0, rate=50, count=51)], 1.0)
    ratios = _ratios(both, reference=50.0, ceiling=125.0)
    assert ratios["decode_to_raw_single_paired"] == pytest.approx(2.0)
    assert ratios["decode_to_engine_ceiling_paired"] == pytest.approx(0.8)
    assert ratios["steady_to_raw_single_paired"] == pytest.approx(2.0, rel=0.03)
    assert ratios["engine_ceiling_to_raw_single_paired"] == pytest.approx(2.5)
    apart = LoadResult(2, [_stream(first=0.0, rate=100, count=50), _stream(first=1.0, rate=100, count=50)], 2.0)
    assert "steady_to_raw_single_paired" not in _ratios(apart, reference=50.0, ceiling=125.0)
