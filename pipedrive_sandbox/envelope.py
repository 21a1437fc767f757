"""Pipedrive's JSON envelope: the error body every endpoint answers with, and the JSON encoding."""
from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

ERROR_INFO = "Please check developers.pipedrive.com for more information about Pipedrive API."
JSON_TYPE = "application/json; charset=utf-8"


class ApiError(Exception):
    """A request Pipedrive would refuse: `status` and `message` become the error envelope.

    Raised by handlers and query parsing; the pipeline turns it into `envelope_error(status, message)`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def envelope_error(status: int, message: str) -> dict[str, Any]:
    """Pipedrive's error body: `success: false`, `error`, `errorCode`, `error_info`, null `data`
    (the 4xx schemas of both specs)."""
    return {
        "success": False,
        "error": message,
        "errorCode": status,
        "error_info": ERROR_INFO,
        "data": None,
        "additional_data": None,
    }


def dumps(payload: Any) -> bytes:
    """`payload` as compact UTF-8 JSON bytes, non-ASCII characters unescaped.

    A lone surrogate has no UTF-8 form: then the whole payload is sent ASCII-escaped instead."""
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone UTF-16 surrogate (the hostile_mail shape) has no UTF-8 form: send it as the JSON
        # escape `\ud800`, as a server whose strings are UTF-16 does.
        return json.dumps(payload, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    """A JSON `Response` of `payload` with `status`, media type `application/json; charset=utf-8`."""
    return Response(dumps(payload), status_code=status, headers=headers, media_type=JSON_TYPE)
