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
import base64
import binascii
import heapq
import itertools
import json
import logging
import re
import threading
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .config import SandboxConfig
from .costs import API_PREFIX, TOKEN_COSTS
from .data import Dataset, dataset_for, parse_time, rfc3339
from .faults import FaultPlan, request_key
from .fields import ENTITY_OF_V1_FIELDS, ENTITY_OF_V2_FIELDS, v1_entity_fields, v1_lead_fields, v1_note_fields, v2_fields
from .limits import RateLimiter
from .live import LIVE_TRUTH_KINDS, Live
from .shapes import FLIP_KINDS, INVALID_UTF8_BYTES, INVALID_UTF8_MARK_BYTES, SHAPE_TRUTH_KINDS, Shapes

log = logging.getLogger("pipedrive_sandbox")

ERROR_INFO = "Please check developers.pipedrive.com for more information about Pipedrive API."
JSON_TYPE = "application/json; charset=utf-8"


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def envelope_error(status: int, message: str) -> dict[str, Any]:
    return {
        "success": False,
        "error": message,
        "errorCode": status,
        "error_info": ERROR_INFO,
        "data": None,
        "additional_data": None,
    }


def dumps(payload: Any) -> bytes:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone UTF-16 surrogate (the hostile_mail shape) has no UTF-8 form: send it as the JSON
        # escape `\ud800`, as a server whose strings are UTF-16 does.
        return json.dumps(payload, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(payload), status_code=status, headers=headers, media_type=JSON_TYPE)


# --------------------------------------------------------------------------- endpoint table
@dataclass(frozen=True)
class Endpoint:
    api: str
    spec_path: str
    handler: str
    latency: str  # list | single | body
    listing: bool
    regex: re.Pattern[str]

    @property
    def cost(self) -> int:
        return TOKEN_COSTS[(self.api, self.spec_path)]

    @property
    def template(self) -> str:
        return API_PREFIX[self.api] + self.spec_path


def _ep(api: str, spec_path: str, handler: str, latency: str, listing: bool) -> Endpoint:
    pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", spec_path)
    return Endpoint(api, spec_path, handler, latency, listing, re.compile(f"^{pattern}$"))


ENDPOINTS: tuple[Endpoint, ...] = (
    _ep("v2", "/persons", "v2_list", "list", True),
    _ep("v2", "/persons/{id}", "v2_single", "single", False),
    _ep("v2", "/organizations", "v2_list", "list", True),
    _ep("v2", "/organizations/{id}", "v2_single", "single", False),
    _ep("v2", "/deals/archived", "v2_list", "list", True),
    _ep("v2", "/deals", "v2_list", "list", True),
    _ep("v2", "/deals/{id}", "v2_single", "single", False),
    _ep("v2", "/activities", "v2_list", "list", True),
    _ep("v2", "/activities/{id}", "v2_single", "single", False),
    _ep("v2", "/pipelines", "v2_list", "list", True),
    _ep("v2", "/pipelines/{id}", "v2_single", "single", False),
    _ep("v2", "/stages", "v2_list", "list", True),
    _ep("v2", "/stages/{id}", "v2_single", "single", False),
    _ep("v2", "/personFields", "v2_fields", "list", True),
    _ep("v2", "/personFields/{field_code}", "v2_field", "single", False),
    _ep("v2", "/organizationFields", "v2_fields", "list", True),
    _ep("v2", "/organizationFields/{field_code}", "v2_field", "single", False),
    _ep("v2", "/dealFields", "v2_fields", "list", True),
    _ep("v2", "/dealFields/{field_code}", "v2_field", "single", False),
    _ep("v2", "/activityFields", "v2_fields", "list", True),
    _ep("v2", "/activityFields/{field_code}", "v2_field", "single", False),
    _ep("v1", "/leads/archived", "v1_leads", "list", True),
    _ep("v1", "/leads", "v1_leads", "list", True),
    _ep("v1", "/leads/{id}", "v1_single", "single", False),
    _ep("v1", "/notes", "v1_notes", "list", True),
    _ep("v1", "/notes/{id}", "v1_single", "single", False),
    _ep("v1", "/users", "v1_users", "list", True),
    _ep("v1", "/users/me", "v1_me", "single", False),  # before /users/{id}, which would take "me"
    _ep("v1", "/users/{id}", "v1_single", "single", False),
    _ep("v1", "/leadFields", "v1_fields", "list", True),
    _ep("v1", "/noteFields", "v1_fields", "list", True),
    _ep("v1", "/activityFields", "v1_fields", "list", True),
    _ep("v1", "/dealFields", "v1_fields", "list", True),
    _ep("v1", "/organizationFields", "v1_fields", "list", True),
    _ep("v1", "/personFields", "v1_fields", "list", True),
    _ep("v1", "/productFields", "v1_fields", "list", True),
    _ep("v1", "/deals/summary", "v1_deals_summary", "single", False),
    _ep("v1", "/deals/summary/archived", "v1_deals_summary", "single", False),
    _ep("v1", "/deals/{id}/mailMessages", "v1_deal_mail", "list", True),
    _ep("v1", "/mailbox/mailMessages/{id}", "v1_mail_message", "single", False),
)

V1_GONE = re.compile(r"^/(persons|organizations|deals|activities|pipelines|stages)(/archived|/\d+)?$")
V1_NOT_SERVED = re.compile(r"^/recents(/.*)?$")

KIND_OF_V2 = {
    "persons": "persons",
    "organizations": "organizations",
    "deals": "deals",
    "activities": "activities",
    "pipelines": "pipelines",
    "stages": "stages",
}
ENTITY_OF_KIND = {"persons": "person", "organizations": "organization", "deals": "deal"}
SINGULAR = {
    "persons": "Person",
    "organizations": "Organization",
    "deals": "Deal",
    "activities": "Activity",
    "pipelines": "Pipeline",
    "stages": "Stage",
    "leads": "Lead",
    "notes": "Note",
    "users": "User",
    "mail_messages": "Mail message",
}


@dataclass(frozen=True)
class ListSpec:
    """How one v2 or v1 list endpoint lists its kind."""

    kind: str
    subset: str = "all"
    sorts: tuple[str, ...] = ("id", "update_time", "add_time")
    filters: tuple[tuple[str, str, str], ...] = ()  # (query param, record field, type)
    time_filters: bool = True


