"""``python -m phi_api prepare-model``: the default model, its float32 reference, a random-weight shape model, a
GGUF file of the user's, the default embedding model, or a local Hugging Face encoder folder (embeddings or
reranking)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from phi_api.errors import PreparationError
from phi_api.tools.prepare import (
    DEFAULT_RECIPE,
    REFERENCE_RECIPE,
    gguf_model_dir,
    prepare_default_model,
    prepare_gguf_model,
)
from phi_api.tools.prepare_encoder import (
    TASKS,
    encoder_model_dir,
    guess_task,
    prepare_default_embedding,
    prepare_encoder_model,
)
from phi_api.tools.random_models import SHAPES, prepare_shape_model


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", type=Path, help="model folder to create (default: the phi-api cache)")
    parser.add_argument("--shape", choices=["phi-3.5-mini"],
                        help="build a random-weight model of this architecture instead (a benchmark model: its "
                             "answers are noise; ~8 GB of memory and a few minutes)")
    parser.add_argument("--reference", action="store_true",
                        help="build the default model's float32 reference instead (what bench-quality compares "
                             "the served model with); with --gguf, a float32 build of that file")
    parser.add_argument("--gguf", type=Path, metavar="FILE",
                        help="convert this GGUF file instead (a Llama-shaped model or a Gemma 3), with the default "
                             "model's recipe: 8-bit weights, the MLPs' down projections in float32")
    parser.add_argument("--embedding", action="store_true",
                        help="prepare the default embedding model instead (all-MiniLM-L6-v2, float32 ONNX)")
    parser.add_argument("--encoder", type=Path, metavar="HF_DIR",
                        help="export this local Hugging Face encoder folder instead (a sentence-transformers "
                             "embedding model or a cross-encoder; BERT-family architectures transformers knows)")
    parser.add_argument("--task", choices=TASKS,
                        help="with --encoder: embed or rerank (default: rerank for a *ForSequenceClassification "
                             "model, else embed)")


def main(args: argparse.Namespace) -> int:
    """Print the prepared folder as the last line; 1 with the reason when it cannot be prepared."""
    try:
        if args.embedding:
            folder = prepare_default_embedding(args.output)
        elif args.encoder:
            hf_dir = args.encoder.expanduser().resolve()
            target = args.output.expanduser().resolve() if args.output else encoder_model_dir(hf_dir)
            folder = prepare_encoder_model(hf_dir, target, args.task or guess_task(hf_dir))
        elif args.gguf:
            gguf = args.gguf.expanduser().resolve()
            recipe = REFERENCE_RECIPE if args.reference else DEFAULT_RECIPE
            target = args.output.expanduser().resolve() if args.output else gguf_model_dir(gguf, recipe)
            folder = prepare_gguf_model(gguf, target, recipe, gguf.name)
        elif args.shape:
            # The tokenizer is the default model's (plus Phi-3's special tokens): prepare that first.
            folder = prepare_shape_model(SHAPES[args.shape], prepare_default_model(), args.output)
        else:
            folder = prepare_default_model(args.output, reference=args.reference)
    except PreparationError as exc:
        print(f"prepare-model failed: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0
