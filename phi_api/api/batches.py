"""OpenAI's Batch API's routes: ``/v1/files`` (purpose ``batch``) and ``/v1/batches``, as the ``openai`` SDK calls
them. The files and batches live in the store (:mod:`phi_api.storage.batches`, a resource of the app); each
worker's runner (:mod:`phi_api.batches`, started after the fork) runs the queued lines."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, jsonify, request

from phi_api.errors import (
    InvalidParameterError,
    MissingParameterError,
    NotFoundError,
    RequestTooLargeError,
    UnsupportedMediaTypeError,
)
from phi_api.web.auth import current_tenant
from phi_api.web.bodies import read_request
from phi_api.web.openapi import PAGE_QUERY, operation
from phi_api.web.paging import limit_arg, list_page, order_arg
from phi_api.web.resources import get_batches, get_settings
from phi_api.web.respond import count_request
from phi_api.web.transport import read_within

bp = Blueprint("batches", __name__)

PURPOSES = ("batch",)
FORM_BYTES = 64 * 1024  # a multipart body's parts beside the file: boundaries, headers, the purpose


# Files ----------------------------------------------------------------------------------------------


@bp.post("/v1/files")
@operation("Upload a file (purpose batch: a JSONL file of requests)", statuses=(400, 408, 413, 415))
def upload_file() -> Response:
    settings = get_settings()
    most = request.max_content_length = int(settings.BATCH_FILE_MB * 2**20)
    if request.content_length is not None and request.content_length > most:
        raise RequestTooLargeError(f"The upload is larger than the {settings.BATCH_FILE_MB:g} MB this server takes "
                                   "in a file (BATCH_FILE_MB).")
    if request.mimetype != "multipart/form-data":  # another form (urlencoded) is parsed whole, in pure Python
        raise UnsupportedMediaTypeError("POST /v1/files takes multipart/form-data (a purpose and a file).")
    count_request()  # an upload counts against its key's requests, as a generation does: before it is read
    owner, store = current_tenant().name, get_batches()
    # its room in the key's quota held before the body is read: a key's uploads in flight fit in it together
    reserved = store.reserve_upload(owner, request.content_length, most, settings.UPLOAD_READ_TIMEOUT + 600)
    if request.content_length is None and reserved.bytes is not None:  # chunked: spooled no further than its room
        request.max_content_length = min(most, reserved.bytes + FORM_BYTES)
    try:
        # werkzeug keeps a large upload in a temporary file, not in memory
        form, files = read_within(settings.UPLOAD_READ_TIMEOUT, lambda: (request.form, request.files))
        purpose = form.get("purpose")
        if not purpose:
            raise MissingParameterError("purpose is required.", param="purpose")
        if purpose not in PURPOSES:
            raise InvalidParameterError(f"purpose must be one of {', '.join(PURPOSES)}: this server keeps files "
                                        "for batches only.", param="purpose")
        upload = files.get("file")
        if upload is None:
            raise MissingParameterError("file is required (multipart/form-data).", param="file")
        return jsonify(store.add_file(upload.filename or "upload.jsonl", purpose, upload.stream, owner,
                                      reserved=reserved))
    finally:
        store.release_upload(reserved)


@bp.get("/v1/files")
@operation("List files (purpose, after, limit, order)", statuses=(400,),
           query=(("purpose", "string", "only the files of this purpose"), *PAGE_QUERY))
def list_files() -> Response:
    files, more = get_batches().files(request.args.get("purpose"), limit_arg(10_000), request.args.get("after"),
                                      order_arg(), current_tenant().scope)
    return jsonify(list_page(files, more))


@bp.get("/v1/files/<file_id>")
@operation("Retrieve a file", statuses=(404,))
def retrieve_file(file_id: str) -> Response:
    return jsonify(_file(file_id))


@bp.get("/v1/files/<file_id>/content")
@operation("A file's content", statuses=(404,))
def file_content(file_id: str) -> Response:
    found = _file(file_id)  # streamed a chunk at a time: a file is never held whole
    return Response(get_batches().chunks(file_id), mimetype="application/octet-stream",
                    headers={"Content-Disposition": f'attachment; filename="{_safe_name(found["filename"])}"',
                             "Content-Length": str(found["bytes"])})


@bp.delete("/v1/files/<file_id>")
@operation("Delete a file", statuses=(404,))
def delete_file(file_id: str) -> Response:
    if not get_batches().delete_file(file_id, current_tenant().scope):
        raise NotFoundError(f"No such File object: {file_id}", param="id")
    return jsonify({"id": file_id, "object": "file", "deleted": True})


# Batches --------------------------------------------------------------------------------------------


@bp.post("/v1/batches")
@operation("Create a batch", request="batch_create", statuses=(400,))
def create_batch() -> Response:
    body = read_request("batch_create")
    tenant = current_tenant()
    batch = get_batches().create_batch(body["input_file_id"], body["endpoint"], body["completion_window"],
                                       body.get("metadata"), tenant.name, tenant.scope)
    return jsonify(batch)


@bp.get("/v1/batches")
@operation("List batches (after, limit; newest first)", statuses=(400,), query=PAGE_QUERY[:2])
def list_batches() -> Response:
    batches, more = get_batches().batches(limit_arg(100), request.args.get("after"), current_tenant().scope)
    return jsonify(list_page(batches, more))


@bp.get("/v1/batches/<batch_id>")
@operation("Retrieve a batch", statuses=(404,))
def retrieve_batch(batch_id: str) -> Response:
    return jsonify(_batch(batch_id))


@bp.post("/v1/batches/<batch_id>/cancel")
@operation("Cancel a batch", statuses=(400, 404))
def cancel_batch(batch_id: str) -> Response:
    _batch(batch_id)
    return jsonify(get_batches().cancel(batch_id, current_tenant().scope))


def _batch(batch_id: str) -> dict[str, Any]:
    batch = get_batches().batch(batch_id, current_tenant().scope)
    if batch is None:
        raise NotFoundError(f"No batch found with id '{batch_id}'.", param="batch_id")
    return batch


def _file(file_id: str) -> dict[str, Any]:
    found = get_batches().file(file_id, current_tenant().scope)
    if found is None:
        raise NotFoundError(f"No such File object: {file_id}", param="id")
    return found


def _safe_name(filename: str) -> str:
    """A file name for a header: printable ASCII, no quotes or backslashes."""
    return "".join(char if " " <= char <= "~" and char not in '"\\' else "_" for char in filename) or "file"

