"""A reasoning model's thinking against real gunicorn, through each protocol's official client (openai, ollama,
anthropic), streamed and whole. The model is the tiny random-weight Phi-3 with two of its tokenizer's special
tokens renamed ``<think>`` and ``</think>`` (and, as in those models, not special: decoded as text), and a chat
template that opens the thinking at the end of the prompt, as DeepSeek-R1-Distill's does: the answer starts inside
it. Through the OpenAI route a grammar that spells the end
token drives the output, so what it thinks and answers is known whatever its weights say; the other clients get
the weights' own (greedy) words, all thinking until the end token comes."""

from __future__ import annotations

from pathlib import Path

import anthropic
import pytest
from ollama import Client
from openai import OpenAI

from tests.support.server import Server
from tests.support.tiny_phi3 import with_renamed_tokens

THINK_NAMES = {6: "<think>", 7: "</think>"}
GRAMMAR = 'start: "I should greet back." <[7]> "Hello there."'
TEMPLATE = ("{% for message in messages %}<|{{ message.role }}|>{{ message.content }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|><think>\n{% endif %}")
THOUGHT, ANSWER = "I should greet back.", "Hello there."
MESSAGES = [{"role": "user", "content": "Hi!"}]
QWEN3 = Path(__file__).resolve().parents[1] / "data" / "templates" / "qwen3.jinja"


def thinker_folder(tiny_phi3, root: Path, template: str) -> Path:
    """The tiny Phi-3 as a reasoning model: thinking markers in its tokenizer, and ``template`` as its template."""
    # not special: decoded as text, as Qwen3's and DeepSeek-R1's markers are
    folder = with_renamed_tokens(tiny_phi3, root / "model", THINK_NAMES, special=False)
    (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def thinker(tiny_phi3, tmp_path_factory, logs_dir):
    folder = thinker_folder(tiny_phi3, tmp_path_factory.mktemp("tiny-thinker"), TEMPLATE)
    # PREFIX_CACHE=exact: the same greedy request answers bit for bit the same, streamed or not
    with Server(logs_dir, MODEL_PATH=str(folder), MODEL_ID="tiny-thinker", WEB_CONCURRENCY=1,
                PREFIX_CACHE="exact") as running:
        yield running


@pytest.fixture(scope="module")
def qwen3(tiny_phi3, tmp_path_factory, logs_dir):
    folder = thinker_folder(tiny_phi3, tmp_path_factory.mktemp("tiny-qwen3"), QWEN3.read_text(encoding="utf-8"))
    with Server(logs_dir, MODEL_PATH=str(folder), MODEL_ID="tiny-thinker", WEB_CONCURRENCY=1) as running:
        yield running


def test_qwen3_s_template_turns_thinking_off_through_the_openai_sdk(qwen3):
    client = OpenAI(base_url=qwen3.url + "/v1", api_key="x", max_retries=0, timeout=120)

    def ask(grammar: str, **extra):
        return client.chat.completions.create(model="tiny-thinker", messages=MESSAGES, max_tokens=64,
                                              extra_body={"structured_outputs": {"grammar": grammar}, **extra})

    thinking = ask('start: <[6]> "I should greet back." <[7]> "Hello there."')
    assert (thinking.choices[0].message.reasoning_content, thinking.choices[0].message.content) == (THOUGHT, ANSWER)
    off = ask('start: "Hello there."', chat_template_kwargs={"enable_thinking": False})
    none = ask('start: "Hello there."', reasoning_effort="none")
    assert off.choices[0].message.content == none.choices[0].message.content == ANSWER
    assert off.choices[0].message.reasoning_content is None
    # the template wrote an empty thinking into the prompt: "<think>\n\n</think>\n\n", a few tokens more
    assert off.usage.prompt_tokens == none.usage.prompt_tokens > thinking.usage.prompt_tokens


def test_the_openai_sdk_reads_reasoning_content_apart_from_content(thinker):
    client = OpenAI(base_url=thinker.url + "/v1", api_key="x", max_retries=0, timeout=120)
    grammar = {"structured_outputs": {"grammar": GRAMMAR}}
    message = client.chat.completions.create(model="tiny-thinker", messages=MESSAGES, max_tokens=64,
                                             extra_body=grammar).choices[0].message
    assert (message.reasoning_content, message.content) == (THOUGHT, ANSWER)
    thought, answer = "", ""
    for chunk in client.chat.completions.create(model="tiny-thinker", messages=MESSAGES, max_tokens=64, stream=True,
                                                extra_body=grammar):
        delta = chunk.choices[0].delta if chunk.choices else None
        thought += getattr(delta, "reasoning_content", None) or ""
        answer += (delta.content or "") if delta else ""
    assert (thought, answer) == (THOUGHT, ANSWER)


def test_the_ollama_client_reads_message_thinking(thinker):
    ollama = Client(host=thinker.url)
    options = {"num_predict": 24, "temperature": 0}
    whole = ollama.chat(model="tiny-thinker", messages=MESSAGES, think=True, options=options)
    assert whole.done and whole.message.thinking  # the template opened the thinking: the words start there
    assert "<think>" not in whole.message.thinking + whole.message.content
    parts = list(ollama.chat(model="tiny-thinker", messages=MESSAGES, think=True, options=options, stream=True))
    streamed = ("".join(part.message.thinking or "" for part in parts), "".join(part.message.content for part in parts))
    assert streamed == (whole.message.thinking, whole.message.content)


def test_the_anthropic_sdk_reads_a_thinking_block(thinker):
    claude = anthropic.Anthropic(base_url=thinker.url, api_key="x", max_retries=0)
    greedy = {"temperature": 0}
    message = claude.messages.create(model="tiny-thinker", max_tokens=24, messages=MESSAGES, extra_body=greedy)
    assert message.content[0].type == "thinking" and message.content[0].thinking
    assert all(block.type == "text" for block in message.content[1:])
    with claude.messages.stream(model="tiny-thinker", max_tokens=24, messages=MESSAGES, extra_body=greedy) as stream:
        final = stream.get_final_message()
    assert [block.model_dump() for block in final.content] == [block.model_dump() for block in message.content]


def test_a_thinking_budget_ends_the_thinking_through_the_openai_sdk(thinker):
    client = OpenAI(base_url=thinker.url + "/v1", api_key="x", max_retries=0, timeout=120)
    free = client.chat.completions.create(model="tiny-thinker", messages=MESSAGES, max_tokens=16, temperature=0)
    assert free.choices[0].message.reasoning_content  # the template opened the thinking; the weights go on in it
    closed = client.chat.completions.create(model="tiny-thinker", messages=MESSAGES, max_tokens=16, temperature=0,
                                            extra_body={"thinking_token_budget": 0})
    assert closed.choices[0].message.reasoning_content is None  # </think> came first: every word is the answer
    assert closed.usage.completion_tokens >= 1 and "</think>" not in (closed.choices[0].message.content or "")
