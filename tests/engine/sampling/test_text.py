"""Stop strings and UTF-8: what the client may see, and when."""

from __future__ import annotations

import pytest

from phi_api.engine.sampling.text import Piece, StopMatcher, TextAssembler


def text_of(pieces: list[Piece]) -> str:
    return "".join(piece.text for piece in pieces)


def feed_all(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    released = []
    for piece in pieces:
        out, stopped = matcher.feed(Piece(piece))
        released += out
        if stopped:
            return text_of(released), True
    return text_of(released + matcher.flush()), False


@pytest.mark.parametrize(
    ("pieces", "stops", "expected", "stopped"),
    [
        (["Hello", " world"], (), "Hello world", False),
        (["Hello", " wor", "ld"], ("world",), "Hello ", True),
        (["a", "b", "c", "END", "more"], ("END",), "abc", True),
        (["xx", "E", "N", "D"], ("END",), "xx", True),
        (["ab", "E", "N"], ("END",), "abEN", False),  # ends while held back: released by flush
        (["one, two"], (",", "two"), "one", True),  # earliest stop wins
        (["find the needle"], ("needle", "the"), "find ", True),
        (["abc"], ("bcd",), "abc", False),
    ],
)
def test_stop_matcher_cuts_before_the_first_stop_string(pieces, stops, expected, stopped):
    assert feed_all(StopMatcher(stops), pieces) == (expected, stopped)


def test_stop_matcher_never_releases_a_possible_stop_prefix():
    matcher = StopMatcher(("<|end|>",))
    released = [text_of(matcher.feed(Piece(piece))[0]) for piece in ["Hi", " <|", "en"]]
    assert released == ["Hi", "", ""]  # pieces go out whole: " <|" waits with its possible stop prefix
    assert matcher.feed(Piece("d|> tail")) == ([Piece(" ")], True)


def test_records_travel_with_their_text_and_are_cut_with_it():
    matcher = StopMatcher(("END",))
    first, _ = matcher.feed(Piece("ab", "r1"))
    second, _ = matcher.feed(Piece("cE", "r2"))
    third, stopped = matcher.feed(Piece("ND!", "r3"))
    assert first == [Piece("ab", "r1")] and second == []
    assert stopped and third == [Piece("c", "r2")]  # r3 only made the stop string: dropped


class Pieces:
    """A decoder that returns fixed byte pieces per token."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def decode(self, token: int) -> bytes:
        return self.pieces[token]


def assemble(pieces: list[bytes], stops=()) -> list[str]:
    assembler = TextAssembler(Pieces(pieces), stops)
    out = [text_of(assembler.add(index)[0]) for index in range(len(pieces))]
    return out + [text_of(assembler.finish())]


def test_multibyte_characters_split_across_tokens_come_out_whole():
    text = "안녕 😀👍🏽"
    data = text.encode("utf-8")
    pieces = [data[i:i + 1] for i in range(len(data))]  # one byte per token: worst case
    out = assemble(pieces)
    assert "".join(out) == text
    assert all("\ufffd" not in chunk for chunk in out)
    for chunk in out:
        chunk.encode("utf-8")  # every chunk is whole text on its own


def test_a_character_cut_by_the_end_of_generation_is_dropped_not_replaced():
    data = "ok😀".encode()
    assert "".join(assemble([data[:2], data[2:4]])) == "ok"


def test_stop_string_made_of_multibyte_text():
    pieces = ["가나".encode(), "다".encode()[:1], "다".encode()[1:], "라".encode()]
    assembler = TextAssembler(Pieces(pieces), ("다라",))
    released = [assembler.add(i) for i in range(len(pieces))]
    assert "".join(text_of(out) for out, _ in released) == "가나"
    assert released[-1][1] is True
