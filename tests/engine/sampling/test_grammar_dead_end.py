"""A grammar with no way on (it needs text the model's vocabulary cannot spell) ends its generation as ``grammar``,
never as a silent ``stop`` with an answer that breaks the grammar, and never as an engine error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from llguidance import LLMatcher

from phi_api.engine.sampling.guidance import GuideFactory
from tests.support.fakes import EOS, fake_engine, text_pieces
from tests.support.generations import generate

# Bytes SmolLM2's byte-level vocabulary has no token for: the lead byte of U+567C2 (0xF1), and 0x04.
UNSPELLABLE = ["A\U000567c2", "A\x04"]


def guide_factory(model_path: str) -> GuideFactory:
    config = json.loads((Path(model_path) / "genai_config.json").read_text(encoding="utf-8"))["model"]
    eos = config["eos_token_id"]
    return GuideFactory(Path(model_path) / "tokenizer.json", config["vocab_size"],
                        frozenset([eos] if isinstance(eos, int) else eos))


def test_a_choice_the_vocabulary_cannot_spell_fails_within_a_few_tokens(model_path):
    factory = guide_factory(model_path)
    for text in UNSPELLABLE:
        guide = factory.guide("llguidance", LLMatcher.grammar_from_lark(f"start: {json.dumps(text)}"))
        for _ in range(4):  # whatever the mask offers is taken, as the sampler would
            logits = np.zeros(factory.vocab_size, dtype=np.float32)
            guide.mask(logits)
            if guide.failed:
                break
            guide.consume(int(np.flatnonzero(np.isfinite(logits))[0]))
        assert guide.failed, text


class DeadEnd:
    """A grammar that takes ``ahead`` tokens, then fails and offers only the end of sequence (as llguidance does)."""

    def __init__(self, ahead: int) -> None:
        self.ahead = ahead
        self.failed: str | None = None

    def mask(self, logits: np.ndarray) -> None:
        if self.ahead == 0:
            self.failed = "no token continues the grammar"
            end = logits[EOS]
            logits.fill(-np.inf)
            logits[EOS] = end

    def consume(self, token: int) -> None:
        self.ahead -= 1


def test_a_dead_end_ends_the_generation_as_grammar_with_the_text_before_it():
    script = [1, 2, 3, 4, 5]
    engine = fake_engine(script, text_pieces(b"a", b"b", b"c", b"d", b"e"))
    engine.model.guide = lambda grammar: DeadEnd(2)
    try:
        text, finished = generate(engine, [9, 9], max_tokens=8, temperature=0, guidance=("llguidance", "{}"))
    finally:
        engine.stop()
    assert finished.reason == "grammar" and not finished.ok
    assert text == "ab" and finished.error
