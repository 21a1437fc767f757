"""Fidelity to Pipedrive's published API: every request the client makes, exercising every method
the way the engine uses them, is a GET the OpenAPI files define - path under the spec's server
prefix (`/v1`, `/api/v2`), every query parameter declared for that operation with a value its
schema allows - and authenticates with the spec's `api_key` scheme (the `x-api-token` header).

The files are read from PIPEDRIVE_OPENAPI_DIR, by default `<repo>/../shared/pipedrive-openapi`.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.client.support import TOKEN, Script, make_client, ok

REPO = Path(__file__).resolve().parents[2]
SPEC_DIR = Path(os.environ.get("PIPEDRIVE_OPENAPI_DIR", REPO.parent / "shared" / "pipedrive-openapi"))
SPEC_FILES = ("pipedrive-v1-openapi.yml", "pipedrive-v2-openapi.yml")


@dataclass(frozen=True)
class Operation:
    prefix: str
    template: str
    pattern: re.Pattern[str]
    query: dict[str, dict[str, Any]]  # query parameter name -> schema
    security: tuple[str, ...]


def _load() -> tuple[list[Operation], dict[str, Any]]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the OpenAPI files")
    missing = [f for f in SPEC_FILES if not (SPEC_DIR / f).is_file()]
    if missing:
        pytest.skip(f"OpenAPI files not found in {SPEC_DIR} (set PIPEDRIVE_OPENAPI_DIR): {', '.join(missing)}")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    operations: list[Operation] = []
    schemes: dict[str, Any] = {}
    for name in SPEC_FILES:
        spec = yaml.load((SPEC_DIR / name).read_text(), Loader=loader)
        prefix = urlsplit(spec["servers"][0]["url"]).path.rstrip("/")
        components = spec.get("components", {})
        schemes.update(components.get("securitySchemes", {}))
        for template, item in spec["paths"].items():
            op = item.get("get")
            if op is None:
                continue
            params = [_resolve(p, components) for p in item.get("parameters", []) + op.get("parameters", [])]
            query = {p["name"]: p.get("schema", {}) for p in params if p.get("in") == "query"}
            regex = re.sub(r"\\\{[^}]+\\\}", r"[^/]+", re.escape(prefix + template))
            security = tuple(k for s in op.get("security", spec.get("security", [])) for k in s)
            operations.append(Operation(prefix, template, re.compile(f"^{regex}$"), query, security))
    return operations, schemes


def _resolve(param: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    ref = param.get("$ref")
    if not ref:
        return param
    node: Any = {"components": components}
    for part in ref.lstrip("#/").split("/"):
        node = node[part]
    return node


@pytest.fixture(scope="module")
def spec() -> tuple[list[Operation], dict[str, Any]]:
    return _load()


def _allowed(value: str, schema: dict[str, Any]) -> bool:
    kind = schema.get("type")
    if kind in ("integer", "number"):
        try:
            number = float(value)
        except ValueError:
            return False
        if kind == "integer" and not number.is_integer():
            return False
        if "maximum" in schema and number > schema["maximum"]:
            return False
        if "minimum" in schema and number < schema["minimum"]:
            return False
        if "enum" in schema and number not in schema["enum"]:
            return False
        return True
    if "enum" in schema:
        return value in [str(v) for v in schema["enum"]]
    return True


def _exercise() -> list[httpx.Request]:
    """Every client method, called the way the engine's phases call it."""

    def answer(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.startswith("/v1/mailbox/"):
            return ok({"id": 1, "body": "<p>x</p>"})
        if path.startswith("/api/v2/"):
            more = request.url.params.get("cursor") is None
            return ok([{"id": 1}], additional_data={"next_cursor": "c1" if more else None})
        if path == "/v1/users":
            return ok([{"id": 1}])
        if path == "/v1/users/me":
            return ok({"id": 1, "company_id": 7})
        more = request.url.params.get("start") == "0"
        return ok([{"id": 1}], additional_data={"pagination": {"more_items_in_collection": more, "next_start": 500}})

    script = Script([answer])
    client, _ = make_client(script)
    for kind in ("persons", "organizations", "deals", "activities", "deals/archived", "pipelines", "stages"):
        list(client.iter_v2(f"/api/v2/{kind}", {"sort_by": "id", "sort_direction": "asc"}))
    client.list_v2("/api/v2/deals", {"updated_since": "2020-01-01T00:00:00Z"}, cursor="abc", limit=500)
    for kind in ("leads", "leads/archived", "notes"):
        list(client.iter_v1(f"/v1/{kind}"))
    client.list_v1("/v1/notes", {"sort": "id ASC"}, start=1000, limit=500)
    client.get("/v1/users")  # v1 users is one unpaginated list
    client.mail_messages(553, start=0, limit=500)
    client.mail_messages(553, start=500)
    client.mail_body(42)
    assert client.me()["company_id"] == 7  # the run's source identity
    return script.requests


def test_every_request_exists_in_the_spec(spec: tuple[list[Operation], dict[str, Any]]) -> None:
    operations, _ = spec
    requests = _exercise()
    assert len(requests) > 20
    problems = []
    for request in requests:
        path = request.url.path
        matches = [op for op in operations if op.pattern.match(path)]
        # prefer the literal template over a parameterised one (/deals/archived vs /deals/{id})
        matches.sort(key=lambda op: op.template.count("{"))
        if request.method != "GET" or not matches:
            problems.append(f"{request.method} {path}: no such GET in the spec")
            continue
        op = matches[0]
        for name, value in request.url.params.multi_items():
            if name not in op.query:
                problems.append(f"{path}: query parameter {name!r} is not declared for {op.prefix}{op.template}")
            elif not _allowed(value, op.query[name]):
                problems.append(f"{path}: {name}={value!r} is outside {op.query[name]}")
        if "api_key" not in op.security:
            problems.append(f"{path}: the operation does not accept the api_key scheme")
    assert problems == []


def test_auth_is_the_spec_api_key_header(spec: tuple[list[Operation], dict[str, Any]]) -> None:
    _, schemes = spec
    assert schemes["api_key"] == {"type": "apiKey", "name": "x-api-token", "in": "header"}
    requests = _exercise()
    assert all(r.headers.get("x-api-token") == TOKEN for r in requests)
    assert all("api_token" not in str(r.url) for r in requests)
