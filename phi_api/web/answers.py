"""Answering an OpenAI generation request: JSON, or server-sent events when it streams."""

from __future__ import annotations

from flask import Response

from phi_api.protocols.openai import Answer, Shape
from phi_api.service import generation
from phi_api.service.requests import GenerationRequest
from phi_api.web.http import answer_json, sse_response, start_generation
from phi_api.web.transport import disconnect_probe


def respond(shape: type[Shape], request: GenerationRequest) -> Response:
    """Run ``request`` and answer in ``shape`` (chat or completion): one JSON object, or its chunks as SSE."""
    run = start_generation(request)
    answer = Answer(shape(run, run.engine.token_bytes), request.model, run.engine.info.fingerprint)
    if request.stream:
        return sse_response(answer.chunks(), on_close=(run.close,))
    results = generation.collect(run, disconnect_probe())
    return answer_json(run, lambda: answer.whole(results))
