"""``/v1/completions`` with a list of prompts (what lm-evaluation-harness sends in batches), against real gunicorn
and the real model through the openai SDK: one choice per prompt times ``n``, in prompt order, each the answer its
prompt gets alone (the engine's answers do not depend on what runs beside them), with usage counting each prompt
once."""

from __future__ import annotations

from tests.integration.conftest import MODEL_ID

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]


def alone(client, prompt: str) -> tuple[str, int, int]:
    answer = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12, temperature=0)
    return answer.choices[0].text, answer.usage.prompt_tokens, answer.usage.completion_tokens


def test_each_prompt_gets_its_own_choices_in_order(client):
    expected = [alone(client, prompt) for prompt in PROMPTS]
    answer = client.completions.create(model=MODEL_ID, prompt=PROMPTS, n=2, max_tokens=12, temperature=0)
    assert [choice.index for choice in answer.choices] == list(range(6))
    assert [choice.text for choice in answer.choices] == [text for text, _, _ in expected for _ in range(2)]
    assert answer.usage.prompt_tokens == sum(tokens for _, tokens, _ in expected)  # each prompt once
    assert answer.usage.completion_tokens == 2 * sum(tokens for _, _, tokens in expected)


def test_a_list_of_prompts_streams_each_choice_whole(client):
    expected = [alone(client, prompt)[0] for prompt in PROMPTS]
    texts: dict[int, str] = {}
    for chunk in client.completions.create(model=MODEL_ID, prompt=PROMPTS, max_tokens=12, temperature=0,
                                           stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert [texts[index] for index in range(len(PROMPTS))] == expected


def test_token_id_prompts_in_a_list_with_echo_and_logprobs(client):
    ids = [[504, 3575, 282], [17, 28, 216]]
    answer = client.completions.create(model=MODEL_ID, prompt=ids, max_tokens=0, echo=True, logprobs=1)
    assert len(answer.choices) == 2
    for choice, prompt in zip(answer.choices, ids, strict=True):
        assert len(choice.logprobs.tokens) == len(prompt) and choice.logprobs.token_logprobs[0] is None
