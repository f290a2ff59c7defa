"""An encoder's pairs as a cross-encoder reads them: the same tokens and types as the tokenizer's own encoding of
the pair, each side read once and cut to the model's length (what a pair holds past it never counts)."""

from __future__ import annotations

import random

import pytest

from phi_api.engine.encoder.tokens import EncoderTokenizer, truncated

WORDS = "the a cat running quickly über naïve 東京 😀 don't x-ray 3.14 C++ [SEP] hello,world".split()


@pytest.fixture(scope="module")
def tokenizers(tiny_embedder):
    from tokenizers import Tokenizer

    whole = Tokenizer.from_file(str(tiny_embedder / "tokenizer.json"))
    whole.no_padding()
    whole.no_truncation()
    return EncoderTokenizer(tiny_embedder), whole


def text(words: int, chooser: random.Random) -> str:
    return " ".join(chooser.choice(WORDS) for _ in range(words))


def test_pairs_are_the_tokenizer_s_own_and_a_cut_pair_the_same_as_the_whole_one_cut(tokenizers):
    ours, whole = tokenizers
    chooser = random.Random(7)
    pairs = [(text(chooser.randint(0, 30), chooser), text(chooser.randint(0, 600), chooser)) for _ in range(60)]
    for made, (query, document) in zip(ours.pairs(pairs, 64), pairs, strict=True):
        expected = whole.encode(query, document)
        if len(expected.ids) <= 64:
            assert made.ids.tolist() == expected.ids and made.types.tolist() == expected.type_ids
        else:  # past the length either way; cut, the same
            assert len(made) > 64
            cut, cut_whole = truncated(made, 64), whole.encode(query, document)
            cut_whole.truncate(64)
            assert cut.ids[:-1].tolist() == cut_whole.ids[:-1] and cut.ids[-1] == expected.ids[-1]
            assert cut.types[:-1].tolist() == cut_whole.type_ids[:-1]


def test_a_long_query_with_many_documents_is_held_to_the_length_on_each_side(tokenizers):
    ours, _ = tokenizers
    query = "word " * 20_000  # 20,000 tokens, asked with each of 2,048 documents
    made = ours.pairs([(query, f"document {index}") for index in range(2048)], 64)
    assert max(len(one) for one in made) <= 64 + 64 + 3  # not 20,000 and more each


def test_a_document_cut_to_its_tokens_keeps_its_whole_query(tokenizers):
    """Cohere's max_tokens_per_doc: the document's first n tokens after the whole query, as the pair of the query
    and the document's first n tokens reads."""
    ours, whole = tokenizers
    chooser = random.Random(11)
    pairs = [(text(12, chooser), text(chooser.randint(1, 40), chooser)) for _ in range(20)]
    for made, (query, document) in zip(ours.pairs(pairs, 512, document_most=8), pairs, strict=True):
        alone = whole.encode(document, add_special_tokens=False)
        alone.truncate(8)
        expected = whole.post_process(whole.encode(query, add_special_tokens=False), alone)
        assert made.ids.tolist() == expected.ids and made.types.tolist() == expected.type_ids
        assert made.ids.tolist()[:len(whole.encode(query).ids)] == whole.encode(query).ids  # the query whole
