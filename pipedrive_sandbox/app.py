"""The sandbox's Starlette application: Pipedrive's read endpoints, limits, faults and `/_sandbox/`.

Request pipeline for the API (`/api/v2/...`, `/v1/...` and its alias `/api/v1/...`):
auth (401) -> route (404 unknown, 410 for v1 lists out of support) -> limits (429 daily, then
burst; every request that passes is charged its `x-token-cost`) -> fault draw -> latency ->
handler. Every authenticated API response carries the rate-limit headers.

The private namespace `/_sandbox/` needs no auth: `GET stats`, `POST stats/reset`, `GET truth`
(`?kind=` for one part, `&rows=1` for its rows as served), `GET|POST config`, `GET health`, and
the live account's `GET live`, `POST live/step`, `POST live/stop`, `GET changes` (live.py).
"""
from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from .admin import Admin
from .catalog import ENDPOINTS, V1_GONE, V1_NOT_SERVED, Endpoint
from .config import SandboxConfig
from .data import Dataset
from .envelope import JSON_TYPE, ApiError, dumps, envelope_error, json_response
from .faults import request_key
from .listing import Lister
from .query import Query
from .shapes import INVALID_UTF8_BYTES, INVALID_UTF8_MARK_BYTES
from .state import SandboxState
from .v1 import V1Api
from .v1_crm import Download
from .v2 import V2Api

__all__ = ["ApiError", "SandboxApp", "create_app"]