V2_LISTS: dict[str, ListSpec] = {
    "/persons": ListSpec("persons", filters=(("owner_id", "owner_id", "int"), ("org_id", "org_id", "int"), ("deal_id", "@deal_person", "int"))),
    "/organizations": ListSpec("organizations", filters=(("owner_id", "owner_id", "int"),)),
    "/deals": ListSpec(
        "deals",
        "active",
        filters=(
            ("owner_id", "owner_id", "int"),
            ("person_id", "person_id", "int"),
            ("org_id", "org_id", "int"),
            ("pipeline_id", "pipeline_id", "int"),
            ("stage_id", "stage_id", "int"),
            ("status", "status", "strset"),
        ),
    ),
    "/deals/archived": ListSpec(
        "deals",
        "archived",
        filters=(
            ("owner_id", "owner_id", "int"),
            ("person_id", "person_id", "int"),
            ("org_id", "org_id", "int"),
            ("pipeline_id", "pipeline_id", "int"),
            ("stage_id", "stage_id", "int"),
            ("status", "status", "strset"),
        ),
    ),
    "/activities": ListSpec(
        "activities",
        sorts=("id", "update_time", "add_time", "due_date"),
        filters=(
            ("owner_id", "owner_id", "int"),
            ("deal_id", "deal_id", "int"),
            ("lead_id", "lead_id", "str"),
            ("person_id", "person_id", "int"),
            ("org_id", "org_id", "int"),
            ("done", "done", "bool"),
        ),
    ),
    "/pipelines": ListSpec("pipelines", time_filters=False),
    "/stages": ListSpec("stages", sorts=("id", "update_time", "add_time", "order_nr"), filters=(("pipeline_id", "pipeline_id", "int"),), time_filters=False),
}
# Sort fields whose order equals index order (times grow with the index; due_date = add + 7 days).
MONOTONIC_SORTS = frozenset({"id", "add_time", "update_time", "due_date"})


# --------------------------------------------------------------------------- stats
@dataclass
class Stats:
    requests: Counter[str] = field(default_factory=Counter)
    tokens: Counter[str] = field(default_factory=Counter)
    status_codes: dict[str, Counter[str]] = field(default_factory=dict)
    rate_limited: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    unauthorized: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    in_flight_by: Counter[str] = field(default_factory=Counter)
    peak_in_flight_by: Counter[str] = field(default_factory=Counter)
    body_in_flight: int = 0
    peak_body_in_flight: int = 0
    bodies_fetched: Counter[int] = field(default_factory=Counter)
    listings: Counter[str] = field(default_factory=Counter)

    def enter(self, template: str, body: bool) -> None:
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.in_flight_by[template] += 1
        self.peak_in_flight_by[template] = max(self.peak_in_flight_by[template], self.in_flight_by[template])
        if body:
            self.body_in_flight += 1
            self.peak_body_in_flight = max(self.peak_body_in_flight, self.body_in_flight)

    def leave(self, template: str, body: bool) -> None:
        self.in_flight -= 1
        self.in_flight_by[template] -= 1
        if body:
            self.body_in_flight -= 1

    def status(self, template: str, code: int) -> None:
        self.status_codes.setdefault(template, Counter())[str(code)] += 1

    def to_json(self) -> dict[str, Any]:
        return {
            "requests_total": sum(self.requests.values()),
            "tokens_total": sum(self.tokens.values()),
            "requests": dict(self.requests),
            "tokens": dict(self.tokens),
            "status_codes": {k: dict(v) for k, v in self.status_codes.items()},
            "rate_limited": {"burst": self.rate_limited["burst"], "daily": self.rate_limited["daily"]},
            "faults": dict(self.faults),
            "unauthorized": self.unauthorized,
            "in_flight": {
                "current": self.in_flight,
                "peak": self.peak_in_flight,
                "peak_by_endpoint": {k: v for k, v in self.peak_in_flight_by.items() if v},
                "body_fetches_current": self.body_in_flight,
                "body_fetches_peak": self.peak_body_in_flight,
            },
            "bodies_fetched": {str(k): v for k, v in sorted(self.bodies_fetched.items())},
            "listings": dict(self.listings),
        }


# --------------------------------------------------------------------------- state
class SandboxState:
    def __init__(self, config: SandboxConfig) -> None:
        self.config = config
        self.dataset: Dataset = dataset_for(config.scale, config.seed, config.big_deal_messages)
        self.limiter = RateLimiter(
            burst_limit=config.burst_limit,
            window=config.burst_window_seconds,
            daily_budget=config.daily_budget,
            day_seconds=config.day_seconds,
        )
        self.faults = FaultPlan(config.seed, config.fault_spec, config.latency_spec)
        self.stats = Stats()
        self.shapes = Shapes(self.dataset, config)
        self.summary_cache: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.summary_base: dict[tuple[Any, ...], dict[str, list[float]]] = {}  # generated deals only
        self.summary_version = 0  # the live version summary_cache answers for
        # Live account (issue 9): changes run under this lock, which handlers hold while they answer.
        self.lock = threading.RLock()
        self.live = Live(self.dataset, lambda: self.shapes, lambda: self.config, self.lock)
        if config.live_rate > 0:
            self.live.start()

    @property
    def badrow(self) -> float:
        return self.config.fault_spec.rate("badrow")

    def reconfigure(self, changes: dict[str, Any]) -> SandboxConfig:
        """Apply run-time option changes (ValueError names a bad one). Swaps config and shapes under
        the lock; (re)starts the live background outside it (its thread takes the lock to stop)."""
        with self.lock:
            old, new = self.config, self._reconfigure(changes)
        if new.live_rate != old.live_rate or (new.live_rate > 0 and not self.live.running and new.live_max != old.live_max):
            self.live.start()  # a new rate (or cap) starts the background changes over from now; 0 stops them
        return new

    def _reconfigure(self, changes: dict[str, Any]) -> SandboxConfig:
        new = self.config.with_changes(changes)
        self.limiter.reconfigure(
            burst_limit=new.burst_limit,
            window=new.burst_window_seconds,
            daily_budget=new.daily_budget,
            day_seconds=new.day_seconds,
        )
        self.faults.reconfigure(new.fault_spec, new.latency_spec)
        if any(getattr(new, name) != getattr(self.config, name) for name in SandboxConfig.SHAPES):
            self.shapes = Shapes(self.dataset, new)  # a fresh shape state: archive flips start over
            self.summary_cache.clear()
            self.summary_base.clear()
        self.config = new
        return new


