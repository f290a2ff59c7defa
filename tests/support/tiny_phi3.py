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

from pathlib import Path

from phi_api.tools.prepare import run_builder
from phi_api.tools.random_models import PHI3_EOS_TOKENS, TINY_PHI3, drop_chat_template, write_phi3_folder

__all__ = ["PHI3_EOS_TOKENS", "ROPE_CONTEXT", "ROPE_SWITCH", "build_tiny_phi3"]

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
