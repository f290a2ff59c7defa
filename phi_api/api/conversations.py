"""OpenAI's Conversations API: ``/v1/conversations`` and its items, as the ``openai`` SDK (and openai-agents'
``OpenAIConversationsSession``) call them. The conversations live in the store (:mod:`phi_api.storage.conversations`,
a resource of the app); a response that names one (``conversation``) reads and extends it
(:mod:`phi_api.web.endpoints`). A key sees only its own: another key's conversation is a 404, as one that never
was."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from phi_api.errors import InvalidParameterError, NotFoundError
from phi_api.protocols.conversations import conversation_object, deleted, kept_items
from phi_api.protocols.responses_request import input_messages, new_id
from phi_api.storage.conversations import ConversationFull
from phi_api.web.auth import current_tenant
from phi_api.web.bodies import read_request
from phi_api.web.openapi import PAGE_QUERY, operation
from phi_api.web.paging import limit_arg, list_page, order_arg
from phi_api.web.resources import get_conversations

bp = Blueprint("conversations", __name__)
MOST_LISTED = 100  # OpenAI's limit on a page of items


@bp.post("/v1/conversations")
@operation("Create a conversation (with its first items and metadata)", request="conversation_create",
           statuses=(400,))
def create_conversation() -> Response:
    body = read_request("conversation_create")
    items = _checked(body.get("items") or [])
    conversation_id, metadata, tenant = new_id("conv"), body.get("metadata") or {}, current_tenant()
    try:
        created = get_conversations().create(conversation_id, metadata, items, tenant.name)
    except ConversationFull as full:
        raise InvalidParameterError(str(full), param="items") from None
    return jsonify(conversation_object(conversation_id, created, metadata))


@bp.get("/v1/conversations/<conversation_id>")
@operation("Retrieve a conversation", statuses=(404,))
def retrieve_conversation(conversation_id: str) -> Response:
    return jsonify(_conversation(conversation_id))


@bp.post("/v1/conversations/<conversation_id>")
@operation("Update a conversation's metadata", request="conversation_update", statuses=(400, 404))
def update_conversation(conversation_id: str) -> Response:
    metadata = read_request("conversation_update").get("metadata") or {}
    if not get_conversations().update(conversation_id, metadata, current_tenant().scope):
        raise _not_found(conversation_id)
    return jsonify(_conversation(conversation_id))


@bp.delete("/v1/conversations/<conversation_id>")
@operation("Delete a conversation and its items", statuses=(404,))
def delete_conversation(conversation_id: str) -> Response:
    if not get_conversations().delete(conversation_id, current_tenant().scope):
        raise _not_found(conversation_id)
    return jsonify(deleted(conversation_id))


@bp.get("/v1/conversations/<conversation_id>/items")
@operation("List a conversation's items (after, limit, order)", statuses=(400, 404), query=PAGE_QUERY)
def list_items(conversation_id: str) -> Response:
    page = get_conversations().items(conversation_id, current_tenant().scope, after=request.args.get("after"),
                                     limit=limit_arg(MOST_LISTED), descending=order_arg() == "desc")
    if page is None:
        raise _not_found(conversation_id)
    return jsonify(list_page(page.items, page.has_more))


@bp.post("/v1/conversations/<conversation_id>/items")
@operation("Add items to a conversation", request="conversation_items", statuses=(400, 404))
def add_items(conversation_id: str) -> Response:
    items = _checked(read_request("conversation_items")["items"])
    try:
        added = get_conversations().add(conversation_id, items, current_tenant().scope)
    except ConversationFull as full:
        raise InvalidParameterError(str(full), param="items") from None
    if not added:
        raise _not_found(conversation_id)
    return jsonify(list_page(items, False))


@bp.get("/v1/conversations/<conversation_id>/items/<item_id>")
@operation("Retrieve an item of a conversation", statuses=(404,))
def retrieve_item(conversation_id: str, item_id: str) -> Response:
    found = get_conversations().item(conversation_id, item_id, current_tenant().scope)
    if found is None:
        raise NotFoundError(f"Item with id '{item_id}' not found.", param="item_id")
    return jsonify(found)


@bp.delete("/v1/conversations/<conversation_id>/items/<item_id>")
@operation("Delete an item of a conversation (answers the conversation)", statuses=(404,))
def delete_item(conversation_id: str, item_id: str) -> Response:
    if not get_conversations().delete_item(conversation_id, item_id, current_tenant().scope):
        raise NotFoundError(f"Item with id '{item_id}' not found.", param="item_id")
    return jsonify(_conversation(conversation_id))


def _checked(given: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items as kept, each readable as a chat message (400 for what this text model cannot read)."""
    items = kept_items(given)
    input_messages(items)
    return items


def _conversation(conversation_id: str) -> dict[str, Any]:
    found = get_conversations().conversation(conversation_id, current_tenant().scope)
    if found is None:
        raise _not_found(conversation_id)
    return conversation_object(conversation_id, *found)


def _not_found(conversation_id: str) -> NotFoundError:
    return NotFoundError(f"Conversation with id '{conversation_id}' not found.", param="conversation_id")

