"""Grammars beyond JSON Schema against real gunicorn and the real model, through the openai SDK (the fields go in
``extra_body``, as vLLM's users send them): whatever the model would say, the answer matches the grammar and ends
there, streamed or not; a grammar that cannot compile is a 400 at once, and the server goes on serving."""

from __future__ import annotations

import json
import re

import openai
import pytest

from tests.integration.conftest import MODEL_ID

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in a few words."}]
PHONE = r"[0-9]{3}-[0-9]{4}"
SENTENCE = re.compile(r"The answer is (yes|no)\.")


def chat(client, seed: int, **extra):
    return client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=48, temperature=1.0,
                                          seed=seed, extra_body=extra)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_choice_answers_one_of_the_choices(client, seed):
    choices = ["Paris", "London", "Rome"]
    for extra in ({"structured_outputs": {"choice": choices}}, {"guided_choice": choices}):
        answer = chat(client, seed, **extra).choices[0]
        assert answer.message.content in choices and answer.finish_reason == "stop", answer


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_regex_answer_matches_the_whole_regex(client, seed):
    for extra in ({"structured_outputs": {"regex": PHONE}}, {"guided_regex": PHONE}):
        answer = chat(client, seed, **extra).choices[0]
        assert re.fullmatch(PHONE, answer.message.content) and answer.finish_reason == "stop", answer


@pytest.mark.parametrize("extra", [
    {"grammar": 'root ::= "The answer is " ("yes" | "no") "."'},  # llama.cpp's field, GBNF
    {"structured_outputs": {"grammar": 'start: "The answer is " ("yes" | "no") "."'}},  # Lark
    {"guided_grammar": 'root ::= "The answer is " answer "."\nanswer ::= "yes" | "no"'},
], ids=["gbnf", "lark", "guided-gbnf"])
def test_a_grammar_answer_is_a_sentence_of_the_grammar_streamed_or_not(client, extra):
    whole = chat(client, 7, **extra).choices[0]
    assert SENTENCE.fullmatch(whole.message.content) and whole.finish_reason == "stop", whole
    chunks = client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=48, temperature=1.0,
                                            seed=8, stream=True, extra_body=extra)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert SENTENCE.fullmatch(streamed), streamed


def test_a_json_schema_given_as_text_in_guided_json(client):
    schema = {"type": "object", "properties": {"capital": {"enum": ["Paris", "Lyon"]}}, "required": ["capital"]}
    answer = chat(client, 4, guided_json=json.dumps(schema)).choices[0]
    assert json.loads(answer.message.content)["capital"] in ("Paris", "Lyon"), answer


def test_completions_take_a_grammar_too(client):
    answer = client.completions.create(model=MODEL_ID, prompt="Call me at", max_tokens=24, temperature=1.0,
                                       seed=5, extra_body={"structured_outputs": {"regex": " " + PHONE}})
    assert re.fullmatch(" " + PHONE, answer.choices[0].text), answer
    assert answer.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("extra,param", [
    ({"structured_outputs": {"regex": "([0-9]"}}, "structured_outputs.regex"),
    ({"grammar": "root ::= missing"}, "grammar"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_regex": "[a-z]+", "response_format": {"type": "json_object"}}, "guided_regex"),
])
def test_a_grammar_that_cannot_be_used_is_a_400_and_the_server_goes_on(client, extra, param):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as raised:
            client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=8, stream=stream,
                                           extra_body=extra)
        assert raised.value.body["param"] == param, raised.value.body
    answer = chat(client, 1, guided_choice=["still", "serving"]).choices[0]
    assert answer.message.content in ("still", "serving")


@pytest.mark.parametrize("choice", ["A\U000567c2", "A\x04"])  # bytes the default model's vocabulary has no token for
def test_a_grammar_the_vocabulary_cannot_spell_is_a_400_streamed_or_not(client, choice):
    with pytest.raises(openai.BadRequestError) as raised:
        chat(client, 1, guided_choice=[choice])
    assert "vocabulary" in raised.value.message
    with pytest.raises(openai.APIError) as raised:
        for _ in client.chat.completions.create(model=MODEL_ID, messages=QUESTION, max_tokens=8, stream=True,
                                                extra_body={"guided_choice": [choice]}):
            pass
    assert "vocabulary" in raised.value.message
