"""An encoder's tokenizer (Hugging Face ``tokenizers``: ONNX Runtime GenAI tokenizes for generators only): texts,
and query-document pairs with their token types, exactly as the model was trained to read them; never padded or cut
here (a folder's ``tokenizer.json`` may ask for both: the batcher pads, and only a request that says so is cut)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Tokens:
    """One input of an encoder: its token ids and (for pairs) their types."""

    ids: np.ndarray  # int64
    types: np.ndarray | None = None  # int64, as long as ids; None: all zeros

    def __len__(self) -> int:
        return len(self.ids)


class EncoderTokenizer:
    """The folder's ``tokenizer.json``, with its padding and truncation turned off."""

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)

    def texts(self, texts: list[str]) -> list[Tokens]:
        """Each text's tokens, special tokens included (``[CLS] text [SEP]`` for BERT)."""
        return [Tokens(np.asarray(one.ids, dtype=np.int64)) for one in self._tokenizer.encode_batch(texts)]

    def pairs(self, pairs: list[tuple[str, str]], most: int | None = None,
              document_most: int | None = None) -> list[Tokens]:
        """Each (query, document) pair's tokens and types, as a cross-encoder reads them (each side tokenized
        alone, then the two joined with the special tokens, as ``encode`` does a pair), each side cut to ``most``
        tokens (None: not cut): a pair is held to ``most`` (the model's length) afterwards, and what either side
        holds past it can neither stay in a cut pair nor make a pair fit. ``document_most``: each document cut to
        that many tokens, its query kept (Cohere's ``max_tokens_per_doc``). A query asked with many documents is
        tokenized once, not once with each (a long query and 2,048 documents were tens of millions of tokens)."""
        queries = list(dict.fromkeys(query for query, _ in pairs))
        sides = dict(zip(queries, self._tokenizer.encode_batch(queries, add_special_tokens=False), strict=True))
        documents = self._tokenizer.encode_batch([document for _, document in pairs], add_special_tokens=False)
        if most is not None:
            for side in (*sides.values(), *documents):
                side.truncate(most)
        if document_most is not None:
            for document in documents:
                document.truncate(document_most)
        joined = [self._tokenizer.post_process(sides[query], document)
                  for (query, _), document in zip(pairs, documents, strict=True)]
        return [Tokens(np.asarray(one.ids, dtype=np.int64), np.asarray(one.type_ids, dtype=np.int64))
                for one in joined]

    def ids(self, ids: list[int]) -> Tokens:
        """Token ids a client gave (OpenAI's embeddings take them), as they are: no special tokens added."""
        return Tokens(np.asarray(ids, dtype=np.int64))


def truncated(tokens: Tokens, most: int) -> Tokens:
    """``tokens`` cut to ``most``, keeping the last special token where the first was (``[CLS] ... [SEP]``)."""
    if len(tokens) <= most:
        return tokens
    keep = np.concatenate([tokens.ids[:most - 1], tokens.ids[-1:]])
    types = None if tokens.types is None else np.concatenate([tokens.types[:most - 1], tokens.types[-1:]])
    return Tokens(keep, types)
