"""Encoders against real gunicorn serving a generator, an embedding model and a reranker from one MODELS_FILE:
OpenAI's /v1/embeddings through the openai SDK and Ollama's through the ollama client, vectors against
transformers' own for the same folder; reranking in Cohere's, Jina's and vLLM's shapes against transformers'
scores; each model refusing the others' routes."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
import requests
from openai import OpenAI

from tests.support.server import Server

EMBEDDER = "all-minilm-l6-v2"
RERANKER = "tiny-reranker"
MATRYOSHKA = "tiny-matryoshka"
GENERATOR = "smollm2-135m-instruct"
TEXTS = ["The cat sat on the mat.", "A fast brown fox leaps over lazy dogs near the river bank at dawn.",
         "Quantum chromodynamics describes the strong interaction.", "Paris", "こんにちは世界",
         "Embeddings map text to vectors; similar meanings land close together. " * 6]


@pytest.fixture(scope="module")
def served(model_path, embedding_model_path, tiny_cross_encoder, tiny_embedder, logs_dir, tmp_path_factory):
    listing = tmp_path_factory.mktemp("embeddings") / "models.json"
    listing.write_text(json.dumps({"models": [{"id": GENERATOR, "path": model_path},
                                              {"id": EMBEDDER, "path": embedding_model_path, "task": "embed"},
                                              {"id": RERANKER, "path": str(tiny_cross_encoder)},
                                              {"id": MATRYOSHKA, "path": str(tiny_embedder)}]}))
    with Server(logs_dir, MODELS_FILE=str(listing), WEB_CONCURRENCY=2, MAX_MODELS=5) as running:
        yield running


@pytest.fixture(scope="module")
def sdk(served):
    return OpenAI(base_url=served.url + "/v1", api_key="not-needed", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """transformers' own vectors and token counts for the folder (sentence-transformers' recipe: mean pooling over
    the tokens, then unit length)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from phi_api.tools.prepare_encoder import embedding_zip, unzip_model

    source = unzip_model(embedding_zip(), tmp_path_factory.mktemp("minilm-source"))
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModel.from_pretrained(source).eval()
    encoded = tokenizer(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state
    mask = encoded["attention_mask"][..., None].float()
    vectors = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1).numpy()
    return vectors, [len(tokenizer(text)["input_ids"]) for text in TEXTS]


def test_vectors_match_transformers_own(sdk, reference):
    vectors, counts = reference
    answer = sdk.embeddings.create(model=EMBEDDER, input=TEXTS)  # the SDK asks for base64 and decodes it
    got = np.array([item.embedding for item in answer.data], dtype=np.float32)
    assert [item.index for item in answer.data] == list(range(len(TEXTS)))
    cosines = (got * vectors).sum(axis=1) / np.linalg.norm(got, axis=1) / np.linalg.norm(vectors, axis=1)
    assert cosines.min() >= 0.999, cosines
    assert np.abs(got - vectors).max() <= 1e-4
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == sum(counts)
    assert answer.model == EMBEDDER


def test_float_and_base64_agree_and_a_text_alone_equals_it_in_a_batch(sdk, served):
    alone = sdk.embeddings.create(model=EMBEDDER, input=TEXTS[0], encoding_format="float").data[0].embedding
    assert len(alone) == 384 and abs(np.linalg.norm(alone) - 1.0) < 1e-5
    batched = sdk.embeddings.create(model=EMBEDDER, input=[TEXTS[5], TEXTS[1], TEXTS[0]]).data[2].embedding
    assert np.array_equal(np.array(alone, dtype=np.float32), np.array(batched, dtype=np.float32))