# --------------------------------------------------------------------------- query parsing
class Query:
    def __init__(self, request: Request, page_limit_max: int) -> None:
        self.params = request.query_params
        self.page_limit_max = page_limit_max

    def get(self, name: str) -> str | None:
        value = self.params.get(name)
        return value if value not in (None, "") else None

    def int(self, name: str, default: int | None = None, minimum: int | None = None) -> int | None:
        raw = self.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ApiError(400, f"Parameter '{name}' must be an integer") from None
        if minimum is not None and value < minimum:
            raise ApiError(400, f"Parameter '{name}' must be >= {minimum}")
        return value

    def bool(self, name: str) -> bool | None:
        raw = self.get(name)
        if raw is None:
            return None
        if raw.lower() in ("1", "true", "yes"):
            return True
        if raw.lower() in ("0", "false", "no"):
            return False
        raise ApiError(400, f"Parameter '{name}' must be a boolean")

    def limit(self) -> int:
        value = self.int("limit", 100)
        assert value is not None
        if value < 1:
            raise ApiError(400, "Parameter 'limit' must be a positive integer")
        if value > self.page_limit_max:
            raise ApiError(400, f"Parameter 'limit' must not be greater than {self.page_limit_max}")
        return value

    def time(self, name: str) -> int | None:
        raw = self.get(name)
        if raw is None:
            return None
        try:
            return parse_time(raw)
        except ValueError:
            raise ApiError(400, f"Parameter '{name}' must be a date-time in RFC3339 format, e.g. 2025-01-01T10:20:00Z") from None


