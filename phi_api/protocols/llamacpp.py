"""llama.cpp server's ``/infill`` (what its editor plugins, llama.vim and llama.vscode, call): the code around a
hole and llama.cpp's sampling names as a typed completion request, and its answer in llama.cpp's shape (``content``,
``stop``, ``stop_type``, the token counts and ``timings``), whole or as server-sent events.

Repository context (``input_extra``) goes before the prompt as its files' text; the model's own repository tokens
(Qwen2.5-Coder's ``<|repo_name|>``, ``<|file_sep|>``) are not used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from phi_api.errors import APIError, openai_body
from phi_api.protocols.contract import Framing, given
from phi_api.service.choices import ChoiceResult, Done, Text
from phi_api.service.generation import KEEPALIVE, Run, events
from phi_api.service.requests import CompletionRequest, Infill, Sampling

# how an answer ended, in llama.cpp's words
_STOP_TYPES = {"stop": "eos", "length": "limit"}


def infill_request(body: dict[str, Any], default_model: str) -> CompletionRequest:
    """A schema-valid ``/infill`` body (``model`` may be left out: the server's first model, as llama.cpp serves
    one)."""
    extra = "".join(chunk.get("text") or "" for chunk in given(body, "input_extra", []))
    infill = Infill(suffix=given(body, "input_suffix", ""), extra=extra, tail=given(body, "prompt", ""))
    return CompletionRequest(model=given(body, "model", default_model), prompt=given(body, "input_prefix", ""),
                             infill=infill, sampling=_sampling(body), stream=bool(given(body, "stream", False)),
                             cache_salt=given(body, "cache_salt"))


def _sampling(body: dict[str, Any]) -> Sampling:
    n_predict, seed, stop = given(body, "n_predict", -1), given(body, "seed", -1), given(body, "stop", [])
    return Sampling(
        max_tokens=n_predict if n_predict >= 0 else None, limit_param="n_predict",
        temperature=given(body, "temperature"), top_p=given(body, "top_p"), top_k=given(body, "top_k"),
        min_p=given(body, "min_p"), seed=seed if seed >= 0 else None, stop=tuple(stop),
        presence_penalty=given(body, "presence_penalty"), frequency_penalty=given(body, "frequency_penalty"),
        repetition_penalty=given(body, "repeat_penalty"),
    )


class InfillReply:
    """llama.cpp's answer objects for one run."""

    framing: ClassVar[Framing] = Framing.SSE_UNTERMINATED

    def __init__(self, run: Run) -> None:
        self.run = run

    def part(self, text: str) -> dict[str, Any]:
        """A streamed piece of the answer."""
        return {"content": text, "stop": False, "index": 0, "model": self.run.request.model}

    def final(self, result: ChoiceResult, text: str) -> dict[str, Any]:
        """The last object: the text it still carries, why it ended, the counts and the timings."""
        finished = result.ended.finished
        stop_type = "word" if finished.stop_string else _STOP_TYPES.get(finished.reason, "none")
        ttft, decode = finished.time_to_first_token or 0.0, finished.decode_seconds
        computed = finished.prompt_tokens - finished.cached_tokens
        return {**self.part(text), "stop": True, "stop_type": stop_type, "stopping_word": finished.stop_string or "",
                "tokens_predicted": finished.completion_tokens, "tokens_evaluated": finished.prompt_tokens,
                "tokens_cached": finished.cached_tokens, "truncated": False,
                "timings": {"prompt_n": computed, "prompt_ms": ttft * 1000,
                            "predicted_n": finished.completion_tokens, "predicted_ms": decode * 1000}}

    def whole(self, results: list[ChoiceResult]) -> dict[str, Any]:
        """The one object of a non-streaming answer."""
        [result] = results
        return self.final(result, result.text)

    def stream(self) -> Iterator[Any]:
        """The objects of a stream (and ``KEEPALIVE``): pieces, then the last one."""
        result = ChoiceResult(0)
        for event in events(self.run):
            if event is KEEPALIVE:
                yield KEEPALIVE
            elif isinstance(event, Text):
                if event.text:
                    yield self.part(event.text)
            elif isinstance(event, Done):
                result.take(event)
                yield self.final(result, "")

    def failed(self, error: APIError) -> dict[str, Any]:
        """The error object that ends a stream that failed."""
        return openai_body(error)
