"""Stop strings and UTF-8: what the client may see, and when."""

from __future__ import annotations

import pytest

from phi_api.engine.text import StopMatcher, TextAssembler


def feed_all(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    released = []
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        released.append(text)
        if stopped:
            return "".join(released), True
    return "".join(released) + matcher.flush(), False


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
    released = [matcher.feed(piece)[0] for piece in ["Hi", " <|", "en"]]
    assert released == ["Hi", " ", ""]
    assert matcher.feed("d|> tail") == ("", True)


class Pieces:
    """A decoder that returns fixed byte pieces per token."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def decode(self, token: int) -> bytes:
        return self.pieces[token]


def assemble(pieces: list[bytes], stops=()) -> list[str]:
    assembler = TextAssembler(Pieces(pieces), stops)
    out = [assembler.add(index)[0] for index in range(len(pieces))]
    return out + [assembler.finish()]


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
    data = "ok😀".encode("utf-8")
    assert "".join(assemble([data[:2], data[2:4]])) == "ok"


def test_stop_string_made_of_multibyte_text():
    pieces = ["가나".encode(), "다".encode()[:1], "다".encode()[1:], "라".encode()]
    assembler = TextAssembler(Pieces(pieces), ("다라",))
    released = [assembler.add(i) for i in range(len(pieces))]
    assert "".join(text for text, _ in released) == "가나"
    assert released[-1][1] is True
