"""Pipedrive's response bodies read: JSON decoded once (orjson, the standard library where orjson
would read otherwise), the envelope and mail message types the client hands back.
"""
from __future__ import annotations

import json
from typing import Any

import orjson


class Envelope(dict):
    """A decoded response envelope (`success`, `data`, ...), a plain dict to every caller, that also
    says how many invalid UTF-8 sequences the decoder replaced (`invalid_utf8`, 0 when none) and
    whether it was held for this request after another task paid for it (`kept`, `Prefetch.hold`)."""

    invalid_utf8: int = 0
    kept: bool = False
    date: str | None = None  # the response's `Date` header as served (the source's clock), or None


class MailMessage(dict):
    """A mail message as `mail_body` returns it: the API's `data` object plus `invalid_utf8`."""

    invalid_utf8: int = 0


_REPLACEMENT_BYTES = "\ufffd".encode()
# Bytes 0-9 -> "0", every other byte -> " ": a run of 19 digits is then one substring search.
_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_NUMBER = b"0" * 19


class NonFinite(float):
    """A NaN or an infinity read from a body (`NaN`, `Infinity`, `-Infinity`, or a number too
    large for a double): a float to every reader. Only the standard library's reading produces
    one - such a body is not JSON, and orjson refuses it - and the type says so to the window's
    encoder (`ledger`'s orjson path calls its default for a float subclass and falls back to the
    standard library's encoding, `NaN` as before, which Postgres refuses: the window goes per row)."""


def _nonfinite_constant(name: str) -> float:
    return NonFinite(name)


def _float(text: str) -> float:
    value = float(text)
    return NonFinite(value) if value - value != 0 else value


def _decode_json(content: bytes) -> tuple[Any, int]:
    """A response body -> (JSON value, number of invalid UTF-8 sequences replaced with U+FFFD).

    Pipedrive answers UTF-8 JSON (RFC 8259 requires it). Bytes that are not valid UTF-8 are a
    deterministic property of the stored data, not a transport accident: asking again returns
    the same bytes, so they are decoded once with replacement, never retried. The count is the
    replacement characters decoding added (those already in the text, encoded, are not counted).
    Raises ValueError when the decoded text is not JSON (a cut-off read: worth a retry).

    Read by orjson first (`json.loads` of the pages was ~12% of the engine's GIL time on
    the entity path; orjson reads them in half the time), and by the standard library, exactly as
    before, whenever orjson refuses the body: bytes that are not UTF-8, a byte-order mark, a lone
    surrogate escape, `NaN`/`Infinity`, too deep, not JSON. A body with a run of 19 digits goes to
    the standard library too: orjson reads an integer beyond 64 bits as a float, silently (a
    digit run in a text costs only the slower reading). Both give the same values otherwise
    (floats compared bit for bit over 300,000 random literals and every body of the bench's run).
    """
    if _LONG_NUMBER not in content.translate(_DIGITS):
        try:
            return orjson.loads(content), 0
        except orjson.JSONDecodeError:
            pass  # the standard library's reading below decides, with its own error
    return stdlib_decode_json(content)


def stdlib_decode_json(content: bytes) -> tuple[Any, int]:
    """`_decode_json` by the standard library alone (what it did before orjson, and does for any
    body orjson refuses): the same (value, invalid UTF-8 sequences replaced) and ValueError."""
    try:
        text = content.decode("utf-8")
        invalid = 0
    except UnicodeDecodeError:
        text = content.decode("utf-8", errors="replace")
        invalid = text.count("\ufffd") - content.count(_REPLACEMENT_BYTES)
    if text.startswith("\ufeff"):
        text = text[1:]  # a byte-order mark is not part of the JSON
    return json.loads(text, parse_constant=_nonfinite_constant, parse_float=_float), invalid
