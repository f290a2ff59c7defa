"""OpenAI's answer to a run, in either shape: the whole response object (JSON), or its chunks (server-sent events),
with OpenAI's usage object (and OpenArc's metrics, which phi-api adds)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from phi_api.engine import Finished
from phi_api.errors import APIError, openai_body
from phi_api.protocols.contract import Framing
from phi_api.protocols.openai.shapes import Envelope, Shape
from phi_api.protocols.openarc import metrics
from phi_api.service.choices import Calls, ChoiceResult, Prompt, Text, Thinking
from phi_api.service.generation import KEEPALIVE, Run, cached_tokens, events


def usage(finished: list[Finished]) -> dict[str, Any]:
    """OpenAI's usage object for a request's choices (each prompt counts once)."""
    prompt = sum(choice.prompt_tokens for choice in finished if choice.first_of_prompt)
    completion = sum(choice.completion_tokens for choice in finished)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached_tokens(finished)},
        "completion_tokens_details": {  # of the request's predicted output: draft tokens kept, and refused
            "accepted_prediction_tokens": sum(choice.predicted_accepted for choice in finished),
            "rejected_prediction_tokens": sum(choice.predicted_rejected for choice in finished)},
    }


class Answer:
    """A run's answer in OpenAI's shape (``kind``: :class:`.shapes.ChatShape` or :class:`.shapes.CompletionShape`):
    :meth:`whole` for JSON, :meth:`stream` for server-sent events."""

    framing: ClassVar[Framing] = Framing.SSE

    def __init__(self, run: Run, kind: type[Shape]) -> None:
        self.run = run
        self.shape = kind(run, run.engine.token_bytes)
        self.envelope = Envelope(f"{kind.id_prefix}-{uuid.uuid4().hex}", int(time.time()), run.request.model,
                                 run.engine.info.fingerprint)

    def whole(self, results: list[ChoiceResult]) -> dict[str, Any]:
        """The response object of a finished run."""
        finished = [result.ended.finished for result in results]
        return self.envelope.wrap(self.shape.object, [self.shape.whole(result) for result in results],
                                  usage=usage(finished), metrics=metrics(finished))

    def stream(self) -> Iterator[Any]:
        """The stream's chunks (and ``KEEPALIVE``)."""
        shape, run = self.shape, self.shape.run
        include_usage = run.request.include_usage
        extra = {"usage": None} if include_usage else {}

        def chunk(choice: dict[str, Any], **more: Any) -> dict[str, Any]:
            return self.envelope.wrap(shape.chunk_object, [choice], **{**extra, **more})

        for index in range(len(run.plan.params)):
            for choice in shape.opening(index):
                yield chunk(choice)
        finished = []
        for event in events(run):
            if event is KEEPALIVE:
                yield KEEPALIVE
            elif isinstance(event, Text):
                yield chunk(shape.chunk_text(event))
            elif isinstance(event, Calls):
                for choice in shape.chunk_calls(event):
                    yield chunk(choice)
            elif isinstance(event, Thinking):
                for choice in shape.chunk_thinking(event):
                    yield chunk(choice)
            elif isinstance(event, Prompt):
                yield from _prompt_chunks(run, shape, chunk, event)
            else:
                finished.append(event.finished)
                last = len(finished) == len(run.plan.params) and not include_usage
                # The very last chunk also carries the request's metrics (OpenArc's).
                yield chunk(shape.chunk_done(event), **({"metrics": metrics(finished)} if last else {}))
        if include_usage:
            ordered = sorted(finished, key=lambda done: done.index)
            yield self.envelope.wrap(shape.chunk_object, [], usage=usage(ordered), metrics=metrics(ordered))

    def failed(self, error: APIError) -> dict[str, Any]:
        """The error object that ends a stream that failed."""
        return openai_body(error)


def _prompt_chunks(run: Run, shape: Shape, chunk: Callable[..., dict[str, Any]], event: Prompt) -> list[dict[str, Any]]:
    """The scored prompt's chunks, made off the hub (:meth:`Run.scored`)."""
    return run.scored(lambda: [chunk(choice) for choice in shape.chunk_prompt(event)])
