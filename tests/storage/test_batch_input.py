"""A batch input file's lines, read in chunks: a line longer than a request body may be is dropped as it arrives,
never held whole nor decoded, and reported as a bad line."""

from __future__ import annotations

import tracemalloc

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
