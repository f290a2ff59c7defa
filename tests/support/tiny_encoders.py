"""Tiny random-weight encoders (BERT, hidden size 32, two layers), exported in seconds.

Both reuse all-MiniLM-L6-v2's tokenizer (its 30522-token WordPiece
vocabulary) from the default embedding folder, are written as a Hugging Face
folder at ``<work_dir>/hf`` (kept: the tests compare against transformers on
it) and exported with :func:`phi_api.tools.prepare_encoder.export_encoder`
into ``out_dir``:

- :func:`build_tiny_cross_encoder`: a ``BertForSequenceClassification`` with one
  label (task "rerank", sigmoid scores). Its initializer range of 0.2 spreads the
  scores so that sorting by them is not decided by ties.
- :func:`build_tiny_embedder`: a ``BertModel`` with sentence-transformers files
  for CLS pooling, a Normalize module, a length of 64 and Matryoshka dimensions
  32, 16 and 8 (task "embed").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from phi_api.tools.prepare_encoder import export_encoder

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MATRYOSHKA = [32, 16, 8]


def tiny_bert_config(**extra: Any) -> Any:
    """The tiny BERT's configuration (``extra``: more fields, written to config.json)."""
    from transformers import BertConfig

    return BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=128, type_vocab_size=2, initializer_range=0.2,
                      **extra)


def build_tiny_cross_encoder(tokenizer_dir: Path, out_dir: Path, work_dir: Path) -> Path:
    """Build the tiny cross-encoder into ``out_dir`` (reusing it if present; its HF folder: ``work_dir/hf``) and
    return it."""
    import torch
    from transformers import BertForSequenceClassification

    if (out_dir / "model.onnx").is_file():
        return out_dir
    hf_dir = work_dir / "hf"
    torch.manual_seed(0)
    BertForSequenceClassification(tiny_bert_config(num_labels=1)).eval().save_pretrained(hf_dir)
    copy_tokenizer(tokenizer_dir, hf_dir)
    export_encoder(hf_dir, out_dir, "rerank")
    return out_dir


def build_tiny_embedder(tokenizer_dir: Path, out_dir: Path, work_dir: Path) -> Path:
    """Build the tiny embedder into ``out_dir`` (reusing it if present; its HF folder: ``work_dir/hf``) and return
    it."""
    import torch
    from transformers import BertModel

    if (out_dir / "model.onnx").is_file():
        return out_dir
    hf_dir = work_dir / "hf"
    torch.manual_seed(0)
    config = tiny_bert_config(is_matryoshka=True, matryoshka_dimensions=MATRYOSHKA)
    BertModel(config).eval().save_pretrained(hf_dir)
    copy_tokenizer(tokenizer_dir, hf_dir)
    write_json(hf_dir / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])
    write_json(hf_dir / "1_Pooling" / "config.json", {
        "word_embedding_dimension": 32, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False})
    write_json(hf_dir / "sentence_bert_config.json", {"max_seq_length": 64, "do_lower_case": False})
    export_encoder(hf_dir, out_dir, "embed")
    return out_dir


def copy_tokenizer(source: Path, hf_dir: Path) -> None:
    """Copy the tokenizer files ``source`` has into ``hf_dir``."""
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, hf_dir / name)


def write_json(path: Path, content: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
