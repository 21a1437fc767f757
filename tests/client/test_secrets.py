"""The API token never leaves the `x-api-token` header: not in URLs, log records (ours, httpx's or
httpcore's, at DEBUG, over a real socket), exception messages, tracebacks or `repr()` - not even
when the server echoes it back in an error body.
"""
from __future__ import annotations

import json
import logging
import threading
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import PipedriveError
from tests.client.support import TOKEN, Script, make_client, status

ROUTES: dict[str, tuple[int, dict]] = {
    "/v1/ok": (200, {"success": True, "data": {"id": 1}}),
    "/v1/echo401": (401, {"success": False, "error": f"unknown api_token {TOKEN}"}),
    "/v1/echo400": (400, {"success": False, "error": f"bad request for token={TOKEN}"}),
    "/v1/echo200": (200, {"success": False, "error": f"token {TOKEN} lacks scope"}),
    "/v1/daily": (429, {"success": False, "error": f"Daily token budget spent for {TOKEN}"}),
    "/v1/down": (503, {"success": False, "error": f"down {TOKEN}"}),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?")[0]
        code, body = ROUTES.get(path, (404, {"success": False, "error": "not found"}))
        if self.headers.get("x-api-token") != TOKEN:
            code, body = 401, {"success": False, "error": "no token"}
        payload = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.send_header("x-ratelimit-limit", "80")
        self.send_header("x-ratelimit-remaining", "79")
        self.send_header("x-ratelimit-reset", "2")
        if path == "/v1/daily":
            self.send_header("retry-after", "60")
            self.send_header("x-daily-ratelimit-token-remaining", "0")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def everything_said(error: BaseException) -> str:
    return "\n".join([str(error), repr(error), "".join(traceback.format_exception(error))])


def test_token_absent_from_logs_errors_and_reprs(server: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("httpx", "httpcore", "engine_core"):
        logging.getLogger(name).setLevel(logging.DEBUG)
    client = PipedriveClient(server, TOKEN, max_retries=1, sleep=lambda s: None)
    assert client.get("/v1/ok")["data"] == {"id": 1}
    said: list[str] = [repr(client), str(client)]
    for path in ("/v1/echo401", "/v1/echo400", "/v1/echo200", "/v1/daily", "/v1/down", "/v1/missing"):
        with pytest.raises(PipedriveError) as info:
            client.get(path, {"start": 0})
        said.append(everything_said(info.value))
    client.close()
    records = caplog.records
    assert any(r.name.startswith("httpcore") for r in records), "httpcore's DEBUG records were captured"
    assert any(r.name.startswith("httpx") for r in records)
    said += [r.getMessage() for r in records] + [repr(r.args) for r in records]
    leaks = [s for s in said if TOKEN in s]
    assert leaks == []
    # the server's own words survive, scrubbed
    assert any("unknown api_token ***" in s for s in said)


def test_transport_errors_do_not_carry_the_token() -> None:
    import httpx

    script = Script([httpx.ConnectError(f"cannot reach host for {TOKEN}")])
    client, _ = make_client(script, max_retries=0)
    with pytest.raises(PipedriveError) as info:
        client.get("/v1/ok")
    assert TOKEN not in str(info.value) and TOKEN not in repr(info.value)


def test_echoed_token_in_a_429_body_is_scrubbed() -> None:
    body = {"success": False, "error": f"rate limit for {TOKEN}"}
    client, _ = make_client(Script([status(429, headers={"retry-after": "1"}, body=body)]), max_retries=0)
    with pytest.raises(PipedriveError) as info:
        client.get("/v1/ok")
    assert TOKEN not in str(info.value) and "rate limit for ***" in str(info.value)
