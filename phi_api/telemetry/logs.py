"""Logging: one line per request, one per generation, errors with their traceback.

Every line carries the request id (``X-Request-Id``: the client's when it
sends a sane one, generated otherwise). Only the method and the path are
logged: never bodies, query strings or headers, where keys and prompts live.
With ``LOG_FORMAT=json`` each line is one JSON object: the time, level,
process, request id, logger and message, and the fields the line carries
(``extra={"fields": {...}}``: a request's method, path, status, time and key
name, never the key; a generation's model, finish reason, tokens and times).

A client's text (a path, a model name, an id, an exception's message) reaches log lines as arguments. In text logs
every control character of an argument (C0, DEL, C1: a line break, a carriage return, a terminal's escape; the
Unicode line separators and bidi controls) is written as an escape (``\\n``, ``\\x1b``, ``\\u2028``), and every
line of a traceback (``exc_info``, or a traceback's text given as ``extra={"traceback": ...}``) is indented: no
client can forge a line or drive a terminal.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import uuid

REQUEST_ID_HEADER = "X-Request-Id"
_SANE_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_FORMAT = "%(asctime)s %(levelname)s [%(process)d] [%(request_id)s] %(name)s: %(message)s"


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = _request_id.get()
        return True


# C0, DEL and C1; the line and paragraph separators (str.splitlines() and log viewers break lines there); the bidi
# controls (they reverse how the rest of a line reads)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
TRACEBACK_INDENT = "  "


def escape_control(text: str) -> str:
    """``text`` with each control character (C0, DEL, C1, line separators, bidi controls) written as an escape."""
    return _CONTROL.sub(lambda found: _NAMED.get(found.group(), _escape(ord(found.group()))), text)


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def _escaped(value: object) -> object:
    """A log argument as a text log may show it: numbers as they are (``%d`` needs them), anything else as its text
    with control characters escaped."""
    if isinstance(value, (int, float)):
        return value
    return escape_control(str(value))


def _traceback(record: logging.LogRecord, formatter: logging.Formatter) -> str:
    """The record's traceback: its exception's, or the text given as ``extra={"traceback": ...}`` ("": none)."""
    if record.exc_info:
        return formatter.formatException(record.exc_info)
    return str(getattr(record, "traceback", "") or "")


class TextFormatter(logging.Formatter):
    """Text lines, one per record, that no argument can break or forge (see the module's docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        args: object = record.args
        if isinstance(args, tuple):
            args = tuple(_escaped(value) for value in args)
        elif isinstance(args, dict):
            args = {name: _escaped(value) for name, value in args.items()}
        message = str(record.msg) if not isinstance(record.msg, str) else record.msg
        record.message = escape_control(message) if not isinstance(record.msg, str) else (
            message % args if args else message)
        record.asctime = self.formatTime(record, self.datefmt)
        line = self.formatMessage(record)
        trace = _traceback(record, self)
        if trace:
            line += "".join("\n" + TRACEBACK_INDENT + escape_control(part) for part in trace.splitlines())
        return line


class JSONFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        line = {"time": self.formatTime(record), "level": record.levelname, "pid": record.process,
                "request_id": getattr(record, "request_id", "-"), "logger": record.name,
                "message": record.getMessage(), **getattr(record, "fields", {})}
        trace = _traceback(record, self)
        if trace:
            line["traceback"] = trace
        text = json.dumps(line, ensure_ascii=False, default=str)
        # JSON may hold the line separators raw; splitlines() and log viewers would break the line there
        return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def configure_logging(level: str, fmt: str = "text") -> None:
    """Send the ``phi_api`` loggers to stderr at ``level``, as text or JSON lines (``fmt``; idempotent)."""
    logger = logging.getLogger("phi_api")
    logger.setLevel(level)
    logger.propagate = False
    handler = next((handler for handler in logger.handlers if isinstance(handler, _PhiApiHandler)), None)
    if handler is None:
        handler = _PhiApiHandler(sys.stderr)
        handler.addFilter(_RequestIdFilter())
        logger.addHandler(handler)
    handler.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter(_FORMAT))


def gunicorn_logconfig(level: str, fmt: str) -> dict:
    """gunicorn's ``logconfig_dict``: with ``fmt`` json, its own lines (start-up, workers, errors) as JSON lines on
    stderr like ours; empty (gunicorn's plain lines) otherwise."""
    if fmt != "json":
        return {}
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {"version": 1, "disable_existing_loggers": False,
            "formatters": {"json": {"()": JSONFormatter}},
            "handlers": {"console": handler, "error_console": handler},
            "root": {"level": level, "handlers": ["console"]},
            "loggers": {"gunicorn.error": {"level": level, "handlers": ["error_console"], "propagate": False},
                        # phi-api writes its own line per request (with the request id): gunicorn's stays off.
                        "gunicorn.access": {"level": "CRITICAL", "handlers": [], "propagate": False}}}


def startup_error(message: str, fmt: str) -> str:
    """The line saying why the server cannot start: JSON with ``fmt`` json (read raw: the settings may be what is
    wrong), plain text otherwise."""
    if fmt.strip().lower() != "json":
        return f"phi-api: {message}"
    record = logging.LogRecord("phi_api.server", logging.ERROR, __file__, 0, message, None, None)
    return JSONFormatter().format(record)


class _PhiApiHandler(logging.StreamHandler):
    """Our stderr handler (a class of its own so configuring twice adds it once)."""


def current_request_id() -> str:
    """The id of the request being served ("-" outside requests)."""
    return _request_id.get()


def bind_request_id(request_id: str) -> contextvars.Token[str]:
    """Log lines written from here on (in this context) carry ``request_id``; reset with the token."""
    return _request_id.set(request_id)


def reset_request_id(token: contextvars.Token[str]) -> None:
    _request_id.reset(token)


def sane_request_id(incoming: str) -> str:
    """A client's ``X-Request-Id`` when it is a sane one, else a fresh id."""
    return incoming if _SANE_REQUEST_ID.match(incoming) else uuid.uuid4().hex