def test_a_vector_is_the_same_bits_whatever_it_is_encoded_with(served):
    """A request's answer depends on the request only: the same text alone, among longer and shorter ones, and
    while other requests' inputs are batched with it."""
    def vectors(texts: list[str]) -> list[str]:
        answer = requests.post(served.url + "/v1/embeddings", timeout=60,
                               json={"model": EMBEDDER, "input": texts, "encoding_format": "base64"})
        return [item["embedding"] for item in answer.json()["data"]]

    alone = [vectors([text])[0] for text in TEXTS]
    assert vectors(TEXTS) == alone
    assert vectors(TEXTS[::-1]) == alone[::-1]
    with ThreadPoolExecutor(6) as pool:  # concurrent requests: their inputs share the encoder's calls
        together = list(pool.map(lambda text: vectors([text, "padding " * 40])[0], TEXTS * 3))
    assert together == alone * 3


def test_token_ids_are_embedded_as_given(sdk, served):
    text = sdk.embeddings.create(model=EMBEDDER, input=TEXTS[3], encoding_format="float")
    ids = requests.post(served.url + "/v1/embeddings", timeout=60,
                        json={"model": EMBEDDER, "input": [101, 3000, 102]}).json()  # [CLS] paris [SEP]
    assert ids["usage"]["prompt_tokens"] == 3 == text.usage.prompt_tokens
    assert np.dot(ids["data"][0]["embedding"], text.data[0].embedding) >= 0.99999
    for outside in ([[101, 3000, 102], [101, 30522]], [[30521], [102, 40000]]):  # MiniLM's vocabulary: 30,522 ids
        with pytest.raises(openai.BadRequestError) as refused:
            sdk.embeddings.create(model=EMBEDDER, input=outside)
        assert "from 0 to 30521" in refused.value.body["message"] and refused.value.body["param"] == "input"


def test_what_the_model_cannot_do_is_refused_by_name(sdk):
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model=EMBEDDER, input="hi", dimensions=64)
    assert refused.value.body["param"] == "dimensions" and refused.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as chat:
        sdk.chat.completions.create(model=EMBEDDER, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert chat.value.body["code"] == "unsupported_model_task" and "embedding model" in chat.value.body["message"]
    with pytest.raises(openai.BadRequestError) as embed:
        sdk.embeddings.create(model=GENERATOR, input="hi")
    assert embed.value.body["code"] == "unsupported_model_task" and embed.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model="no-such-model", input="hi")
    with pytest.raises(openai.BadRequestError):
        sdk.embeddings.create(model=EMBEDDER, input="")


def test_an_input_past_the_model_s_length_is_refused_unless_truncation_is_asked(sdk):
    long = "word " * 400
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.embeddings.create(model=EMBEDDER, input=long)
    assert refused.value.body["code"] == "context_length_exceeded" and refused.value.body["param"] == "input"
    cut = sdk.embeddings.create(model=EMBEDDER, input=long, extra_body={"truncate_prompt_tokens": 16})
    assert cut.usage.prompt_tokens == 16
    whole = sdk.embeddings.create(model=EMBEDDER, input=long, extra_body={"truncate_prompt_tokens": -1})
    assert whole.usage.prompt_tokens == 256


def test_models_say_their_task(sdk):
    tasks = {model.id: model.model_extra["task"] for model in sdk.models.list().data}
    assert tasks == {GENERATOR: "generate", EMBEDDER: "embed", RERANKER: "rerank", MATRYOSHKA: "embed"}


def test_ollama_s_client_embeds_as_the_openai_route_does(served, sdk):
    import ollama

    client = ollama.Client(host=served.url, timeout=120)
    answer = client.embed(model=EMBEDDER, input=TEXTS[:2])
    openai_vectors = [item.embedding for item in sdk.embeddings.create(model=EMBEDDER, input=TEXTS[:2]).data]
    assert len(answer.embeddings) == 2
    for ours, theirs in zip(answer.embeddings, openai_vectors, strict=True):
        assert np.dot(ours, theirs) >= 0.99999
    assert answer.prompt_eval_count == sdk.embeddings.create(model=EMBEDDER, input=TEXTS[:2]).usage.prompt_tokens
    short = client.embed(model=EMBEDDER, input=TEXTS[0], dimensions=64).embeddings[0]
    assert len(short) == 64 and abs(np.linalg.norm(short) - 1.0) < 1e-5  # cut, then made unit again
    assert np.dot(short, np.array(openai_vectors[0][:64]) / np.linalg.norm(openai_vectors[0][:64])) >= 0.99999
    legacy = client.embeddings(model=EMBEDDER, prompt=TEXTS[0]).embedding
    assert np.dot(legacy, openai_vectors[0]) >= 0.99999
    assert client.embed(model=EMBEDDER, input=[]).embeddings == []


