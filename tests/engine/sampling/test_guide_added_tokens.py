"""A grammar that spells an added token's text (Qwen's ``<tool_call>``) as a string: llguidance's mask allows the
added token, and the grammar takes it (its parser alone would read it as a special token and fail)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from llguidance import LLMatcher

from phi_api.engine.sampling.guidance import GuideFactory


def tokenizer_with_an_added_token(model_path: str, tmp_path: Path) -> tuple[Path, int]:
    spelled = json.loads((Path(model_path) / "tokenizer.json").read_text(encoding="utf-8"))
    new_id = len(spelled["model"]["vocab"])
    spelled["added_tokens"].append({"id": new_id, "content": "<tool_call>", "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": False})
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spelled), encoding="utf-8")
    return path, new_id


def test_an_added_token_spelled_by_the_grammar_is_taken(model_path, tmp_path):
    path, added = tokenizer_with_an_added_token(model_path, tmp_path)
    factory = GuideFactory(path, added + 1, frozenset({2}))
    guide = factory.guide("llguidance", LLMatcher.grammar_from_lark('start: "<tool_call>" "!"'))
    logits = np.zeros(added + 1, dtype=np.float32)
    guide.mask(logits)
    assert np.isfinite(logits[added])  # the mask offers the added token for the string
    guide.consume(added)
    assert guide.failed is None
    logits = np.zeros(added + 1, dtype=np.float32)
    guide.mask(logits)
    exclamation = [token for token in np.flatnonzero(np.isfinite(logits))]
    assert exclamation and all(factory.token_bytes()[int(token)].startswith(b"!") for token in exclamation)
