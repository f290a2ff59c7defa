"""What every protocol gives the one generation path: a typed request parsed from its body, and a renderer of the
run with the same two methods, the whole answer (:meth:`Renderer.whole`) and its stream (:meth:`Renderer.stream`),
framed on the wire as the protocol frames its streams (:class:`Framing`). The web layer's one ``respond``
(:mod:`phi_api.web.respond`) starts a run, then streams or collects it through these, for every protocol.

Adding a protocol is a parser, a renderer and a thin blueprint. An encoder's protocols (embeddings, reranking) give
:class:`EncodeReading`: a typed request and a function of its results, answered whole.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from phi_api.errors import APIError
from phi_api.service.choices import ChoiceResult
from phi_api.service.encoding import EncodeRun
from phi_api.service.generation import Run
from phi_api.service.requests import EncodeRequest, GenerationRequest


class Framing(enum.Enum):
    """How a protocol's stream goes on the wire."""

    SSE = "sse"  # server-sent events, a JSON object each, ended by ``data: [DONE]`` (OpenAI's)
    SSE_UNTERMINATED = "sse-unterminated"  # the same, ended by its last object (llama.cpp's server)
    NAMED_SSE = "named-sse"  # ``event: name`` then its JSON (Anthropic's, the Responses API's)
    NDJSON = "ndjson"  # one JSON object a line (Ollama's)


class Renderer(Protocol):
    """A protocol's answer for one run: whole, or streamed (objects, ``(name, object)`` pairs for named events,
    and ``KEEPALIVE`` in silences), and the event that ends a stream that failed (:func:`streamed`)."""

    framing: ClassVar[Framing]
    run: Run

    def whole(self, results: list[ChoiceResult]) -> dict[str, Any]: ...
    def stream(self) -> Iterator[Any]: ...
    def failed(self, error: APIError) -> Any: ...


def streamed(renderer: Renderer, mapped: Callable[[Exception], APIError]) -> Iterator[Any]:
    """``renderer``'s stream, ended by its :meth:`Renderer.failed` event when anything fails on the way: the
    engine's errors, and any other exception as ``mapped`` (the web layer's one table of foreign exceptions) makes
    it. Headers are sent by then: the protocol's own error event is all a client can still be told."""
    try:
        yield from renderer.stream()
    except Exception as exc:  # mapped to the tree: an unexpected one is a generic 500, its cause logged by ``mapped``
        yield renderer.failed(mapped(exc))


@dataclass(frozen=True)
class Reading:
    """A body read for the one generation path: its typed request, and the renderer its run is answered with."""

    request: GenerationRequest
    renderer: Callable[[Run], Renderer]


@dataclass(frozen=True)
class EncodeReading:
    """A body read for the encoding path (embeddings, scores): its typed request, and how its answer is made from
    the run and its results (vectors or scores, in the inputs' order)."""

    request: EncodeRequest
    renderer: Callable[[EncodeRun, np.ndarray], dict[str, Any]]


def given(body: dict[str, Any], key: str, default: Any = None) -> Any:
    """``body[key]``, where an explicit ``null`` counts as not given (as in OpenAI's API)."""
    value = body.get(key)
    return default if value is None else value