def test_ollama_s_truncate_false_refuses_a_long_input_in_ollama_s_shape(served):
    long = "word " * 400
    cut = requests.post(served.url + "/api/embed", json={"model": EMBEDDER, "input": long}, timeout=60)
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == 256
    refused = requests.post(served.url + "/api/embed", json={"model": EMBEDDER, "input": long, "truncate": False},
                            timeout=60)
    assert refused.status_code == 400 and "256 tokens" in refused.json()["error"]
    wrong = requests.post(served.url + "/api/embed", json={"model": GENERATOR, "input": "hi"}, timeout=60)
    assert wrong.status_code == 400 and "generates text" in wrong.json()["error"]


QUERY = "Where do penguins live?"
DOCUMENTS = ["Penguins live in the southern hemisphere, mostly in Antarctica.", "The stock market fell today.",
             "Emperor penguins breed on sea ice.", "A recipe for lemon cake with poppy seeds.", "Ice", "",
             "Penguins cannot fly but swim very well in cold oceans of the south."]


@pytest.fixture(scope="module")
def expected_scores(tiny_cross_encoder):
    """transformers' own scores for the tiny cross-encoder's source folder: sigmoid of its logit per pair."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    source = tiny_cross_encoder.parent / "hf"
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForSequenceClassification.from_pretrained(source).eval()
    encoded = tokenizer([QUERY] * len(DOCUMENTS), DOCUMENTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return torch.sigmoid(model(**encoded).logits[:, 0]).numpy().astype(np.float64)


def test_cohere_s_shape_is_sorted_and_matches_transformers(served, expected_scores):
    answer = requests.post(served.url + "/v2/rerank", timeout=60, json={
        "model": RERANKER, "query": QUERY, "documents": DOCUMENTS, "top_n": 3}).json()
    order = [int(index) for index in np.argsort(-expected_scores, kind="stable")]
    assert [result["index"] for result in answer["results"]] == order[:3]
    for result in answer["results"]:
        assert abs(result["relevance_score"] - expected_scores[result["index"]]) <= 1e-4
        assert "document" not in result  # Cohere's v2: only when return_documents is true
    every = requests.post(served.url + "/v1/rerank", timeout=60, json={
        "model": RERANKER, "query": QUERY, "documents": DOCUMENTS}).json()
    assert [result["index"] for result in every["results"]] == order
    assert [result["document"]["text"] for result in every["results"]] == [DOCUMENTS[index] for index in order]
    assert every["usage"]["prompt_tokens"] > len(DOCUMENTS) * 3


def test_max_tokens_per_doc_cuts_each_document_and_keeps_the_query(served, tiny_cross_encoder):
    """Cohere's max_tokens_per_doc: transformers' scores of the query with each document's first 4 tokens."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    source = tiny_cross_encoder.parent / "hf"
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForSequenceClassification.from_pretrained(source).eval()
    room = len(tokenizer(QUERY, add_special_tokens=False)["input_ids"]) + 4 + 3  # [CLS] query [SEP] 4 tokens [SEP]
    encoded = tokenizer([QUERY] * len(DOCUMENTS), DOCUMENTS, padding=True, truncation="only_second", max_length=room,
                        return_tensors="pt")
    with torch.no_grad():
        expected = torch.sigmoid(model(**encoded).logits[:, 0]).numpy().astype(np.float64)
    answer = requests.post(served.url + "/v1/rerank", timeout=60, json={
        "model": RERANKER, "query": QUERY, "documents": DOCUMENTS, "max_tokens_per_doc": 4}).json()
    got = {result["index"]: result["relevance_score"] for result in answer["results"]}
    assert np.abs(np.array([got[index] for index in range(len(DOCUMENTS))]) - expected).max() <= 1e-4
    assert answer["usage"]["prompt_tokens"] == int(encoded["attention_mask"].sum())


