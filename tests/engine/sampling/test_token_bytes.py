"""Each token's bytes, as log-probability answers carry them, decoded by the tokenizer llguidance builds for the
model (no tokenizer.json reading of our own): whole words, single bytes of a split character, special tokens."""

from __future__ import annotations

import json
from pathlib import Path

from phi_api.engine.runtime.folder import ModelFolder
from phi_api.engine.sampling.guidance import GuideFactory


def test_token_bytes_cover_words_raw_bytes_and_special_tokens(model_path):
    folder = Path(model_path)
    spelled = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spelled["model"]["vocab"]
    special = {added["content"]: added["id"] for added in spelled["added_tokens"]}
    size = ModelFolder.read(folder).model["vocab_size"]
    table = GuideFactory(folder / "tokenizer.json", size, frozenset({special["<|im_end|>"]})).token_bytes()
    assert len(table) == size
    assert table[vocab["ĠParis"]] == b" Paris"  # byte-level BPE: "Ġ" spells a space
    assert table[vocab["Ā"]] == b"\x00" and table[vocab["ā"]] == b"\x01"  # bytes no character prints
    assert table[vocab["Ġé"]] == b" \xe9"  # a byte of a character split over tokens
    assert table[special["<|im_end|>"]] == b"<|im_end|>"
