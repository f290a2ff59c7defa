"""OpenAI's Conversations API, in its own shapes: items as a conversation keeps them, the conversation object, and
the answers to deletions (pages of items: :mod:`phi_api.web.paging`).

An item given (by ``POST /v1/conversations``, ``.../items``, or a response's input) is kept in the shape OpenAI
lists it in: a message with its content as parts (``input_text`` for what the user, system or developer said,
``output_text`` for the assistant), a ``function_call``, a ``function_call_output`` or a ``reasoning`` item, each
with a ``status`` and an ``id`` of its kind, a new one (a client that adds a response's output items back, as
openai-agents' session does, would give ids already kept). A response's conversation is its items read back as
chat messages (:func:`phi_api.protocols.responses_request.input_messages`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from phi_api.errors import InvalidParameterError, NotFoundError, UnsupportedParameterError
from phi_api.protocols.responses_request import ResponsesRequest, input_messages, new_id
from phi_api.storage.conversations import ConversationFull, ConversationStore

OUTPUT_ITEMS_MOST = 8  # room kept for a response's output items when it is checked before it runs
_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}
_OUTPUT_ROLES = ("assistant",)


def kept_items(given: Any, param: str = "items") -> list[dict[str, Any]]:
    """Items as the conversation keeps them (a string: one user message); 400 for a kind it cannot hold."""
    if isinstance(given, str):
        given = [{"type": "message", "role": "user", "content": given}]
    return [_kept(item, f"{param}[{index}]") for index, item in enumerate(given)]


def _kept(item: dict[str, Any], where: str) -> dict[str, Any]:
    kind = item.get("type", "message")
    if kind not in _ID_PREFIX:
        raise UnsupportedParameterError(f"{where}: items of type '{kind}' are not supported.", param=where)
    kept = {**item, "type": kind, "id": new_id(_ID_PREFIX[kind])}  # its own: ids given may repeat
    if kind == "message":
        kept["content"] = _parts(item.get("content"), item.get("role"))
    if kind != "reasoning":
        kept.setdefault("status", "completed")
    return kept


def _parts(content: Any, role: Any) -> list[dict[str, Any]]:
    """A message's content as parts (a string: one text part of the role's kind)."""
    if isinstance(content, str):
        kind = "output_text" if role in _OUTPUT_ROLES else "input_text"
        return [{"type": kind, "text": content, **({"annotations": []} if kind == "output_text" else {})}]
    return list(content or [])


def conversation_object(conversation_id: str, created: float, metadata: dict[str, str]) -> dict[str, Any]:
    """OpenAI's conversation object."""
    return {"id": conversation_id, "object": "conversation", "created_at": int(created), "metadata": metadata}


def deleted(conversation_id: str) -> dict[str, Any]:
    """The answer to a conversation's deletion."""
    return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}


def conversation_history(request: ResponsesRequest, store: ConversationStore,
                         scope: str | None) -> list[dict[str, Any]]:
    """The conversation a response names, as chat messages (404 when it is not there, or not ``scope``'s); 400
    when the response's items would not fit in it. Read whole: its key's byte budget (``max_bytes``) bounds it."""
    assert request.conversation_id is not None
    page = store.items(request.conversation_id, scope)
    if page is None:
        raise NotFoundError(f"Conversation with id '{request.conversation_id}' not found.", param="conversation")
    if len(page.items) + len(request.input) + OUTPUT_ITEMS_MOST > store.max_items:
        raise InvalidParameterError(f"The conversation holds {len(page.items)} items: this response's would pass "
                                    f"the {store.max_items} this server keeps in one.", param="conversation")
    return input_messages(page.items)


def conversation_keeper(request: ResponsesRequest, store: ConversationStore,
                        scope: str | None) -> Callable[[dict[str, Any]], None]:
    """What adds a finished response's input and output items to its conversation (nothing without one)."""
    conversation_id = request.conversation_id
    if conversation_id is None:
        return lambda answered: None
    given = kept_items(request.body["input"], "input")

    def extend(answered: dict[str, Any]) -> None:
        try:
            if not store.add(conversation_id, given + list(answered["output"]), scope):
                raise NotFoundError(f"Conversation with id '{conversation_id}' not found.", param="conversation")
        except ConversationFull as full:
            raise InvalidParameterError(str(full), param="conversation") from None

    return extend
