"""A tiny random-weight Phi-3 model, built with ONNX Runtime GenAI's model builder in seconds.

It exercises the ``phi3`` path of the server: model type ``phi3``, a folder
without a chat template of its own (so the server's Phi-3.5 template is
used), several end-of-sequence ids like Phi-3.5's, the same int4
block-128 accuracy-level-4 recipe, and Phi-3.5's kind of LongRoPE: rotary
factors that switch from short to long past
``original_max_position_embeddings`` (4096, Phi-3.5's own value and the one
ONNX Runtime GenAI's generator re-prefills at for every ``phi3`` model),
under a longer context. It is :data:`phi_api.tools.random_models.TINY_PHI3`: the recipe of
the Phi-3.5-mini-shaped benchmark model (``prepare-model --shape``) at a toy size.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from phi_api.tools.prepare import run_builder
from phi_api.tools.random_models import PHI3_EOS_TOKENS, TINY_PHI3, drop_chat_template, write_phi3_folder

__all__ = ["PHI3_EOS_TOKENS", "ROPE_CONTEXT", "ROPE_SWITCH", "build_tiny_phi3", "with_renamed_tokens"]

ROPE_SWITCH = TINY_PHI3.original_positions
ROPE_CONTEXT = TINY_PHI3.max_positions


def build_tiny_phi3(tokenizer_source: Path, out_dir: Path, work_dir: Path) -> Path:
    """Build the model into ``out_dir`` (reusing it if present) and return it."""
    if (out_dir / "genai_config.json").is_file():
        return out_dir
    hf_dir = work_dir / "tiny-phi3-hf"
    write_phi3_folder(TINY_PHI3, tokenizer_source, hf_dir)
    run_builder(hf_dir, out_dir, work_dir / "tiny-phi3-cache", work_dir / "tiny-phi3-builder.log")
    drop_chat_template(out_dir)
    return out_dir


def with_renamed_tokens(source: Path, out_dir: Path, names: dict[int, str], special: bool = True) -> Path:
    """A copy of the model folder ``source`` whose tokenizer's added tokens are renamed ``names`` (by id), in
    tokenizer.json (its vocabulary too) and tokenizer_config.json alike; not ``special``: decoded as text, as
    reasoning models' thinking markers are."""
    shutil.copytree(source, out_dir)
    path = out_dir / "tokenizer.json"
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    for token in tokenizer["added_tokens"]:
        if token["id"] in names:
            old, token["content"], token["special"] = token["content"], names[token["id"]], special
            tokenizer["model"]["vocab"][names[token["id"]]] = tokenizer["model"]["vocab"].pop(old)
    path.write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    config = out_dir / "tokenizer_config.json"
    if config.is_file():  # its own list of added tokens must agree with tokenizer.json's
        settings = json.loads(config.read_text(encoding="utf-8"))
        for token_id, name in names.items():
            if str(token_id) in settings.get("added_tokens_decoder", {}):
                settings["added_tokens_decoder"][str(token_id)]["content"] = name
        config.write_text(json.dumps(settings), encoding="utf-8")
    return out_dir
