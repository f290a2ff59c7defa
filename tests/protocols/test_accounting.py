"""A run's accounting on the wire: OpenAI's usage (the prompt counted once, cached tokens) and OpenArc's figures."""

from __future__ import annotations

from phi_api.engine import Finished
from phi_api.protocols.openai.answer import usage
from phi_api.protocols.openarc import metrics as openarc_metrics


def choice(completion: int, cached: int = 0, ttft: float | None = 0.5, decode: float = 2.0, index: int = 0,
           first: bool = True, prompt: int = 100) -> Finished:
    return Finished("stop", prompt, completion, ttft, decode, cached_tokens=cached, index=index, first_of_prompt=first,
                    draft_sources=(("prompt", 6, 2), ("prediction", 5 + index, 3)))


def test_usage_counts_the_prompt_once_and_every_choice_s_tokens():
    assert usage([choice(10, cached=64), choice(5, cached=32, index=1, first=False)]) == {
        "prompt_tokens": 100, "completion_tokens": 15, "total_tokens": 115,
        "prompt_tokens_details": {"cached_tokens": 64},
        # the prediction's draft tokens alone, of every choice: kept 3 + 3, refused 2 + 3
        "completion_tokens_details": {"accepted_prediction_tokens": 6, "rejected_prediction_tokens": 5}}


def test_usage_of_several_prompts_counts_each_prompt_once_whatever_order_the_choices_end_in():
    finished = [choice(3, cached=0, index=2, prompt=40), choice(10, cached=64, index=0),
                choice(4, cached=16, index=3, first=False, prompt=40), choice(5, cached=32, index=1, first=False)]
    assert {key: value for key, value in usage(finished).items() if key != "completion_tokens_details"} == {
        "prompt_tokens": 140, "completion_tokens": 22, "total_tokens": 162,
        "prompt_tokens_details": {"cached_tokens": 64 + 16}}
    assert openarc_metrics(finished)["input_token"] == 140


def test_openarc_metrics_compute_only_the_prompt_tokens_not_reused():
    metrics = openarc_metrics([choice(11, cached=60, ttft=0.4, decode=2.0)])
    assert metrics["prefill_throughput"] == 100.0  # 40 computed tokens in 0.4 s
    assert metrics["decode_throughput"] == 5.0 and metrics["tpot"] == 0.2  # 10 tokens after the first, in 2 s
    assert (metrics["input_token"], metrics["new_token"], metrics["total_token"]) == (100, 11, 111)
