"""A tiny random-weight Phi-3 model, built with ONNX Runtime GenAI's model builder in seconds.

It exercises the ``phi3`` path of the server: model type ``phi3``, a folder
without a chat template of its own (so the server's Phi-3.5 template is
used), several end-of-sequence ids like Phi-3.5's, the same int4
block-128 accuracy-level-4 recipe, and Phi-3.5's kind of LongRoPE: rotary
factors that switch from short to long past
``original_max_position_embeddings`` (4096, Phi-3.5's own value and the one
ONNX Runtime GenAI's generator re-prefills at for every ``phi3`` model),
under a longer context. Its tokenizer is the default model's, plus Phi-3's
special tokens.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from phi_api.prepare import run_builder

PHI3_SPECIAL_TOKENS = ["<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>"]
# Phi-3.5-mini's generation config ends a turn on <|endoftext|>, <|end|> and <|assistant|>.
PHI3_EOS_TOKENS = ["<|endoftext|>", "<|end|>", "<|assistant|>"]
ROPE_SWITCH = 4096  # original_max_position_embeddings
# 256, not 128: onnxruntime 1.31 saves a broken prepacked file for int4 matmuls of K = 128 (NaN logits);
# the server then falls back to the original file, and the fixture would not test the prepacked path.
HIDDEN = 256
ROPE_CONTEXT = 8192


def build_tiny_phi3(tokenizer_source: Path, out_dir: Path, work_dir: Path) -> Path:
    """Build the model into ``out_dir`` (reusing it if present) and return it."""
    if (out_dir / "genai_config.json").is_file():
        return out_dir
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Phi3Config, Phi3ForCausalLM

    hf_dir = work_dir / "tiny-phi3-hf"
    shutil.rmtree(hf_dir, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    tokenizer.add_special_tokens({"additional_special_tokens": PHI3_SPECIAL_TOKENS})
    tokenizer.eos_token = "<|endoftext|>"
    tokenizer.chat_template = None
    tokenizer.save_pretrained(hf_dir)
    _drop_chat_template(hf_dir)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in PHI3_SPECIAL_TOKENS}
    eos_ids = [ids[token] for token in PHI3_EOS_TOKENS]
    half_head = HIDDEN // 4 // 2
    config = Phi3Config(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=ROPE_CONTEXT,
        original_max_position_embeddings=ROPE_SWITCH, bos_token_id=1, eos_token_id=eos_ids[0],
        pad_token_id=eos_ids[0], tie_word_embeddings=False,
        rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(half_head)],
                      "long_factor": [2.0 + 0.3 * i for i in range(half_head)]},
    )
    torch.manual_seed(0)
    Phi3ForCausalLM(config).save_pretrained(hf_dir)
    GenerationConfig(bos_token_id=1, eos_token_id=eos_ids, pad_token_id=eos_ids[0]).save_pretrained(hf_dir)
    run_builder(hf_dir, out_dir, work_dir / "tiny-phi3-cache", work_dir / "tiny-phi3-builder.log")
    _drop_chat_template(out_dir)
    return out_dir


def _drop_chat_template(folder: Path) -> None:
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
