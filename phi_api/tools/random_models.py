"""Random-weight models of a real architecture, for benchmarks and tests: their answers are noise, their costs
are the real model's.

Phi-3.5-mini-instruct's weights cannot be downloaded everywhere phi-api is
measured, but what a step costs depends only on the model's shape: its
layers, widths, heads, vocabulary and the int4 recipe. :data:`PHI35_MINI`
is that shape (hidden 3072, intermediate 8192, 32 layers, 32 heads and 32
key/value heads, LongRoPE with 4096 original positions under 131072); the
weights are random (seed 0), built in bfloat16 and converted by ONNX Runtime
GenAI's model builder with the recipe of the official
``cpu-int4-awq-block-128-acc-level-4`` folder (minus AWQ). The tokenizer is
the default model's plus Phi-3's special tokens (49,157 tokens; Phi-3.5's
own has 32,064), and the folder has no chat template, so phi-api uses the
Phi-3.5 format.

The tiny Phi-3 of the test suite is the same recipe at a toy size
(:data:`TINY_PHI3`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phi_api.settings import cache_root
from phi_api.tools.prepare import (
    PHI35_RECIPE,
    Progress,
    _stderr,
    _timed,
    build_into,
    builder_step,
    is_ready,
    recipe_tag,
    run_builder,
)

PHI3_SPECIAL_TOKENS = ("<|endoftext|>", "<|assistant|>", "<|end|>", "<|system|>", "<|user|>")
# Phi-3.5-mini's generation config ends a turn on <|endoftext|>, <|end|> and <|assistant|>.
PHI3_EOS_TOKENS = ("<|endoftext|>", "<|end|>", "<|assistant|>")
SHAPE_RECIPE_VERSION = 1


@dataclass(frozen=True)
class Phi3Shape:
    """A Phi-3 architecture's sizes (transformers' ``Phi3Config`` fields) and the dtype its weights are made in."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    max_positions: int
    original_positions: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    dtype: str = "bfloat16"
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def head_size(self) -> int:
        return self.hidden // self.heads

    def rope_scaling(self) -> dict[str, Any]:
        """LongRoPE factors, one per rotary frequency (any values: they change numbers, not costs)."""
        half = self.head_size // 2
        return {"type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(half)],
                "long_factor": [2.0 + 0.3 * i for i in range(half)]}


PHI35_MINI = Phi3Shape("phi-3.5-mini", hidden=3072, intermediate=8192, layers=32, heads=32, kv_heads=32,
                       max_positions=131072, original_positions=4096)
# 256, not 128: onnxruntime 1.31 saves a broken prepacked file for int4 matmuls of K = 128 (NaN logits).
TINY_PHI3 = Phi3Shape("tiny-phi3", hidden=256, intermediate=512, layers=2, heads=4, kv_heads=4,
                      max_positions=8192, original_positions=4096, dtype="float32")
SHAPES = {PHI35_MINI.name: PHI35_MINI}


def shape_model_dir(shape: Phi3Shape, root: Path | None = None) -> Path:
    """Where the random-weight model of ``shape`` is prepared unless told otherwise."""
    return (root or cache_root()) / "models" / f"{shape.name}-shape-random-{recipe_tag(PHI35_RECIPE)}"


def prepare_shape_model(shape: Phi3Shape, tokenizer_source: Path, output: Path | None = None,
                        progress: Progress | None = None) -> Path:
    """Build the random-weight model of ``shape`` into ``output`` (or the cache); return the folder.

    ``tokenizer_source``: a folder with the default model's tokenizer. A
    folder already prepared is returned at once. The builder peaks at about
    23 GB of memory for Phi-3.5-mini's shape (measured on a 24 GiB machine).
    """
    say = progress or _stderr
    target = Path(output).expanduser().resolve() if output else shape_model_dir(shape)
    if is_ready(target, _marker(shape)):
        say(f"Model already prepared in {target}")
        return target

    def build(staging: Path, onnx_dir: Path) -> dict:
        hf_dir = staging / "hf"
        _timed(say, f"1/3 Making random weights of {shape.name}'s shape ({shape.dtype}, seed 0)",
               lambda: write_phi3_folder(shape, tokenizer_source, hf_dir))
        _timed(say, builder_step("2/3", PHI35_RECIPE),
               lambda: run_builder(hf_dir, onnx_dir, staging / "builder-cache", staging / "builder.log"))
        _timed(say, "3/3 Removing the chat template (phi-api serves the Phi-3.5 format)",
               lambda: drop_chat_template(onnx_dir))
        return _marker(shape)

    build_into(target, build)
    say(f"Model prepared in {target} (random weights: a benchmark model, its answers are noise)")
    return target


def _marker(shape: Phi3Shape) -> dict[str, Any]:
    return {"recipe_version": SHAPE_RECIPE_VERSION, "builder": PHI35_RECIPE, "shape": shape.name}


def write_phi3_folder(shape: Phi3Shape, tokenizer_source: Path, out_dir: Path, seed: int = 0) -> None:
    """A Hugging Face folder of a random-weight ``Phi3ForCausalLM`` of ``shape``, with Phi-3's tokenizer."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Phi3Config, Phi3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
    tokenizer.add_special_tokens({"additional_special_tokens": list(PHI3_SPECIAL_TOKENS)})
    tokenizer.eos_token = "<|endoftext|>"
    tokenizer.chat_template = None
    tokenizer.save_pretrained(out_dir)
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in PHI3_SPECIAL_TOKENS}
    eos_ids = [ids[token] for token in PHI3_EOS_TOKENS]
    options: dict[str, Any] = dict(
        vocab_size=len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_positions, original_max_position_embeddings=shape.original_positions,
        rope_theta=shape.rope_theta, rms_norm_eps=shape.rms_norm_eps, bos_token_id=1, eos_token_id=eos_ids[0],
        pad_token_id=eos_ids[0], tie_word_embeddings=False, rope_scaling=shape.rope_scaling(), **shape.extra,
    )
    config = Phi3Config(**options)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, shape.dtype))  # made in the dtype it is saved in: half the memory
    try:
        model = Phi3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.save_pretrained(out_dir)
    del model
    GenerationConfig(bos_token_id=1, eos_token_id=eos_ids, pad_token_id=eos_ids[0]).save_pretrained(out_dir)
    drop_chat_template(out_dir)


def drop_chat_template(folder: Path) -> None:
    """Remove a folder's chat template (phi-api then uses the Phi-3.5 format, as for the official folders'
    older builds)."""
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
