"""OpenAI's cursor pages, read from a request's query and written in the API's list shape: ``limit`` (1 to a
route's most, 20 by default), ``order`` (``asc`` or ``desc``, newest first by default) and the list object with
``first_id``, ``last_id`` and ``has_more``. Every listing route (files, batches, a conversation's items) reads and
writes its pages here."""

from __future__ import annotations

from typing import Any

from flask import request

from phi_api.errors import InvalidParameterError

DEFAULT_LIMIT = 20
ORDERS = ("asc", "desc")


def int_arg(name: str, default: int, lowest: int, most: int, meaning: str = "an integer") -> int:
    """The query's integer ``name`` (``default`` when absent); a 400 naming it when it is not ``meaning`` from
    ``lowest`` to ``most``. Only ASCII digits count: ``"²".isdigit()`` holds, but ``int()`` fails on it."""
    raw = request.args.get(name, str(default)).strip()
    digits = raw.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()) or not lowest <= int(raw) <= most:
        raise InvalidParameterError(f"{name} must be {meaning} from {lowest} to {most}.", param=name)
    return int(raw)


def limit_arg(most: int) -> int:
    """The page's ``limit`` (a 400 outside 1 to ``most``)."""
    return int_arg("limit", DEFAULT_LIMIT, 1, most)


def order_arg() -> str:
    """The page's ``order``: ``asc`` or ``desc`` (the default; a 400 for anything else)."""
    order = request.args.get("order", "desc")
    if order not in ORDERS:
        raise InvalidParameterError("order must be asc or desc.", param="order")
    return order


def list_page(items: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """OpenAI's list object over one page of ``items`` (each with an ``id``)."""
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": has_more}
