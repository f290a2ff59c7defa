"""OpenArc's bench (``/openarc/bench``, ``/v1/bench``): token ids in, its performance figures out, with OpenArc's
names; the same figures phi-api adds to OpenAI's answers (``metrics``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from phi_api.engine import Finished
from phi_api.errors import APIError, openai_body
from phi_api.protocols.contract import Framing
from phi_api.service.choices import ChoiceResult, Done
from phi_api.service.generation import KEEPALIVE, Run, cached_tokens, events
from phi_api.service.requests import CompletionRequest, Sampling


def metrics(finished: list[Finished]) -> dict[str, Any]:
    """Performance figures of a request, with OpenArc's names (seconds; tokens per second)."""
    prompt = sum(choice.prompt_tokens for choice in finished if choice.first_of_prompt)
    new = sum(choice.completion_tokens for choice in finished)
    ttft = min((choice.time_to_first_token for choice in finished if choice.time_to_first_token is not None),
               default=0.0)
    decode = max(choice.decode_seconds for choice in finished)
    computed = prompt - cached_tokens(finished)
    decoded = sum(max(choice.completion_tokens - 1, 0) for choice in finished)
    return {
        "ttft": round(ttft, 6),
        "prefill_throughput": round(computed / ttft, 3) if ttft else 0.0,
        "decode_throughput": round(decoded / decode, 3) if decode else 0.0,
        "decode_duration": round(decode, 6),
        "tpot": round(decode / decoded, 6) if decoded else 0.0,
        "input_token": prompt,
        "new_token": new,
        "total_token": prompt + new,
    }


def bench_request(body: dict[str, Any]) -> CompletionRequest:
    """A schema-valid bench body: generate from its token ids, the end of sequence ignored."""
    sampling = Sampling(max_tokens=body.get("max_tokens"), temperature=body.get("temperature"),
                        top_p=body.get("top_p"), top_k=body.get("top_k"),
                        repetition_penalty=body.get("repetition_penalty"), ignore_eos=True)
    return CompletionRequest(model=body["model"], prompt=body["input_ids"], sampling=sampling)


class BenchReport:
    """The bench's answer: the run's metrics, once it has ended (its stream is that one object)."""

    framing: ClassVar[Framing] = Framing.SSE

    def __init__(self, run: Run) -> None:
        self.run = run

    def whole(self, results: list[ChoiceResult]) -> dict[str, Any]:
        return {"metrics": metrics([result.ended.finished for result in results])}

    def stream(self) -> Iterator[Any]:
        ended = []
        for event in events(self.run):
            if event is KEEPALIVE:
                yield KEEPALIVE
            elif isinstance(event, Done):
                ended.append(event.finished)
        yield {"metrics": metrics(ended)}

    def failed(self, error: APIError) -> dict[str, Any]:
        """The error object that ends a bench that failed."""
        return openai_body(error)