def test_jina_s_objects_and_vllm_s_score_agree(served, expected_scores):
    jina = requests.post(served.url + "/v1/rerank", timeout=60, json={
        "model": RERANKER, "query": QUERY, "documents": [{"text": text, "id": n} for n, text in enumerate(DOCUMENTS)],
        "return_documents": True}).json()
    for result in jina["results"]:
        assert result["document"] == {"text": DOCUMENTS[result["index"]], "id": result["index"]}
        assert abs(result["relevance_score"] - expected_scores[result["index"]]) <= 1e-4
    scored = requests.post(served.url + "/v1/score", timeout=60, json={
        "model": RERANKER, "text_1": QUERY, "text_2": DOCUMENTS}).json()
    assert [item["index"] for item in scored["data"]] == list(range(len(DOCUMENTS)))
    assert np.abs(np.array([item["score"] for item in scored["data"]]) - expected_scores).max() <= 1e-4
    # texts: TEI's (and llama.cpp's, for such a body) bare list, best first, with the text when asked
    order = [int(index) for index in np.argsort(-expected_scores, kind="stable")]
    tei = requests.post(served.url + "/rerank", timeout=60, json={
        "model": RERANKER, "query": QUERY, "texts": DOCUMENTS, "return_text": True}).json()
    assert [result["index"] for result in tei] == order
    for result in tei:
        assert abs(result["score"] - expected_scores[result["index"]]) <= 1e-4
        assert result["text"] == DOCUMENTS[result["index"]]
    plain = requests.post(served.url + "/rerank", timeout=60, json={
        "model": RERANKER, "query": QUERY, "texts": DOCUMENTS[:2]}).json()
    assert sorted(plain, key=lambda result: result["index"]) == [
        {"index": index, "score": pytest.approx(expected_scores[index], abs=1e-4)} for index in (0, 1)]
    raw = requests.post(served.url + "/rerank", timeout=60, json={
        "model": RERANKER, "query": QUERY, "texts": DOCUMENTS, "raw_scores": True})
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "raw_scores"


