"""Fixtures for the sandbox tests: the published OpenAPI files, and sandbox servers on real sockets.

The spec files are read from $PIPEDRIVE_OPENAPI_DIR (default: ../shared/pipedrive-openapi relative
to the repository root); tests that need them are skipped when they are missing.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from pipedrive_sandbox import SandboxConfig, SandboxServer

REPO_ROOT = Path(__file__).resolve().parents[2]
TOKEN = "sandbox-token"


def openapi_dir() -> Path:
    return Path(os.environ.get("PIPEDRIVE_OPENAPI_DIR") or (REPO_ROOT / ".." / "shared" / "pipedrive-openapi")).resolve()


@pytest.fixture(scope="session")
def specs() -> dict[str, dict[str, Any]]:
    """{'v1': spec, 'v2': spec} loaded from the published files."""
    folder = openapi_dir()
    out = {}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    for api in ("v1", "v2"):
        path = folder / f"pipedrive-{api}-openapi.yml"
        if not path.exists():
            pytest.skip(f"OpenAPI file not found: {path} (set PIPEDRIVE_OPENAPI_DIR)")
        with path.open(encoding="utf-8") as fh:
            out[api] = yaml.load(fh, Loader=loader)
    return out


def resolve_refs(spec: dict[str, Any], node: Any, seen: tuple[str, ...] = ()) -> Any:
    """Inline every $ref (recursive refs are cut to an empty schema)."""
    if isinstance(node, dict):
        if "$ref" in node:
            ref = node["$ref"]
            if ref in seen:
                return {}
            target: Any = spec
            for part in ref.lstrip("#/").split("/"):
                target = target[part]
            return resolve_refs(spec, target, seen + (ref,))
        return {k: resolve_refs(spec, v, seen) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve_refs(spec, v, seen) for v in node]
    return node


def openapi_to_jsonschema(node: Any) -> Any:
    """OpenAPI 3.0 schema -> JSON schema: `nullable: true` becomes an explicit null alternative."""
    if isinstance(node, list):
        return [openapi_to_jsonschema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: openapi_to_jsonschema(v) for k, v in node.items() if k not in ("nullable", "example", "examples", "discriminator", "xml", "externalDocs", "deprecated", "readOnly", "writeOnly")}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: openapi_to_jsonschema(v) for k, v in node["properties"].items()}
    if node.get("nullable") is True:
        if "enum" in out:
            out["enum"] = list(out["enum"]) + [None]
        if "type" in out:
            t = out["type"]
            out["type"] = list(t) + ["null"] if isinstance(t, list) else [t, "null"]
        else:
            out = {"anyOf": [{"type": "null"}, out]}
    return out


def response_schema(specs: dict[str, Any], api: str, path: str, status: str = "200", method: str = "get") -> dict[str, Any]:
    spec = specs[api]
    op = spec["paths"][path][method]
    schema = op["responses"][status]["content"]["application/json"]["schema"]
    return openapi_to_jsonschema(resolve_refs(spec, copy.deepcopy(schema)))


def make_client(base_url: str, token: str = TOKEN) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers={"x-api-token": token}, timeout=30)


@pytest.fixture(scope="module")
def tiny() -> Iterator[SandboxServer]:
    """A tiny sandbox with limits out of the way."""
    with SandboxServer(SandboxConfig(scale="tiny", seed=1, burst_limit=1_000_000)) as sb:
        yield sb


@pytest.fixture(scope="module")
def client(tiny: SandboxServer) -> Iterator[httpx.Client]:
    with make_client(tiny.base_url) as c:
        yield c
