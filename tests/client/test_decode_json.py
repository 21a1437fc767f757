"""Issue 11, the engine's CPU: response bodies are read by orjson, and by the standard library
whenever orjson would refuse them or read them otherwise (`decode._decode_json`). The reading before
orjson is the oracle: the same values, the same counts of repaired UTF-8, the same errors - an
integer beyond 64 bits stays that integer (orjson would make it a float), a NaN or an infinity
is read as before (a float; `NonFinite`, so the window's encoder writes it as before), a body that
is not JSON is still one line, `the body is not JSON`, retried."""
from __future__ import annotations

import json
import math
from typing import Any

import httpx
import pytest

from engine_core.providers.pipedrive import decode
from engine_core.providers.pipedrive.errors import BadResponse
from tests.client.support import Script, make_client


def before(content: bytes) -> tuple[Any, int]:
    """`_decode_json` before orjson: the standard library's reading of every body."""
    try:
        text = content.decode("utf-8")
        invalid = 0
    except UnicodeDecodeError:
        text = content.decode("utf-8", errors="replace")
        invalid = text.count("\ufffd") - content.count("\ufffd".encode())
    if text.startswith("\ufeff"):
        text = text[1:]
    return json.loads(text), invalid


def same(a: Any, b: Any) -> bool:
    """Equal with the same types all the way down, floats bit for bit (NaN equal to NaN)."""
    if type(a) is not type(b) and not (isinstance(a, float) and isinstance(b, float)):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


BODIES = [
    b'{"success": true, "data": [{"id": 1, "name": "Zo\xc3\xab \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x93\x9e", "value": 0.1,'
    b' "n": -0.0, "e": 1e-7, "big": 1.7976931348623157e308, "tiny": 5e-324, "ok": [true, false, null],'
    b' "esc": "\\u00e9\\ud83d\\ude00\\n\\"\\\\\\/\\u0000", "dup": 1, "dup": 2}],'
    b' "additional_data": {"next_cursor": "eyJpZCI6MX0="}}',
    b'{"data": [{"id": 9223372036854775807, "min": -9223372036854775808, "u": 18446744073709551615}]}',  # 64 bits: orjson's
    b'\xef\xbb\xbf{"data": [1]}',  # a byte-order mark
    b'{"data": ["\xff\xfe", "caf\xe9", "\xef\xbf\xbd"]}',  # invalid UTF-8 (and a U+FFFD the source sent)
    b'{"data": ["\\udc00 lone", "\\ud800"]}',  # lone surrogate escapes
    b'{"data": [' + b"[" * 300 + b"]" * 300 + b"]}",  # deeper than orjson goes
    b'{"data": {"phone": "+1 2345678901234567890"}}',  # a 19-digit run in a text: only the slower reading
]


@pytest.mark.parametrize("body", BODIES)
def test_a_body_reads_as_it_read_before(body: bytes) -> None:
    got, want = decode._decode_json(body), before(body)
    assert same(got[0], want[0]) and got[1] == want[1]


@pytest.mark.parametrize("number", [2**64, 10**30, -(2**63) - 1, -(10**25), 123456789012345678901234567890])
def test_an_integer_beyond_64_bits_stays_that_integer(number: int) -> None:
    body = b'{"success": true, "data": [{"id": 1, "custom_fields": {"f": %d}}]}' % number
    value = decode._decode_json(body)[0]["data"][0]["custom_fields"]["f"]
    assert type(value) is int and value == number


def test_nan_and_infinities_read_as_before_and_say_so() -> None:
    body = b'{"data": [NaN, Infinity, -Infinity, 1e400, -1e999, 1.5]}'
    got, want = decode._decode_json(body)[0]["data"], before(body)[0]["data"]
    assert same(got, want) and math.isnan(got[0]) and got[1:5] == [math.inf, -math.inf, math.inf, -math.inf]
    assert [type(v).__name__ for v in got] == ["NonFinite"] * 5 + ["float"]


@pytest.mark.parametrize("content", [b'{"success": true, "data": [1,', b"<html>busy</html>", b"", b'{"data": [1,]}',
                                     b'{"data": [1]}{}', b'{"data": [01]}', b"\xff"])
def test_a_body_that_is_not_json_is_one_line_and_retried(content: bytes) -> None:
    with pytest.raises(ValueError):
        before(content)
    with pytest.raises(ValueError):
        decode._decode_json(content)
    script = Script([httpx.Response(200, content=content), httpx.Response(200, content=b'{"success": true, "data": []}')])
    c, sleeps = make_client(script)
    assert c.get("/v1/deals")["data"] == [] and len(script.requests) == 2 and len(sleeps) == 1
    script = Script([httpx.Response(200, content=content)])
    c, _ = make_client(script, max_retries=0)
    with pytest.raises(BadResponse) as info:
        c.get("/v1/deals")
    assert "\n" not in str(info.value)