def test_rerank_errors_name_what_is_wrong_in_both_shapes(served):
    wrong = requests.post(served.url + "/v1/rerank", timeout=60, json={
        "model": EMBEDDER, "query": QUERY, "documents": DOCUMENTS})
    assert wrong.status_code == 400
    body = wrong.json()
    assert body["error"]["code"] == "unsupported_model_task" and body["message"] == body["error"]["message"]
    missing = requests.post(served.url + "/v1/rerank", timeout=60, json={"model": RERANKER, "query": QUERY})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "documents"
    uneven = requests.post(served.url + "/v1/score", timeout=60, json={
        "model": RERANKER, "text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
    assert uneven.status_code == 400 and uneven.json()["error"]["param"] == "text_1"
    chat = requests.post(served.url + "/v1/chat/completions", timeout=60, json={
        "model": RERANKER, "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 400 and "reranking model" in chat.json()["error"]["message"]


def test_a_matryoshka_model_gives_shorter_vectors_and_pools_its_cls_token(sdk, tiny_embedder):
    import torch
    from transformers import AutoModel, AutoTokenizer

    source = tiny_embedder.parent / "hf"
    tokenizer, model = AutoTokenizer.from_pretrained(source), AutoModel.from_pretrained(source).eval()
    with torch.no_grad():
        cls = model(**tokenizer(TEXTS[:3], padding=True, return_tensors="pt")).last_hidden_state[:, 0].numpy()
    full = np.array([item.embedding for item in sdk.embeddings.create(model=MATRYOSHKA, input=TEXTS[:3]).data])
    assert np.abs(full - cls / np.linalg.norm(cls, axis=1, keepdims=True)).max() <= 1e-4
    short = np.array([item.embedding for item in
                      sdk.embeddings.create(model=MATRYOSHKA, input=TEXTS[:3], dimensions=16).data])
    expected = cls[:, :16] / np.linalg.norm(cls[:, :16], axis=1, keepdims=True)
    assert short.shape == (3, 16) and np.abs(short - expected).max() <= 1e-4
    with pytest.raises(openai.BadRequestError) as wider:
        sdk.embeddings.create(model=MATRYOSHKA, input="hi", dimensions=64)
    assert wider.value.body["param"] == "dimensions"


def test_langchain_s_openai_embeddings(served, sdk):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: LangChain would otherwise send tiktoken's ids of OpenAI's vocabulary
    embeddings = OpenAIEmbeddings(model=EMBEDDER, base_url=served.url + "/v1", api_key="not-needed",
                                  check_embedding_ctx_length=False, max_retries=0)
    documents = embeddings.embed_documents(TEXTS[:3])
    query = embeddings.embed_query(TEXTS[0])
    ours = [item.embedding for item in sdk.embeddings.create(model=EMBEDDER, input=TEXTS[:3]).data]
    assert len(documents) == 3
    for got, expected in zip(documents, ours, strict=True):
        assert np.dot(got, expected) >= 0.99999
    assert np.dot(query, ours[0]) >= 0.99999


def test_an_encoder_folder_is_loaded_and_unloaded_while_serving(served, tiny_cross_encoder, expected_scores):
    loaded = requests.post(served.url + "/v1/models/load", timeout=120,
                           json={"model": "loaded-reranker", "path": str(tiny_cross_encoder)})
    assert loaded.status_code == 200 and loaded.json()["task"] == "rerank"
    try:
        scored = requests.post(served.url + "/v1/score", timeout=60, json={
            "model": "loaded-reranker", "text_1": QUERY, "text_2": DOCUMENTS}).json()
        assert np.abs(np.array([item["score"] for item in scored["data"]]) - expected_scores).max() <= 1e-4
    finally:
        assert requests.post(served.url + "/v1/models/unload", json={"model": "loaded-reranker"},
                             timeout=60).status_code == 200
    gone = requests.post(served.url + "/v1/score", timeout=60, json={
        "model": "loaded-reranker", "text_1": QUERY, "text_2": DOCUMENTS})
    assert gone.status_code == 404


def test_every_worker_maps_one_prepacked_copy_of_the_weights(served, sdk, embedding_model_path):
    from pathlib import Path

    from tests.support.server import wait_until

    sdk.embeddings.create(model=EMBEDDER, input="warm")

    def mapped(pid: int) -> set[str]:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as maps:
            return {line.split()[-1] for line in maps if line.rstrip().endswith("model.onnx.data")}

    def the_encoder_s(path: str) -> bool:  # the prepacked copy's record names the folder it was made from
        record = Path(path).parent / "source.json"
        return record.is_file() and json.loads(record.read_text())["source"] == str(Path(embedding_model_path))

    def shared() -> set[str] | None:
        files = [{path for path in mapped(pid) if the_encoder_s(path)} for pid in served.worker_pids()]
        common = set.intersection(*files) if files else set()
        return common if len(files) == 2 and common else None

    # the same data file, mapped by both workers: the weights' pages are one page-cache copy
    assert len(wait_until(shared, timeout=60, message="both workers to map the encoder's prepacked weights")) == 1


def test_ollama_s_keep_alive_zero_unloads_the_embedding_model_once_answered(served, embedding_model_path):
    assert requests.post(served.url + "/v1/models/load", timeout=120,
                         json={"model": "spare-embedder", "path": embedding_model_path}).status_code == 200
    answer = requests.post(served.url + "/api/embed", timeout=60,
                           json={"model": "spare-embedder", "input": "once", "keep_alive": 0})
    assert answer.status_code == 200 and len(answer.json()["embeddings"][0]) == 384
    listed = [model["name"] for model in requests.get(served.url + "/api/tags", timeout=30).json()["models"]]
    assert "spare-embedder" not in listed and EMBEDDER in listed
