"""A batch input file's lines, read in chunks: a line longer than a request body may be is dropped as it arrives,
never held whole nor decoded, and reported as a bad line."""

from __future__ import annotations

import tracemalloc

import pytest

from phi_api.storage.batch_input import numbered_lines, read_requests


def test_a_line_past_the_bound_comes_as_none_and_the_others_keep_their_numbers():
    data = b'{"a": 1}\r\n' + b"y" * 50 + b"\n12345\r\n\n" + b"z" * 7
    chunks = [data[start:start + 3] for start in range(0, len(data), 3)]  # lines span chunks
    assert list(numbered_lines(chunks, longest=8)) == [(1, '{"a": 1}'), (2, None), (3, "12345"), (4, ""), (5, "z" * 7)]
    assert list(numbered_lines([b"x" * 9], longest=8)) == [(1, None)]  # the last line, without its "\n"
    assert [text for _, text in numbered_lines(chunks)] == ['{"a": 1}', "y" * 50, "12345", "", "z" * 7]


def test_a_line_past_the_bound_is_never_held_whole():
    chunks = (b"x" * 2**20 for _ in range(32))  # one line of 32 MB, 1 MB at a time
    tracemalloc.start()
    try:
        assert list(numbered_lines(chunks, longest=4096)) == [(1, None)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 2**20  # a chunk or two at a time, not the line


def test_a_line_too_long_to_read_is_a_bad_line_of_the_file():
    errors: list = []
    assert list(read_requests([(1, None)], errors)) == []
    assert [(error["code"], error["line"], error["param"]) for error in errors] == [("invalid_json_line", 1, None)]
    assert "MAX_REQUEST_SIZE_MB" in errors[0]["message"]


@pytest.mark.parametrize("body,why", [
    ('{"temperature": NaN}', "not finite"), ('{"presence_penalty": -Infinity}', "not finite"),
    ('{"temperature": 1e999}', "not finite"), ('{"messages": [{"content": "a\\ud800b"}]}', "lone surrogate"),
    ('{"messages": [{"content": "a\\u0000b"}]}', "NUL"),
])
def test_a_line_is_as_strict_as_a_request_s_body(body, why):
    """What a live request may not send (web.bodies), a batch line may not: a NaN reached the sampler (a 500), a lone
    surrogate failed the database's insert (a 500 at the batch's creation), and a NUL reached the engine."""
    good = '{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}'
    bad = good.replace('"a"', '"b"').replace('{"model": "m"}', body)
    errors: list = []
    assert [request.custom_id for request in read_requests([(1, good), (2, bad)], errors)] == ["a"]
    assert [(error["code"], error["line"]) for error in errors] == [("invalid_json_line", 2)]
    assert why in errors[0]["message"]
    escaped = good.replace('{"model": "m"}', '{"model": "m", "text": "\\\\u0000 and \\\\ud800 as written"}')
    assert [request.custom_id for request in read_requests([(1, escaped)], [])] == ["a"]  # escaped backslashes: text
