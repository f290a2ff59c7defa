"""The generation endpoints a Batch API line may name, and how a body sent to each is read: checked against its JSON
Schema, parsed into its typed request, and paired with its renderer. The routes read their bodies so, and a
batch's lines too (:mod:`phi_api.batches.lines`): one reading for both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from phi_api.protocols.contract import EncodeReading, Reading
from phi_api.protocols.conversations import conversation_history, conversation_keeper
from phi_api.protocols.embeddings import embed_request, embeddings_answer
from phi_api.protocols.openai.answer import Answer
from phi_api.protocols.openai.parse import chat_request, completion_request
from phi_api.protocols.openai.shapes import ChatShape, CompletionShape
from phi_api.protocols.rerank import rerank_answer, rerank_request, score_answer, score_request
from phi_api.protocols.response_objects import Identity, output_messages
from phi_api.protocols.responses import ResponseRenderer
from phi_api.protocols.responses_request import ResponsesRequest, history_of
from phi_api.service.encoding import EncodeRun
from phi_api.storage.conversations import ConversationStore
from phi_api.storage.responses import ResponseStore
from phi_api.web.schemas import RequestValidator


@dataclass(frozen=True)
class Needs:
    """What reading a body needs besides it: the schemas, the stored responses, and whose request it is (the key's
    name, and the owner whose stored responses it sees: None for every owner's)."""

    validator: RequestValidator
    store: ResponseStore
    conversations: ConversationStore
    owner: str
    scope: str | None


def chat(body: dict[str, Any], needs: Needs) -> Reading:
    """A ``/v1/chat/completions`` body."""
    needs.validator.validate("chat_completion", body)
    return Reading(chat_request(body, needs.validator.known_fields("chat_completion")),
                   lambda run: Answer(run, ChatShape))


def completion(body: dict[str, Any], needs: Needs) -> Reading:
    """A ``/v1/completions`` body."""
    needs.validator.validate("completion", body)
    return Reading(completion_request(body, needs.validator.known_fields("completion")),
                   lambda run: Answer(run, CompletionShape))


def response(body: dict[str, Any], needs: Needs, identity: Identity | None = None) -> Reading:
    """A ``/v1/responses`` body: after its predecessor's conversation (``previous_response_id``), and stored for
    follow-ups once answered unless ``store`` is false; ``identity``: a background response's, made when it was
    queued."""
    needs.validator.validate("responses", body)
    request = ResponsesRequest.from_openai(body)
    store = needs.store
    history: list[dict[str, Any]] | None
    if request.conversation_id is not None:
        history = conversation_history(request, needs.conversations, needs.scope)
    else:
        history = history_of(request, store, needs.scope)
    extend = conversation_keeper(request, needs.conversations, needs.scope)

    def keep(answered: dict[str, Any]) -> None:
        extend(answered)
        if request.store and store.max_items:
            store.put(answered, list(history or []) + list(request.input) + output_messages(answered), needs.owner,
                      trim=request.truncates)

    return Reading(request.chat(history), lambda run: ResponseRenderer(request, run, keep, identity))


def embeddings(body: dict[str, Any], needs: Needs) -> EncodeReading:
    """A ``/v1/embeddings`` body."""
    needs.validator.validate("embeddings", body)
    encoding_format = body.get("encoding_format") or "float"
    return EncodeReading(embed_request(body), lambda run, vectors: embeddings_answer(
        run.request.model, vectors, _tokens(run), encoding_format))


def rerank(body: dict[str, Any], needs: Needs, v2: bool = False) -> EncodeReading:
    """A rerank body (``v2``: sent to Cohere's ``/v2/rerank``)."""
    needs.validator.validate("rerank", body)
    return EncodeReading(rerank_request(body), lambda run, scores: rerank_answer(body, scores, _tokens(run), v2=v2))


def score(body: dict[str, Any], needs: Needs) -> EncodeReading:
    """A ``/v1/score`` body."""
    needs.validator.validate("score", body)
    return EncodeReading(score_request(body), lambda run, scores: score_answer(body["model"], scores, _tokens(run)))


def _tokens(run: EncodeRun) -> int:
    return sum(len(one) for one in run.inputs)


BATCHABLE: dict[str, Callable[[dict[str, Any], Needs], Reading | EncodeReading]] = {
    "/v1/chat/completions": chat, "/v1/completions": completion, "/v1/responses": response,
    "/v1/embeddings": embeddings}
