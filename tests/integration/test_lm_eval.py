"""lm-evaluation-harness (pinned) against real gunicorn on the real model: its ``local-completions`` client scores a
small multiple-choice task kept in tests/data (token-id prompts, ``echo``, ``logprobs: 1``, ``max_tokens: 1``), and
the accuracy it reports is the one ONNX Runtime GenAI's own logits give.

The reference runs each request's tokens through ONNX Runtime GenAI in one pass, as the server prefills a short
prompt alone (the same shapes and inputs), and reads every position's logits. The server keeps ONNX Runtime's
attention and matrix kernel here (``ATTENTION_KERNEL=onnxruntime``, ``INT4_KERNEL=mlas``), as the reference
computes, so that the scores compare to 1e-4: with phi-api's attention a token's log-probability moves by ~0.02 on
average (test_attention_kernel.py), and with phi-api's 8-bit kernel by up to ~0.4 (its int8 rows round a few values
otherwise than MLAS's, and this model's outliers make a rounding step coarse: docs/kernels.md; measured 0.37 here),
enough to tell nothing of the client's plumbing. The task's accuracy at the server's defaults is checked against the
same reference, within one question."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from openai import OpenAI

from tests.integration.conftest import MODEL_ID
from tests.support.server import Server

TASK_FILE = Path(__file__).resolve().parent.parent / "data" / "multiple-choice.jsonl"


@pytest.fixture(scope="module")
def onnxruntime_kernels(model_path, logs_dir):
    with Server(logs_dir, MODEL_PATH=model_path, MODEL_ID=MODEL_ID, WEB_CONCURRENCY=1,
                ATTENTION_KERNEL="onnxruntime", INT4_KERNEL="mlas") as running:
        yield running


def evaluate(server: Server, model_path: str, tmp_path_factory):
    """lm-eval's client, and what simple_evaluate returned with every sample logged."""
    from lm_eval import simple_evaluate
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    task = {"task": "phi_api_multiple_choice", "dataset_path": "json", "test_split": "test",
            "dataset_kwargs": {"data_files": {"test": str(TASK_FILE)},
                               "cache_dir": str(tmp_path_factory.mktemp("datasets"))},
            "output_type": "multiple_choice", "doc_to_text": "Question: {{question}}\nAnswer:",
            "doc_to_choice": "{{choices}}", "doc_to_target": "{{answer}}",
            "metric_list": [{"metric": "acc", "aggregation": "mean", "higher_is_better": True}]}
    client = get_model("local-completions").create_from_arg_string(
        f"model={MODEL_ID},base_url={server.url}/v1/completions,tokenizer={model_path},"
        "tokenizer_backend=huggingface,tokenized_requests=True,num_concurrent=1,max_retries=1")
    results = simple_evaluate(model=client, tasks=[task], log_samples=True, task_manager=TaskManager())
    return client, results


@pytest.fixture(scope="module")
def evaluation(onnxruntime_kernels, model_path, tmp_path_factory):
    return evaluate(onnxruntime_kernels, model_path, tmp_path_factory)


def reference_scores(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """(log-likelihood of ``continuation`` after ``context``, whether each of its tokens is the argmax)."""
    import onnxruntime_genai as og

    tokens = context + continuation
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(tokens) + 1)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(tokens, dtype=np.int32))
    logits = generator.get_output("logits")[0].astype(np.float64)  # every position's
    total, greedy = 0.0, True
    for position in range(len(context), len(tokens)):
        row = logits[position - 1]
        peak = row.max()
        total += float(row[tokens[position]] - (peak + np.log(np.exp(row - peak).sum())))
        greedy = greedy and int(row.argmax()) == tokens[position]
    return total, greedy


def test_the_accuracy_is_the_one_onnx_runtime_genai_s_logits_give(evaluation, reference_model):
    client, results = evaluation
    model, _ = reference_model
    samples = results["samples"]["phi_api_multiple_choice"]
    assert len(samples) == sum(1 for line in TASK_FILE.read_text().splitlines() if line.strip())
    correct = 0
    for sample in samples:
        scored = [client._encode_pair(context, continuation) for context, continuation in sample["arguments"]]
        expected = [reference_scores(model, context, continuation) for context, continuation in scored]
        got = sample["filtered_resps"]  # (log-likelihood, is_greedy) of each choice, as lm-eval parsed them
        assert [loglikelihood for loglikelihood, _ in got] == pytest.approx(
            [loglikelihood for loglikelihood, _ in expected], abs=1e-4)
        assert [greedy for _, greedy in got] == [greedy for _, greedy in expected]
        correct += int(np.argmax([loglikelihood for loglikelihood, _ in expected]) == sample["target"])
    assert results["results"]["phi_api_multiple_choice"]["acc,none"] == pytest.approx(correct / len(samples))


def test_a_continuation_the_model_would_end_is_scored_whole(onnxruntime_kernels, model_path, reference_model):
    """lm-eval reads ``token_logprobs[len(context):-1]``: the entry past the prompt is the generated token's, the
    end of sequence's too (forced here by ``logit_bias``, which leaves log-probabilities raw), so the
    continuation's last token is scored."""
    from lm_eval.models.openai_completions import LocalCompletionsAPI

    model, tokenizer = reference_model
    context = [int(token) for token in tokenizer.encode("Question: What is the capital of France?\nAnswer:")]
    continuation = [int(token) for token in tokenizer.encode(" Paris.")]
    eos = json.loads((Path(model_path) / "genai_config.json").read_text())["model"]["eos_token_id"]
    client = OpenAI(base_url=onnxruntime_kernels.url + "/v1", api_key="unused", max_retries=0)
    answer = client.completions.create(model=MODEL_ID, prompt=context + continuation, echo=True, max_tokens=1,
                                       logprobs=1, temperature=0,
                                       logit_bias={str(eos[0] if isinstance(eos, list) else eos): 100})
    assert answer.choices[0].finish_reason == "stop" and answer.usage.completion_tokens == 1
    [(loglikelihood, greedy)] = LocalCompletionsAPI.parse_logprobs(answer.model_dump(), ctxlens=[len(context)])
    expected = reference_scores(model, context, continuation)
    assert loglikelihood == pytest.approx(expected[0], abs=1e-4) and greedy == expected[1]


def test_at_the_server_s_defaults_the_accuracy_is_the_reference_s_within_one_question(server, model_path,
                                                                                       tmp_path_factory,
                                                                                       reference_model):
    client, results = evaluate(server, model_path, tmp_path_factory)
    model, _ = reference_model
    samples = results["samples"]["phi_api_multiple_choice"]
    correct = sum(int(np.argmax([reference_scores(model, *client._encode_pair(context, continuation))[0]
                                 for context, continuation in sample["arguments"]]) == sample["target"])
                  for sample in samples)
    accuracy = results["results"]["phi_api_multiple_choice"]["acc,none"]
    assert abs(accuracy - correct / len(samples)) <= 1 / len(samples) + 1e-9