class SandboxApp:
    """The Starlette application of one sandbox server and its request pipeline.

    `handlers` maps an API version to its handler object (V1Api, V2Api); an endpoint's `handler`
    names a method there. `admin` serves `/_sandbox/`. `state` is the server's SandboxState."""

    def __init__(self, config: SandboxConfig) -> None:
        self.state = SandboxState(config)
        self.handlers: dict[str, Lister] = {"v1": V1Api(self.state), "v2": V2Api(self.state)}
        self.admin = Admin(self.state)
        routes = [
            *self.admin.routes(),
            Route("/{path:path}", self.api, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]),
        ]
        self.starlette = Starlette(routes=routes)
        self.starlette.state.sandbox = self.state

    @property
    def ds(self) -> Dataset:
        """The server's generated dataset."""
        return self.state.dataset

    def _token_of(self, request: Request) -> str | None:
        header = request.headers.get("x-api-token")
        if header:
            return header
        auth = request.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip()
        return request.query_params.get("api_token")

    def _route(self, path: str) -> tuple[str, str]:
        for prefix, api in (("/api/v2", "v2"), ("/api/v1", "v1"), ("/v1", "v1")):
            if path == prefix or path.startswith(prefix + "/"):
                return api, path[len(prefix):] or "/"
        return "", path

    async def api(self, request: Request) -> Response:
        """Answer one request to the API namespace (the pipeline in the module docstring).

        401 without the token; 404 for an unknown path, 410 for a v1 list out of support (the v2 list is
        named in the message), 405 for a write; 429 when a limit refuses it; then a fault may answer
        instead (500/502/503, a dropped connection, a slow or truncated answer). Every response after
        auth carries the rate-limit headers."""
        state = self.state
        path = request.url.path
        token = self._token_of(request)
        if token != state.config.token:
            state.stats.unauthorized += 1
            return json_response(401, envelope_error(401, "unauthorized access"))
        api, rest = self._route(path)
        endpoint: Endpoint | None = None
        params: dict[str, str] = {}
        if api:
            for ep in ENDPOINTS:
                if ep.api == api:
                    m = ep.regex.match(rest)
                    if m:
                        endpoint, params = ep, m.groupdict()
                        break
        if endpoint is None:
            state.stats.requests["(unmatched)"] += 1
            if api == "v1" and V1_GONE.match(rest) and request.method == "GET":
                state.stats.status("(unmatched)", 410)
                return json_response(
                    410,
                    envelope_error(
                        410,
                        f"GET /v1{rest} is out of support since 2026-08-01; use /api/v2{rest} (cursor pagination)",
                    ),
                )
            state.stats.status("(unmatched)", 404)
            if api == "v1" and V1_NOT_SERVED.match(rest):
                return json_response(404, envelope_error(404, "Not found: /v1/recents is not served by the sandbox (a full export must not use it)"))
            return json_response(404, envelope_error(404, f"Unknown method: {request.method} {path}"))
        if request.method not in ("GET", "HEAD"):
            state.stats.requests["(unmatched)"] += 1
            state.stats.status("(unmatched)", 405)
            return json_response(405, envelope_error(405, f"The sandbox is read-only: {request.method} {path} is not supported"))

        template = endpoint.template
        is_body = endpoint.handler == "v1_mail_message" and (request.query_params.get("include_body") in ("1", "true"))
        state.stats.requests[template] += 1
        state.stats.enter(template, is_body)
        try:
            decision = state.limiter.check(token, endpoint.cost)
            headers = dict(decision.headers)
            if not decision.allowed:
                assert decision.kind is not None
                state.stats.rate_limited[decision.kind] += 1
                state.stats.status(template, 429)
                message = "Daily rate limit exceeded" if decision.kind == "daily" else "Request over limit"
                return json_response(429, envelope_error(429, message), headers)
            state.stats.tokens[template] += endpoint.cost
            key = request_key(request.method, path, request.query_params.multi_items())
            fault = state.faults.decide(key, "body" if is_body else endpoint.latency)
            if fault.kind:
                state.stats.faults[fault.kind] += 1
            if fault.kind == "drop":
                state.stats.status(template, 0)
                return await self._drop(request)
            if fault.latency > 0:
                await asyncio.sleep(fault.latency)
            if fault.kind in ("500", "503"):
                state.stats.status(template, int(fault.kind))
                message = "Internal server error" if fault.kind == "500" else "Service temporarily unavailable"
                return json_response(int(fault.kind), envelope_error(int(fault.kind), message), headers)
            if fault.kind == "502":
                state.stats.status(template, 502)
                html = b"<html><head><title>502 Bad Gateway</title></head><body><center><h1>502 Bad Gateway</h1></center></body></html>"
                return Response(html, status_code=502, headers=headers, media_type="text/html")
            if fault.kind == "slow":
                await asyncio.sleep(state.config.slow_seconds)
            q = Query(request, state.config.page_limit_max)
            # The answer is built in a worker thread: the event loop stays free to admit (and count)
            # the next requests as they arrive, as the source's edge counts them, instead of after
            # the pages ahead of them are serialised.
            status, payload, body = await run_in_threadpool(self._answer, endpoint, params, q)
            if isinstance(payload, Download):
                state.stats.status(template, 200)
                return self._download(payload, headers, fault.kind == "badjson")
            state.stats.status(template, status)
            if status == 200:
                if endpoint.listing:
                    state.stats.listings[_listing_key(path, request.query_params.multi_items())] += 1
                if is_body:
                    state.stats.bodies_fetched[int(params["id"])] += 1
                if is_body and state.shapes.hostile_on and INVALID_UTF8_MARK_BYTES in body:
                    body = body.replace(INVALID_UTF8_MARK_BYTES, INVALID_UTF8_BYTES)  # not UTF-8 on the wire
                if fault.kind == "badjson":
                    body = body[: max(1, len(body) // 2)]
            return Response(body, status_code=status, headers=headers, media_type=JSON_TYPE)
        finally:
            state.stats.leave(template, is_body)

    def _answer(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> tuple[int, Any, bytes]:
        """(status, payload, JSON body) of one API request: the endpoint's handler under the state's
        lock (a live change lands between two answers, never inside one); a Download's body is b""."""
        with self.state.lock:
            try:
                handler: Callable[..., Any] = getattr(self.handlers[endpoint.api], endpoint.handler)
                payload = handler(endpoint, params, q)
                status = 200
            except ApiError as exc:
                status, payload = exc.status, envelope_error(exc.status, exc.message)
            if isinstance(payload, Download):
                return 200, payload, b""
            return status, payload, dumps(payload)

    def _download(self, download: Download, headers: dict[str, str], cut: bool) -> Response:
        """A file's bytes as `application/octet-stream`, streamed chunk by chunk with its
        Content-Length; the `badjson` fault cuts the stream at half (a download broken off)."""
        if cut:
            half = download.size // 2

            def chunks() -> Any:
                sent = 0
                for chunk in download.chunks:
                    if sent >= half:
                        return
                    yield chunk[: half - sent]
                    sent += len(chunk)

            return StreamingResponse(chunks(), status_code=200, headers=headers, media_type="application/octet-stream")
        out = {**headers, "content-length": str(download.size), "content-disposition": f'attachment; filename="{download.file_name}"'}
        return StreamingResponse(download.chunks, status_code=200, headers=out, media_type="application/octet-stream")

    async def _drop(self, request: Request) -> Response:
        """Close the connection without any response."""
        cycle = getattr(request.receive, "__self__", None)
        transport = getattr(cycle, "transport", None)
        if transport is None:
            raise ConnectionAbortedError("sandbox drop fault")
        transport.abort()
        if hasattr(cycle, "disconnected"):
            cycle.disconnected = True
        await asyncio.sleep(0)
        return Response(b"", status_code=500)


def _listing_key(path: str, query: Iterable[tuple[str, str]]) -> str:
    items = sorted((k, v) for k, v in query if k != "api_token")
    return path + ("?" + "&".join(f"{k}={v}" for k, v in items) if items else "")


def create_app(config: SandboxConfig | None = None) -> Starlette:
    """The ASGI application for a config (its state is `app.state.sandbox`)."""
    return SandboxApp(config or SandboxConfig()).starlette