def encode_cursor(obj: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(text: str) -> dict[str, Any]:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        obj = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ApiError(400, "Invalid cursor") from None
    if not isinstance(obj, dict) or "id" not in obj:
        raise ApiError(400, "Invalid cursor")
    return obj


def _parse_filter_value(q: Query, param: str, ftype: str) -> Any:
    if ftype == "int":
        return q.int(param)
    if ftype == "bool":
        return q.bool(param)
    raw = q.get(param)
    if raw is None:
        return None
    if ftype == "strset":
        return frozenset(s.strip() for s in raw.split(",") if s.strip())
    return raw


# --------------------------------------------------------------------------- the application
class SandboxApp:
    def __init__(self, config: SandboxConfig) -> None:
        self.state = SandboxState(config)
        routes = [
            Route("/_sandbox/health", self.health, methods=["GET"]),
            Route("/_sandbox/stats", self.get_stats, methods=["GET"]),
            Route("/_sandbox/stats/reset", self.reset_stats, methods=["POST"]),
            Route("/_sandbox/truth", self.get_truth, methods=["GET"]),
            Route("/_sandbox/config", self.config_endpoint, methods=["GET", "POST"]),
            Route("/_sandbox/live", self.live_status, methods=["GET"]),
            Route("/_sandbox/live/step", self.live_step, methods=["POST"]),
            Route("/_sandbox/live/stop", self.live_stop, methods=["POST"]),
            Route("/_sandbox/changes", self.live_changes, methods=["GET"]),
            Route("/{path:path}", self.api, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]),
        ]
        self.starlette = Starlette(routes=routes)
        self.starlette.state.sandbox = self.state

    @property
    def ds(self) -> Dataset:
        return self.state.dataset

    # ------------------------------------------------------------------ private namespace
    async def health(self, request: Request) -> Response:
        return json_response(200, {"ok": True, "scale": self.state.config.scale, "seed": self.state.config.seed})

    async def get_stats(self, request: Request) -> Response:
        body = self.state.stats.to_json()
        body["daily"] = self.state.limiter.daily_state()
        body["config"] = self.state.config.public_dict()
        return json_response(200, body)

    async def reset_stats(self, request: Request) -> Response:
        self.state.stats = Stats()
        return json_response(200, {"ok": True})

    async def get_truth(self, request: Request) -> Response:
        kind = request.query_params.get("kind") or None
        rows = request.query_params.get("rows") in ("1", "true", "yes")
        if rows and kind not in Dataset.TRUTH_KINDS:
            return json_response(400, envelope_error(400, f"rows=1 needs kind= one of: {', '.join(Dataset.TRUTH_KINDS)} (got {kind!r})"))
        with self.state.lock:
            try:
                if kind in SHAPE_TRUTH_KINDS or kind in LIVE_TRUTH_KINDS:
                    body = {"scale": self.ds.scale, "seed": self.ds.seed}
                else:
                    body = self.ds.truth(self.state.badrow, kind)
            except KeyError:
                valid = list(Dataset.TRUTH_KINDS) + ["deals_with_mail", "malformed", "dangling", "dangling_refs", "counts", *SHAPE_TRUTH_KINDS, *LIVE_TRUTH_KINDS]
                return json_response(400, envelope_error(400, f"unknown truth kind {kind!r}; one of: {', '.join(valid)}"))
            body = self.state.shapes.extend_truth(body, kind)
            body = self.state.live.extend_truth(body, kind)
            if rows:
                assert kind is not None
                body["rows"] = {str(ident): self._truth_row(kind, ident) for ident in body["ids"][kind]}
        return json_response(200, body)

    def _truth_row(self, name: str, ident: Any) -> dict[str, Any]:
        """A row of a truth kind exactly as the API serves it now (mail: the message without body)."""
        kind = name.removesuffix("_archived")
        if kind == "mail_messages":
            item = self._mail_item(int(ident))
            return item["data"]
        index = self.state.live.index_of(kind, ident)
        assert index is not None
        return self._record(kind, index)

    async def live_status(self, request: Request) -> Response:
        with self.state.lock:
            return json_response(200, self.state.live.status())

    async def live_step(self, request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object like {\"n\": 10}")
            changes = self.state.live.step(body.get("n", 1))
        except ValueError as exc:
            return json_response(400, envelope_error(400, str(exc)))
        return json_response(200, {"changes": changes, "applied": self.state.live.applied})

    async def live_stop(self, request: Request) -> Response:
        self.state.live.stop()
        with self.state.lock:
            return json_response(200, self.state.live.status())

    async def live_changes(self, request: Request) -> Response:
        raw = request.query_params.get("since_seq") or "0"
        try:
            since = int(raw)
            if since < 0:
                raise ValueError
        except ValueError:
            return json_response(400, envelope_error(400, f"invalid since_seq {raw!r}: an integer >= 0 is required"))
        with self.state.lock:
            return json_response(200, {"changes": self.state.live.changes(since), "applied": self.state.live.applied})

    async def config_endpoint(self, request: Request) -> Response:
        if request.method == "POST":
            try:
                changes = json.loads(await request.body() or b"{}")
                if not isinstance(changes, dict):
                    raise ValueError("the body must be a JSON object")
                self.state.reconfigure(changes)
            except ValueError as exc:
                return json_response(400, envelope_error(400, str(exc)))
        return json_response(200, self.state.config.public_dict())

    # ------------------------------------------------------------------ API pipeline
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
            with state.lock:  # a live change lands between two answers, never inside one
                try:
                    handler: Callable[..., Any] = getattr(self, endpoint.handler)
                    payload = handler(endpoint, params, q)
                    status = 200
                except ApiError as exc:
                    status, payload = exc.status, envelope_error(exc.status, exc.message)
                body = dumps(payload)
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

    # ------------------------------------------------------------------ v2 handlers
    def _v2_custom(self, kind: str, rec: dict[str, Any], q: Query) -> dict[str, Any]:
        entity = ENTITY_OF_KIND.get(kind)
        if entity is None or not isinstance(rec.get("custom_fields"), dict):
            return rec
        wanted = q.get("custom_fields")
        labels = q.bool("include_option_labels")
        if wanted is None and not labels:
            return rec
        values = dict(rec["custom_fields"])
        if wanted is not None:
            keys = [k.strip() for k in wanted.split(",") if k.strip()]
            if len(keys) > 15:
                raise ApiError(400, "A maximum of 15 custom field keys is allowed in 'custom_fields'")
            values = {k: v for k, v in values.items() if k in keys}
        if labels:
            by_key = {f.key: f for f in self.ds.custom_fields[entity]}
            for k, v in list(values.items()):
                f = by_key.get(k)
                if f is None or v is None or not f.options:
                    continue
                label_of = dict(f.options)
                if f.field_type == "enum" and isinstance(v, int):
                    values[k] = {"id": v, "label": label_of.get(v)}
                elif f.field_type == "set" and isinstance(v, list):
                    values[k] = [{"id": x, "label": label_of.get(x)} for x in v]
        out = dict(rec)
        out["custom_fields"] = values
        return out

    def _candidates(self, kind: str, subset: str, lo: int, hi: int, desc: bool) -> Iterator[int]:
        ds = self.ds
        if subset == "archived":
            arr = ds.archived_deals if kind == "deals" else ds.archived_leads
            a, b = bisect_left(arr, lo), bisect_left(arr, hi)
            seq: Iterable[int] = (arr[j] for j in (range(b - 1, a - 1, -1) if desc else range(a, b)))
            yield from seq
            return
        rng = range(hi - 1, lo - 1, -1) if desc else range(lo, hi)
        if subset == "active":
            yield from (i for i in rng if not ds.is_archived(kind, i))
        else:
            yield from rng

    def _filter_pred(self, spec: ListSpec, q: Query) -> Callable[[dict[str, Any]], bool] | None:
        checks: list[tuple[str, str, Any]] = []
        for param, fname, ftype in spec.filters:
            value = _parse_filter_value(q, param, ftype)
            if value is not None:
                checks.append((fname, ftype, value))
        if not checks:
            return None
        live = self.state.live

        def pred(rec: dict[str, Any]) -> bool:
            for fname, ftype, value in checks:
                if fname == "@deal_person":
                    d = live.index_of("deals", value)
                    if d is None:
                        return False
                    if live.record("deals", d).get("person_id") != rec.get("id"):
                        return False
                    continue
                got = rec.get(fname)
                if ftype == "strset":
                    if got not in value:
                        return False
                elif got != value:
                    return False
            return True

        return pred

    def _record(self, kind: str, index: int) -> dict[str, Any]:
        """The record as served now: generated, malformed when drawn, shaped, then changed (live)."""
        return self.state.live.record(kind, index, self.state.badrow)

    def _shaped_order(
        self, kind: str, subset: str, since: int | None, until: int | None, sort_by: str, desc: bool, universe: Iterable[int] | None = None
    ) -> list[tuple[tuple[Any, ...], int]]:
        """(sort key, index) of every row a list of a shape-touched kind serves, in served order.

        The generator's shortcuts (times grow with the index, archived rows in fixed arrays) do not
        hold for rows with a null or moved update time, so such kinds are materialised: time filters
        never match a null time; `update_time` sorts put nulls last ascending, first descending."""
        shapes = self.state.live  # the shapes, and the live changes over them
        filtered = since is not None or until is not None
        rows: list[tuple[tuple[Any, ...], int]] = []
        for i in universe if universe is not None else shapes.universe(kind):
            if subset != "all" and shapes.is_archived(kind, i) != (subset == "archived"):
                continue
            t = shapes.update_ts(kind, i)
            if filtered:
                if t is None or (since is not None and t < since) or (until is not None and t >= until):
                    continue
            rows.append(((t is None, t or 0, i) if sort_by == "update_time" else (i,), i))
        rows.sort(reverse=desc)
        return rows

    def _live_order(
        self, kind: str, subset: str, since: int | None, until: int | None, sort_by: str, desc: bool, after: tuple[Any, ...] | None
    ) -> Iterator[int]:
        """Indexes a list of a kind only live changes touch serves, in served order, lazily:
        `_shaped_order` (then the keys after the cursor key `after`) without materialising.

        The generated rows no change touched keep the generator's shortcuts (times grow with the
        index: binary search for the time filters and the cursor); the touched rows - few - are
        checked one by one and merged in by their sort key."""
        ds, live = self.ds, self.state.live
        touched = live.touched(kind)
        skip = set(touched)

        def key(i: int) -> tuple[Any, ...]:
            if sort_by != "update_time":
                return (i,)
            t = live.update_ts(kind, i)
            return (t is None, t or 0, i)

        def passes(i: int) -> bool:
            if not live.exists(kind, i):
                return False
            if subset != "all" and live.is_archived(kind, i) != (subset == "archived"):
                return False
            if since is not None or until is not None:
                t = live.update_ts(kind, i)
                if t is None or (since is not None and t < since) or (until is not None and t >= until):
                    return False
            return True

        mine = sorted(((key(i), i) for i in touched if passes(i)), reverse=desc)
        if after is not None:
            mine = [r for r in mine if (r[0] < after if desc else r[0] > after)]
        lo = ds.first_index_at_or_after(kind, since) if since is not None else 0
        hi = ds.first_index_at_or_after(kind, until) if until is not None else ds.count(kind)
        if after is not None:
            if sort_by != "update_time":
                lo, hi = (lo, min(hi, after[0])) if desc else (max(lo, after[0] + 1), hi)
            elif not after[0]:  # generated times are never null: only a non-null key bounds them
                t = after[1]
                lo, hi = (lo, min(hi, ds.first_index_at_or_after(kind, t + 1))) if desc else (max(lo, ds.first_index_at_or_after(kind, t)), hi)
            elif not desc:
                lo = hi  # ascending, nulls come last: nothing generated after a null key
        base: Iterator[tuple[tuple[Any, ...], int]] = (
            ((False, ds.update_ts(kind, i), i) if sort_by == "update_time" else (i,), i)
            for i in self._candidates(kind, subset, lo, max(lo, hi), desc)
            if i not in skip
        )
        if after is not None and sort_by == "update_time":
            base = (r for r in base if (r[0] < after if desc else r[0] > after))
        return (i for _, i in heapq.merge(base, mine, key=lambda r: r[0], reverse=desc))

    def _cursor_key(self, kind: str, cursor: dict[str, Any], sort_by: str) -> tuple[Any, ...]:
        index = self.state.live.cursor_index(kind, cursor.get("id"))  # the row may be gone since
        if index is None:
            raise ApiError(400, "Invalid cursor")
        if sort_by != "update_time":
            return (index,)
        value = cursor.get("fieldValue")
        try:
            t = parse_time(value) if isinstance(value, str) else None
        except ValueError:
            raise ApiError(400, "Invalid cursor") from None
        return (t is None, t or 0, index)

    def v2_list(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        spec = V2_LISTS[endpoint.spec_path]
        ds, kind = self.ds, spec.kind
        shapes = self.state.shapes
        limit = q.limit()
        size = shapes.cap(limit)
        if q.get("filter_id") is not None:
            raise ApiError(404, "Filter not found")
        sort_by = q.get("sort_by") or "id"
        if sort_by not in spec.sorts:
            raise ApiError(400, f"Parameter 'sort_by' must be one of: {', '.join(spec.sorts)}")
        direction = (q.get("sort_direction") or "asc").lower()
        if direction not in ("asc", "desc"):
            raise ApiError(400, "Parameter 'sort_direction' must be one of: asc, desc")
        desc = direction == "desc"
        lo, hi = 0, ds.count(kind)
        since = until = None
        if spec.time_filters:
            since, until = q.time("updated_since"), q.time("updated_until")
            if since is not None:
                lo = ds.first_index_at_or_after(kind, since)
            if until is not None:
                hi = ds.first_index_at_or_after(kind, until)
        pred = self._filter_pred(spec, q)
        ids_param = q.get("ids")
        cursor = decode_cursor(q.get("cursor")) if q.get("cursor") else None
        if cursor is not None and (cursor.get("field") != sort_by or cursor.get("sortDirection") != direction):
            raise ApiError(400, "Invalid cursor: it belongs to another sort order")
        if cursor is not None and cursor.get("start"):
            cursor = None  # the empty_pages shape's cursor: resume at the first row

        wanted_idxs: list[int] | None = None
        if ids_param is not None:
            try:
                wanted = [int(x) for x in ids_param.split(",") if x.strip()]
            except ValueError:
                raise ApiError(400, "Parameter 'ids' must be a comma separated list of integers") from None
            if len(wanted) > 100:
                raise ApiError(400, "Parameter 'ids' accepts at most 100 ids")
            wanted_idxs = sorted({i for i in (self.state.live.index_of(kind, w) for w in wanted) if i is not None})

        if shapes.empty_pages and q.get("cursor") is None:
            # A first page that is empty yet says there is more (issue 8, item 3).
            start = encode_cursor({"field": sort_by, "fieldValue": None, "sortDirection": direction, "id": None, "start": True})
            return {"success": True, "data": [], "additional_data": {"next_cursor": start}}

        shaped = self.state.live.touches(kind) and sort_by in MONOTONIC_SORTS
        if shaped and wanted_idxs is None and not shapes.touches(kind):
            # Only live changes touch the kind: lazily, without materialising its rows.
            ck = self._cursor_key(kind, cursor, sort_by) if cursor is not None else None
            candidates: Iterable[int] = self._live_order(kind, spec.subset, since, until, sort_by, desc, ck)
        elif shaped:
            ordered = self._shaped_order(kind, spec.subset, since, until, sort_by, desc, wanted_idxs)
            if cursor is not None:
                ck = self._cursor_key(kind, cursor, sort_by)
                ordered = [r for r in ordered if (r[0] < ck if desc else r[0] > ck)]
            candidates = [i for _, i in ordered]
        elif wanted_idxs is not None:
            idxs = [i for i in wanted_idxs if lo <= i < hi]
            if spec.subset != "all":
                idxs = [i for i in idxs if ds.is_archived(kind, i) == (spec.subset == "archived")]
            candidates = reversed(idxs) if desc else idxs
        else:
            candidates = self._candidates(kind, spec.subset, lo, hi, desc)

        if sort_by in MONOTONIC_SORTS:
            if cursor is not None and not shaped:
                after = ds.index_of(kind, cursor["id"])
                if after is None:
                    raise ApiError(400, "Invalid cursor")
                candidates = (i for i in candidates if (i < after if desc else i > after))
            page: list[tuple[int, dict[str, Any]]] = []
            for i in candidates:
                rec = self._record(kind, i)
                if pred is not None and not pred(rec):
                    continue
                page.append((i, rec))
                if len(page) > size:
                    break
        else:
            # Keyset over a field that does not follow the index (stages by order_nr): materialise.
            rows = [(i, self._record(kind, i)) for i in candidates]
            rows = [r for r in rows if pred is None or pred(r[1])]
            rows.sort(key=lambda r: (_sort_value(r[1].get(sort_by)), r[0]), reverse=desc)
            if cursor is not None:
                after_key = (_sort_value(cursor.get("fieldValue")), ds.index_of(kind, cursor["id"]) or 0)
                rows = [r for r in rows if ((_sort_value(r[1].get(sort_by)), r[0]) < after_key if desc else (_sort_value(r[1].get(sort_by)), r[0]) > after_key)]
            page = rows[: size + 1]
        more = len(page) > size
        page = page[:size]
        next_cursor = None
        if more and page:
            last_i, last_rec = page[-1]
            next_cursor = encode_cursor(
                {"field": sort_by, "fieldValue": self._sort_field_value(kind, last_i, last_rec, sort_by), "sortDirection": direction, "id": ds.ident(kind, last_i)}
            )
        data = [self._v2_custom(kind, rec, q) for _, rec in page]
        included = {f.strip() for f in (q.get("include_fields") or "").split(",") if f.strip()}
        if kind == "deals" and "email_messages_count" in included:
            # The one include_fields value a full export needs: which deals have mail to list.
            data = [
                {**row, "email_messages_count": len(self.state.live.deal_message_ids(i))} if isinstance(row, dict) else row
                for (i, _), row in zip(page, data)
            ]  # copies: records may be shared with the generator's cache
        if spec.subset == "active" and kind in FLIP_KINDS:
            shapes.served_active(kind, [i for i, _ in page])  # archive_flip: archived right after being served
        return {"success": True, "data": data, "additional_data": {"next_cursor": next_cursor}}

    def _sort_field_value(self, kind: str, index: int, rec: dict[str, Any], sort_by: str) -> Any:
        if sort_by == "id":
            return self.ds.ident(kind, index)
        if sort_by == "update_time":
            t = self.state.live.update_ts(kind, index)
            return rfc3339(t) if t is not None else None
        if sort_by == "add_time":
            return self.state.live.add_ts_text(kind, index)
        return rec.get(sort_by)

    def v2_single(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        kind = KIND_OF_V2[endpoint.spec_path.split("/")[1]]
        try:
            ident = int(params["id"])
        except ValueError:
            raise ApiError(400, "Parameter 'id' must be an integer") from None
        index = self.state.live.index_of(kind, ident)
        if index is None:
            raise ApiError(404, f"{SINGULAR[kind]} not found")
        rec = self._record(kind, index)
        return {"success": True, "data": self._v2_custom(kind, rec, q)}

    def v2_fields(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        entity = ENTITY_OF_V2_FIELDS[endpoint.spec_path.strip("/")]
        items = v2_fields(self.ds, entity)
        limit = self.state.shapes.cap(q.limit())
        start = 0
        if q.get("cursor"):
            cur = decode_cursor(q.get("cursor") or "")
            try:
                start = 0 if cur.get("start") else int(cur["id"]) + 1
            except (TypeError, ValueError):
                raise ApiError(400, "Invalid cursor") from None
        elif self.state.shapes.empty_pages:
            first = encode_cursor({"field": "order", "fieldValue": None, "sortDirection": "asc", "id": None, "start": True})
            return {"success": True, "data": [], "additional_data": {"next_cursor": first}}
        page = items[start : start + limit]
        more = start + limit < len(items)
        next_cursor = encode_cursor({"field": "order", "fieldValue": start + limit - 1, "sortDirection": "asc", "id": start + limit - 1}) if more else None
        return {"success": True, "data": page, "additional_data": {"next_cursor": next_cursor}}

    def v2_field(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        entity = ENTITY_OF_V2_FIELDS[endpoint.spec_path.strip("/").split("/")[0]]
        for item in v2_fields(self.ds, entity):
            if item["field_code"] == params["field_code"]:
                return {"success": True, "data": item}
        raise ApiError(404, "Field not found")

    # ------------------------------------------------------------------ v1 handlers
    def _v1_page(
        self,
        kind: str,
        candidates: Iterable[int],
        q: Query,
        pred: Callable[[dict[str, Any]], bool] | None,
        sort: tuple[str, bool] | None,
    ) -> tuple[list[dict[str, Any]], int, int, bool, list[int]]:
        """(rows, start, limit asked, more, indexes of the rows) of one offset page."""
        start = q.int("start", 0, minimum=0) or 0
        limit = q.limit()
        size = self.state.shapes.cap(limit)
        out: list[tuple[int, dict[str, Any]]] = []
        if sort is None:
            if pred is None:
                for i in itertools.islice(candidates, start, start + size + 1):
                    out.append((i, self._record(kind, i)))
            else:
                matched = 0
                for i in candidates:
                    rec = self._record(kind, i)
                    if not pred(rec):
                        continue
                    if matched >= start:
                        out.append((i, rec))
                        if len(out) > size:
                            break
                    matched += 1
        else:
            field_name, desc = sort
            rows = [(i, self._record(kind, i)) for i in candidates]
            if pred is not None:
                rows = [r for r in rows if pred(r[1])]
            if field_name == "update_time":
                # Only shape-touched kinds sort times this way: null last ascending, first descending.
                rows.sort(key=lambda r: (r[1].get(field_name) is None, _sort_value(r[1].get(field_name))), reverse=desc)
            else:
                rows.sort(key=lambda r: _sort_value(r[1].get(field_name)), reverse=desc)
            out = rows[start : start + size + 1]
        more = len(out) > size
        out = out[:size]
        return [rec for _, rec in out], start, limit, more, [i for i, _ in out]

    def _v1_sort(self, q: Query, monotonic: frozenset[str], allowed: tuple[str, ...], kind: str = "") -> tuple[tuple[str, bool] | None, bool]:
        """(fallback sort or None, descending for the index order)."""
        raw = q.get("sort")
        if raw is None:
            return None, False
        first = raw.split(",")[0].strip().split()
        field_name = first[0]
        desc = len(first) > 1 and first[1].upper() == "DESC"
        if len(first) > 1 and first[1].upper() not in ("ASC", "DESC"):
            raise ApiError(400, "Parameter 'sort' must be 'field ASC' or 'field DESC'")
        if field_name not in allowed:
            raise ApiError(400, f"Parameter 'sort' supports: {', '.join(allowed)}")
        if field_name == "update_time" and kind and self.state.live.touches(kind):
            return (field_name, desc), False  # null or moved times do not follow the index
        if field_name in monotonic:
            return None, desc
        return (field_name, desc), False

    def v1_leads(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        ds = self.ds
        archived = endpoint.spec_path == "/leads/archived"
        if q.get("filter_id") is not None:
            raise ApiError(404, "Filter not found")
        sort, desc = self._v1_sort(
            q,
            frozenset({"add_time", "update_time"}),
            ("id", "title", "owner_id", "creator_id", "was_seen", "expected_close_date", "next_activity_id", "add_time", "update_time"),
            "leads",
        )
        lo, hi = 0, ds.count("leads")
        since = None
        if not archived:
            since = q.time("updated_since")
            if since is not None:
                lo = ds.first_index_at_or_after("leads", since)
        spec = ListSpec("leads", filters=(("owner_id", "owner_id", "int"), ("person_id", "person_id", "int"), ("organization_id", "organization_id", "int")))
        pred = self._filter_pred(spec, q)
        subset = "archived" if archived else "active"
        shapes = self.state.shapes
        if self.state.live.touches("leads") and not shapes.touches("leads"):
            candidates: Iterable[int] = self._live_order("leads", subset, since, None, "id", desc, None)
        elif self.state.live.touches("leads"):
            candidates = [i for _, i in self._shaped_order("leads", subset, since, None, "id", desc)]
        else:
            candidates = self._candidates("leads", subset, lo, hi, desc)
        rows, start, limit, more, served = self._v1_page("leads", candidates, q, pred, sort)
        if not archived:
            shapes.served_active("leads", served)  # archive_flip: archived right after being served
        return {"success": True, "data": rows, "additional_data": _v1_additional(start, limit, more, len(rows), flat=True)}

    def v1_notes(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        ds = self.ds
        sort, desc = self._v1_sort(
            q,
            frozenset({"id", "add_time", "update_time"}),
            ("id", "user_id", "deal_id", "person_id", "org_id", "content", "add_time", "update_time"),
            "notes",
        )
        lo, hi = 0, ds.count("notes")
        since = q.time("updated_since")
        if since is not None:
            lo = ds.first_index_at_or_after("notes", since)
        filters = [
            ("user_id", "user_id", "int"),
            ("lead_id", "lead_id", "str"),
            ("deal_id", "deal_id", "int"),
            ("person_id", "person_id", "int"),
            ("org_id", "org_id", "int"),
            ("project_id", "project_id", "int"),
            ("task_id", "task_id", "int"),
        ]
        for flag in ("lead", "deal", "organization", "person", "project", "task"):
            filters.append((f"pinned_to_{flag}_flag", f"pinned_to_{flag}_flag", "bool"))
        pred_fields = self._filter_pred(ListSpec("notes", filters=tuple(filters)), q)
        start_date, end_date = q.get("start_date"), q.get("end_date")
        for name, value in (("start_date", start_date), ("end_date", end_date)):
            if value is not None and not re.match(r"^\d{4}-\d{2}-\d{2}$", value):
                raise ApiError(400, f"Parameter '{name}' must be a date YYYY-MM-DD")
        pred = pred_fields
        if start_date or end_date:

            def pred(rec: dict[str, Any], _base: Any = pred_fields) -> bool:
                when = str(rec.get("add_time", ""))[:10]
                if start_date and when < start_date:
                    return False
                if end_date and when > end_date:
                    return False
                return _base is None or _base(rec)

        if self.state.live.touches("notes") and not self.state.shapes.touches("notes"):
            candidates: Iterable[int] = self._live_order("notes", "all", since, None, "id", desc, None)
        elif self.state.live.touches("notes"):
            candidates = [i for _, i in self._shaped_order("notes", "all", since, None, "id", desc)]
        else:
            candidates = self._candidates("notes", "all", lo, hi, desc)
        rows, start, limit, more, _ = self._v1_page("notes", candidates, q, pred, sort)
        return {"success": True, "data": rows, "additional_data": _v1_additional(start, limit, more, len(rows))}

    def v1_users(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        rows, start, limit, more, _ = self._v1_page("users", range(self.ds.count("users")), q, None, None)
        return {"success": True, "data": rows, "additional_data": _v1_additional(start, limit, more, len(rows))}

    def v1_me(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """The token's user (the first, the account's admin) with its company: one sandbox, one company."""
        return {"success": True, "data": {**self.ds.record("users", 0), **self.ds.company()}}

    def v1_single(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        kind = endpoint.spec_path.split("/")[1]
        ident: Any = params["id"]
        if kind != "leads":
            try:
                ident = int(ident)
            except ValueError:
                raise ApiError(400, "Parameter 'id' must be an integer") from None
        index = self.state.live.index_of(kind, ident)
        if index is None:
            raise ApiError(404, f"{SINGULAR[kind]} not found" if kind != "leads" else "requested lead not found")
        return {"success": True, "data": self._record(kind, index)}

    def v1_fields(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        if endpoint.spec_path == "/leadFields":
            items = v1_lead_fields(self.ds)
        elif endpoint.spec_path == "/noteFields":
            items = v1_note_fields(self.ds)
        else:
            items = v1_entity_fields(self.ds, ENTITY_OF_V1_FIELDS[endpoint.spec_path.strip("/")])
        start = q.int("start", 0, minimum=0) or 0
        limit = q.limit()
        size = self.state.shapes.cap(limit)
        page = items[start : start + size]
        more = start + size < len(items)
        return {"success": True, "data": page, "additional_data": _v1_additional(start, limit, more, len(page), flat=True)}

    def v1_deals_summary(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        """`/v1/deals/summary[/archived]`: count and values of the active (archived) deals as served
        now, optionally filtered by status, user_id, pipeline_id, stage_id."""
        archived = endpoint.spec_path.endswith("/archived")
        if q.get("filter_id") is not None:
            raise ApiError(404, "Filter not found")
        status = q.get("status")
        if status is not None and status not in ("open", "won", "lost"):
            raise ApiError(400, "Parameter 'status' must be one of: open, won, lost")
        user_id, pipeline_id, stage_id = q.int("user_id"), q.int("pipeline_id"), q.int("stage_id")
        shapes = self.state.shapes
        live = self.state.live
        key = (archived, status, user_id, pipeline_id, stage_id, tuple(sorted(shapes.flipped["deals"])))
        if self.state.summary_version != live.version:
            self.state.summary_cache.clear()
            self.state.summary_version = live.version
        cached = self.state.summary_cache.get(key)
        if cached is not None:
            return {"success": True, "data": cached}
        ds = self.ds
        stage_probability = {ds.record("stages", s)["id"]: ds.record("stages", s)["deal_probability"] for s in range(ds.count("stages"))}

        def count(totals: dict[str, list[float]], rec: dict[str, Any], sign: int) -> None:
            if status is not None and rec["status"] != status:
                return
            if user_id is not None and rec["owner_id"] != user_id:
                return
            if pipeline_id is not None and rec["pipeline_id"] != pipeline_id:
                return
            if stage_id is not None and rec["stage_id"] != stage_id:
                return
            t = totals.setdefault(rec["currency"], [0.0, 0, 0.0])  # currency -> [value, count, weighted]
            t[0] += sign * rec["value"]
            t[1] += sign
            t[2] += sign * rec["value"] * stage_probability.get(rec["stage_id"], 100) / 100.0

        base = self.state.summary_base.get(key)
        if base is None:
            base = {}
            for i in range(ds.count("deals")):
                if shapes.is_archived("deals", i) == archived:
                    count(base, ds.record("deals", i), 1)  # never the malformed copy: the source's own count
            self.state.summary_base[key] = base
        totals = {currency: list(t) for currency, t in base.items()}
        # Live changes: take the deals they touched out as generated, put them back as they are now
        # (values are multiples of 250 and probabilities of 20%: the float sums stay exact).
        for i in live.touched("deals"):
            if i < ds.count("deals") and shapes.is_archived("deals", i) == archived:
                count(totals, ds.record("deals", i), -1)
            if live.exists("deals", i) and live.is_archived("deals", i) == archived:
                count(totals, live.record("deals", i), 1)
        data = _deals_summary({currency: t for currency, t in totals.items() if t[1]})
        self.state.summary_cache[key] = data
        return {"success": True, "data": data}

    def _mail_item(self, mid: int) -> dict[str, Any]:
        if self.state.shapes.hostile_of(mid) is not None:
            return self.state.shapes.hostile_list_item(mid)
        if mid in self.state.live.mail:
            return self.state.live.mail_list_item(mid)
        return self.ds.mail_list_item(mid, self.state.badrow)

    def v1_deal_mail(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        try:
            deal_id = int(params["id"])
        except ValueError:
            raise ApiError(400, "Parameter 'id' must be an integer") from None
        d = self.state.live.index_of("deals", deal_id)
        if d is None:
            raise ApiError(404, "Deal not found")
        ids = self.state.live.deal_message_ids(d)
        start = q.int("start", 0, minimum=0) or 0
        limit = q.limit()
        size = self.state.shapes.cap(limit)
        chunk = ids[start : start + size]
        more = start + size < len(ids)
        data = [self._mail_item(mid) for mid in chunk]
        return {"success": True, "data": data, "additional_data": _v1_additional(start, limit, more, len(data), flat=True)}

    def v1_mail_message(self, endpoint: Endpoint, params: dict[str, str], q: Query) -> dict[str, Any]:
        try:
            mid = int(params["id"])
        except ValueError:
            raise ApiError(400, "Parameter 'id' must be an integer") from None
        shapes = self.state.shapes
        include_body = q.get("include_body") in ("1", "true")
        index = self.ds.index_of("mail_messages", mid)
        live_data = self.state.live.mail_data(mid) if index is None else None
        if live_data is not None:  # a message a live change added
            data = live_data
            if include_body:
                data["body"] = self.state.live.mail_body(mid)
        elif index is None:
            if shapes.hostile_of(mid) is None:
                raise ApiError(404, "Mail message not found")
            data = shapes.hostile_record(mid)
            if include_body:
                data["body"] = shapes.hostile_body(mid)
        else:
            private = shapes.private.get(mid)
            if include_body and private is not None:
                # A message private to another user: listed on the deal, its body is not ours to read.
                raise ApiError(private, "You do not have permission to read this mail message" if private == 403 else "Mail message not found")
            data = dict(self.ds.record("mail_messages", index, self.state.badrow))
            if include_body:
                data["body"] = self.ds.mail_body(mid, self.state.badrow)
        return {"success": True, "statusCode": 2000, "statusText": "Success", "service": "email-api", "data": data}


CURRENCY_SYMBOL = {"EUR": "€", "USD": "US$", "GBP": "£", "SEK": "SEK "}
EUR_PER_UNIT = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17, "SEK": 0.087}  # fixed rates: the company currency is EUR


def _money(currency: str, value: float) -> str:
    return f"{CURRENCY_SYMBOL.get(currency, currency + ' ')}{value:,.2f}"


def _deals_summary(totals: dict[str, list[float]]) -> dict[str, Any]:
    """The deals summary `data` from per-currency [value, count, weighted value]."""
    values: dict[str, Any] = {}
    weighted: dict[str, Any] = {}
    converted = weighted_converted = 0.0
    count = 0
    for currency in sorted(totals):
        value, n, w = totals[currency]
        rate = EUR_PER_UNIT.get(currency, 1.0)
        values[currency] = {
            "value": round(value, 2),
            "count": int(n),
            "value_converted": round(value * rate, 2),
            "value_formatted": _money(currency, value),
            "value_converted_formatted": _money("EUR", value * rate),
        }
        weighted[currency] = {"value": round(w, 2), "count": int(n), "value_formatted": _money(currency, w)}
        converted += value * rate
        weighted_converted += w * rate
        count += int(n)
    return {
        "values_total": values,
        "weighted_values_total": weighted,
        "total_count": count,
        "total_currency_converted_value": round(converted, 2),
        "total_weighted_currency_converted_value": round(weighted_converted, 2),
        "total_currency_converted_value_formatted": _money("EUR", converted),
        "total_weighted_currency_converted_value_formatted": _money("EUR", weighted_converted),
    }


def _v1_additional(start: int, limit: int, more: bool, returned: int, flat: bool = False) -> dict[str, Any]:
    pagination: dict[str, Any] = {"start": start, "limit": limit, "more_items_in_collection": more}
    if more:
        pagination["next_start"] = start + returned
    out: dict[str, Any] = {"pagination": pagination}
    if flat:
        # Some v1 schemas (leads, lead/note fields, a deal's mail) document these at the top level.
        out.update({"start": start, "limit": limit, "more_items_in_collection": more})
    return out


def _sort_value(value: Any) -> tuple[int, Any]:
    """A total order over mixed values (None first, then numbers, then strings, then the rest)."""
    if value is None:
        return (0, 0)
    if isinstance(value, bool):
        return (1, int(value))
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, json.dumps(value, sort_keys=True, default=str))


def _listing_key(path: str, query: Iterable[tuple[str, str]]) -> str:
    items = sorted((k, v) for k, v in query if k != "api_token")
    return path + ("?" + "&".join(f"{k}={v}" for k, v in items) if items else "")


def create_app(config: SandboxConfig | None = None) -> Starlette:
    """The ASGI application for a config (its state is `app.state.sandbox`)."""
    return SandboxApp(config or SandboxConfig()).starlette
