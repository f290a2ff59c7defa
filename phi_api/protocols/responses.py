"""OpenAI's Responses API over the one generation path: its typed request
(:mod:`phi_api.protocols.responses_request`) and :class:`ResponseRenderer`, which shapes the run's events as the
response object (:mod:`phi_api.protocols.response_objects`), or as the documented stream of events with their
``sequence_number``. A background response (``background: true``) is queued with its identity and run later by a
worker (:mod:`phi_api.background`); its renderer then goes on from the events told when it was queued.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

from phi_api.errors import APIError
from phi_api.protocols.contract import Framing
from phi_api.protocols.response_objects import (
    QUEUED_EVENTS,
    Identity,
    call_item,
    message_item,
    reasoning_item,
    response_object,
    status_of,
)
from phi_api.protocols.responses_request import ResponsesRequest, new_id
from phi_api.service.choices import Calls, ChoiceResult, Done, Text, Thinking
from phi_api.service.generation import KEEPALIVE, Run, events
from phi_api.service.tools import ToolCall


class ResponseRenderer:
    """A run's answer as a Responses API response object, or as its stream of events; ``keep`` is given the
    finished response (to store it) before it is answered."""

    framing: ClassVar[Framing] = Framing.NAMED_SSE

    def __init__(self, request: ResponsesRequest, run: Run,
                 keep: Callable[[dict[str, Any]], None] = lambda response: None,
                 identity: Identity | None = None) -> None:
        self.request = request
        self.run = run
        self.keep = keep
        self.identity = identity or Identity()
        self.id = self.identity.id
        # a background response's run goes on from the events told when it was queued (queued_response())
        self._sequence = len(QUEUED_EVENTS) if self.identity.background else 0
        self._output: list[dict[str, Any]] = []  # a stream's items done so far (a failed response holds them)

    # The whole response ---------------------------------------------------------------------------------

    def response(self, status: str, output: list[dict[str, Any]], done: Done | None = None,
                 error: dict[str, Any] | None = None) -> dict[str, Any]:
        """The response object (``status``: in_progress, completed, incomplete or failed)."""
        return response_object(self.request, self.identity, status, output, done, error)

    def whole(self, results: list[ChoiceResult]) -> dict[str, Any]:
        """The finished response object of a collected run (kept first)."""
        [result] = results
        status = status_of(result.ended)
        output = [reasoning_item(new_id("rs"), result.reasoning)] if result.reasoning else []
        # the text around a family's calls (those that may start anywhere) before them, as a stream tells it
        output += [message_item(new_id("msg"), result.text, status)] if result.text or not result.calls else []
        output += [call_item(new_id("fc"), call, status) for call in result.calls]
        response = self.response(status, output, result.ended)
        self.keep(response)
        return response

    # The stream ------------------------------------------------------------------------------------------

    def stream(self) -> Iterator[Any]:
        """The documented events, each ``(type, data)`` with its ``sequence_number`` (and ``KEEPALIVE``). The
        finished response is kept before ``response.completed``. A background response told ``response.created``
        when it was queued (:func:`phi_api.protocols.response_objects.queued_response`)."""
        if not self.identity.background:
            yield self._event("response.created", response=self.response("in_progress", []))
        yield self._event("response.in_progress", response=self.response("in_progress", []))
        output = self._output
        message: dict[str, Any] | None = None
        thinking: dict[str, Any] | None = None  # the reasoning item, while the model thinks
        calls: tuple[ToolCall, ...] = ()  # told at the end: only then is it known whether they were cut short
        for event in events(self.run):
            if event is KEEPALIVE:
                yield KEEPALIVE
            elif isinstance(event, Thinking):
                if thinking is None:
                    thinking = reasoning_item(new_id("rs"), "")
                    yield self._event("response.output_item.added", output_index=len(output),
                                      item={**thinking, "content": []})
                thinking["content"][0]["text"] += event.text
                yield self._event("response.reasoning_text.delta", item_id=thinking["id"],
                                  output_index=len(output), content_index=0, delta=event.text)
                continue
            if thinking is not None:  # the thinking is over: its item is done
                yield from self._close_reasoning(len(output), thinking)
                output.append(thinking)
                thinking = None
            if isinstance(event, Text) and event.text:
                if message is None:
                    message = message_item(new_id("msg"), "", "in_progress")
                    yield from self._open_message(len(output), message)
                message["content"][0]["text"] += event.text
                yield self._event("response.output_text.delta", item_id=message["id"], output_index=len(output),
                                  content_index=0, delta=event.text, logprobs=[])
            elif isinstance(event, Calls):
                calls = event.calls
            elif isinstance(event, Done):
                yield from self._finish(event, output, message, calls)

    def failed(self, error: APIError) -> tuple[str, dict[str, Any]]:
        """``response.failed``, which ends a stream that failed, with the items done so far."""
        failure = {"code": "server_error", "message": error.message}
        return self._event("response.failed", response=self.response("failed", self._output, error=failure))

    def _finish(self, done: Done, output: list[dict[str, Any]], message: dict[str, Any] | None,
                calls: tuple[ToolCall, ...]) -> Iterator[Any]:
        """The items still open, then ``response.completed`` (or ``.incomplete``)."""
        status = status_of(done)
        if message is not None:
            message["status"] = status
            yield from self._close_message(len(output), message)
            output.append(message)
        for call in calls:
            item = call_item(new_id("fc"), call, status)
            yield from self._call_events(len(output), item)
            output.append(item)
        response = self.response(status, output, done)
        self.keep(response)
        kind = "response.completed" if status == "completed" else "response.incomplete"
        yield self._event(kind, response=response)

    def _open_message(self, index: int, message: dict[str, Any]) -> Iterator[Any]:
        yield self._event("response.output_item.added", output_index=index, item={**message, "content": []})
        yield self._event("response.content_part.added", item_id=message["id"], output_index=index, content_index=0,
                          part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})

    def _close_reasoning(self, index: int, item: dict[str, Any]) -> Iterator[Any]:
        yield self._event("response.reasoning_text.done", item_id=item["id"], output_index=index, content_index=0,
                          text=item["content"][0]["text"])
        yield self._event("response.output_item.done", output_index=index, item=item)

    def _close_message(self, index: int, message: dict[str, Any]) -> Iterator[Any]:
        part = message["content"][0]
        yield self._event("response.output_text.done", item_id=message["id"], output_index=index, content_index=0,
                          text=part["text"], logprobs=[])
        yield self._event("response.content_part.done", item_id=message["id"], output_index=index, content_index=0,
                          part=part)
        yield self._event("response.output_item.done", output_index=index, item=message)

    def _call_events(self, index: int, item: dict[str, Any]) -> Iterator[Any]:
        yield self._event("response.output_item.added", output_index=index,
                          item={**item, "arguments": "", "status": "in_progress"})
        yield self._event("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                          delta=item["arguments"])
        yield self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                          name=item["name"], arguments=item["arguments"])
        yield self._event("response.output_item.done", output_index=index, item=item)

    def _event(self, kind: str, **data: Any) -> tuple[str, dict[str, Any]]:
        event = {"type": kind, "sequence_number": self._sequence, **data}
        self._sequence += 1
        return kind, event
