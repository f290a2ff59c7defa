"""Constrained output: each guided sequence's token mask, from llguidance (the library ONNX Runtime GenAI's
own guidance is built on), used directly so that every row of a batch has a grammar of its own."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from phi_api.errors import GuidanceError

if TYPE_CHECKING:
    from llguidance import LLMatcher


class GuideFactory:
    """The model's tokenizer as llguidance sees it, and the grammars built on it (one per model, shared)."""

    def __init__(self, tokenizer_json: Path, vocab_size: int, eos_ids: frozenset[int]) -> None:
        from llguidance import LLTokenizer

        # n_vocab: the logits' width (a vocabulary padded past the tokenizer's last id masks the rest).
        self._tokenizer = LLTokenizer(str(tokenizer_json), n_vocab=vocab_size, eos_token=sorted(eos_ids))
        self.vocab_size = vocab_size

    def token_bytes(self) -> dict[int, bytes]:
        """Token id -> the bytes it stands for (special tokens: their text), for every id of the logits; what
        log-probability answers carry, also for tokens holding only part of a character."""
        return {token: self._tokenizer.decode_bytes([token]) for token in range(self.vocab_size)}

    def guide(self, kind: str, grammar: str) -> Guide:
        """A fresh matcher for ``grammar`` of ``kind`` (``json_schema``, or ``llguidance``: a definition already
        compiled by llguidance, from a regex, choices, or a Lark or GBNF grammar); compiles it (can take a while:
        call off the hub)."""
        from llguidance import LLMatcher

        if kind == "json_schema":
            grammar = LLMatcher.grammar_from_json_schema(grammar)
        elif kind != "llguidance":
            raise GuidanceError(f"unknown grammar kind {kind!r}")
        matcher = LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GuidanceError(matcher.get_error())
        return Guide(matcher, self.vocab_size, self._tokenizer)


class Guide:
    """One sequence's grammar state: the mask of its next token, and the tokens it has taken."""

    def __init__(self, matcher: LLMatcher, vocab_size: int, tokenizer: Any = None) -> None:
        from llguidance.numpy import allocate_token_bitmask

        self._matcher = matcher
        self._bitmask = allocate_token_bitmask(1, vocab_size)
        self._tokenizer = tokenizer

    def mask(self, logits: np.ndarray) -> None:
        """Set the logits of the tokens the grammar does not allow now to minus infinity."""
        from llguidance.numpy import apply_token_bitmask_inplace, fill_next_token_bitmask

        fill_next_token_bitmask(self._matcher, self._bitmask, 0)
        apply_token_bitmask_inplace(logits[None, :], self._bitmask)

    def consume(self, token: int) -> None:
        """Advance the grammar past ``token``.

        An added token whose text a grammar spells as a string (Qwen's ``<tool_call>``, ``<think>``) is allowed by
        llguidance's mask but refused by its parser, which reads it as a special token: the grammar then takes the
        same text as ordinary tokens, and the model keeps its own token.
        """
        tokenizer = self._tokenizer
        if tokenizer is not None and tokenizer.is_special_token(token) and not self._matcher.validate_tokens([token]):
            spelled = tokenizer.greedy_tokenize(tokenizer.decode_str([token]))
            if spelled and self._matcher.validate_tokens(spelled) == len(spelled):
                self._matcher.consume_tokens(spelled)
                return
        self._matcher.consume_token(token)

    @property
    def failed(self) -> str | None:
        """Why the grammar can no longer continue, if it cannot (else None)."""
        return self._matcher.get_error() if self._matcher.is_error() else None
