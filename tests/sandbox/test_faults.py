"""Faults: each kind happens at its rate, deterministically under the seed.

Pins:
* 500/503 answer the error envelope, 502 answers a gateway's HTML page, badjson answers 200 with
  a truncated JSON body, drop closes the connection without a response, slow answers only after
  `slow_seconds` (beyond a client's timeout);
* each kind's observed share is within binomial tolerance of its rate;
* decisions are a function of (seed, method, path, sorted query, n-th time seen): two servers with
  the same seed make the same decisions, also when the requests race in threads; another seed
  makes other decisions; a retried request gets a new draw;
* `badrow` malformed rows are deterministic per (seed, kind, position), listed in truth, and
  exactly the rows served malformed; faults can be removed at run time.
"""
from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from pipedrive_sandbox import SandboxConfig, SandboxServer

from .conftest import TOKEN, make_client
from .test_pagination import walk_v1, walk_v2


def outcome(client: httpx.Client, url: str) -> str:
    try:
        r = client.get(url)
    except httpx.TimeoutException:
        return "timeout"
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ConnectError):
        return "dropped"
    if r.status_code != 200:
        return str(r.status_code)
    try:
        json.loads(r.content)
    except ValueError:
        return "badjson"
    return "200"


def urls(n: int) -> list[str]:
    return [f"/api/v2/deals/{1 + (i % 40)}?probe={i}" for i in range(n)]


def within(count: int, n: int, rate: float) -> bool:
    sd = math.sqrt(n * rate * (1 - rate))
    return abs(count - n * rate) <= 4 * sd + 1


def test_each_kind_at_its_rate_with_its_shape() -> None:
    rates = {"500": 0.08, "502": 0.08, "503": 0.08, "badjson": 0.08, "drop": 0.08}
    faults = ",".join(f"{k}:{v}" for k, v in rates.items())
    n = 500
    with SandboxServer(SandboxConfig(faults=faults, burst_limit=10**6)) as sb, make_client(sb.base_url) as c:
        seen: dict[str, int] = {}
        for url in urls(n):
            kind = outcome(c, url)
            seen[kind] = seen.get(kind, 0) + 1
        for kind, rate in rates.items():
            key = "dropped" if kind == "drop" else kind
            assert within(seen.get(key, 0), n, rate), (kind, seen)
        stats = sb.stats()["faults"]
        for kind in rates:
            assert stats.get(kind, 0) >= seen.get("dropped" if kind == "drop" else kind, 0)
        # Shapes, found with the deterministic draw: probe until each kind shows up once.
        found: dict[str, httpx.Response] = {}
        for i in range(400):
            url = f"/api/v2/pipelines?shape={i}"
            try:
                r = c.get(url)
            except httpx.HTTPError:
                continue
            found.setdefault(str(r.status_code) if r.status_code != 200 or _is_json(r) else "badjson", r)
        assert found["500"].json()["success"] is False and found["500"].json()["error"]
        assert found["503"].json()["errorCode"] == 503
        assert "text/html" in found["502"].headers["content-type"] and b"502 Bad Gateway" in found["502"].content
        bad = found["badjson"]
        assert bad.status_code == 200 and bad.content.startswith(b'{"success":true')
        assert "x-ratelimit-remaining" in found["503"].headers


def _is_json(r: httpx.Response) -> bool:
    try:
        json.loads(r.content)
        return True
    except ValueError:
        return False


def test_slow_is_beyond_the_client_timeout() -> None:
    cfg = SandboxConfig(faults="slow:0.5", slow_seconds=1.5, burst_limit=10**6)
    with SandboxServer(cfg) as sb, httpx.Client(base_url=sb.base_url, headers={"x-api-token": TOKEN}, timeout=0.4) as c:
        with ThreadPoolExecutor(12) as pool:
            got = list(pool.map(lambda u: outcome(c, u), urls(12)))
        assert "timeout" in got and "200" in got
        assert within(got.count("timeout"), 12, 0.5)


def run_sequence(cfg: SandboxConfig, sequence: list[str], threads: int = 1) -> list[str]:
    with SandboxServer(cfg) as sb:
        if threads == 1:
            with make_client(sb.base_url) as c:
                return [outcome(c, u) for u in sequence]

        with make_client(sb.base_url) as shared, ThreadPoolExecutor(threads) as pool:
            return list(pool.map(lambda u: outcome(shared, u), sequence))


def test_same_seed_same_decisions_other_seed_other_decisions() -> None:
    faults = "500:0.1,503:0.1,badjson:0.1,drop:0.05"
    seq = urls(120)
    a = run_sequence(SandboxConfig(seed=7, faults=faults, burst_limit=10**6), seq)
    b = run_sequence(SandboxConfig(seed=7, faults=faults, burst_limit=10**6), seq)
    c = run_sequence(SandboxConfig(seed=8, faults=faults, burst_limit=10**6), seq)
    assert a == b
    assert a != c
    assert set(a) - {"200"}, "faults happened at all"


def test_decisions_do_not_depend_on_thread_timing() -> None:
    faults = "500:0.15,503:0.15,badjson:0.1"
    seq = urls(80)  # distinct request keys
    sequential = run_sequence(SandboxConfig(seed=3, faults=faults, burst_limit=10**6), seq)
    raced = run_sequence(SandboxConfig(seed=3, faults=faults, burst_limit=10**6), seq, threads=8)
    assert sequential == raced


def test_a_retried_request_gets_a_new_draw_and_sequences_repeat() -> None:
    cfg = SandboxConfig(seed=5, faults="503:0.5", burst_limit=10**6)
    url = "/api/v2/deals?limit=5"
    first = run_sequence(cfg, [url] * 30)
    assert "503" in first and "200" in first
    assert first == run_sequence(cfg, [url] * 30)


def test_faults_can_be_removed_at_run_time() -> None:
    with SandboxServer(SandboxConfig(faults="503:1", burst_limit=10**6)) as sb, make_client(sb.base_url) as c:
        assert c.get("/api/v2/deals").status_code == 503
        sb.configure(faults="")
        assert c.get("/api/v2/deals").status_code == 200
        with pytest.raises(ValueError):
            sb.configure(faults="teapot:0.5")


def malformed_rows(client: httpx.Client) -> dict[str, set[Any]]:
    """Rows that do not look like clean records, found by walking every list endpoint."""
    found: dict[str, set[Any]] = {}
    walks = {
        "persons": ("/api/v2/persons", "name"),
        "organizations": ("/api/v2/organizations", "name"),
        "deals": ("/api/v2/deals", "title"),
        "activities": ("/api/v2/activities", "subject"),
    }
    for kind, (path, name) in walks.items():
        for rec in walk_v2(client, path, limit=500)[0] + (walk_v2(client, "/api/v2/deals/archived", limit=500)[0] if kind == "deals" else []):
            if _looks_malformed(rec, name):
                found.setdefault(kind, set()).add(rec.get("id"))
    for kind, path, name in (("leads", "/v1/leads", "title"), ("leads", "/v1/leads/archived", "title"), ("notes", "/v1/notes", "content")):
        for rec in walk_v1(client, path, limit=500)[0]:
            if _looks_malformed(rec, name):
                found.setdefault(kind, set()).add(rec.get("id"))
    return found


CLEAN_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -:#.,;'<>/()äöüõÄÖÜßÖ")


def _looks_malformed(rec: dict[str, Any], name: str) -> bool:
    if "id" not in rec or rec["id"] == "abc":
        return True
    value = rec.get(name)
    if not isinstance(value, str) or len(value) > 1000:
        return True
    if any(ch not in CLEAN_NAME_CHARS for ch in value) or "DROP TABLE" in value or "<script>" in value:
        return True
    if not isinstance(rec.get("owner_id", rec.get("user_id", 0)), int) or not isinstance(rec.get("add_time", ""), str):
        return True
    return False


def test_badrow_rows_are_deterministic_listed_in_truth_and_served() -> None:
    cfg = SandboxConfig(scale="small", seed=11, faults="badrow:0.03", burst_limit=10**6)
    with SandboxServer(cfg) as sb, make_client(sb.base_url) as c:
        truth = sb.truth("malformed")
        listed = truth["malformed"]
        assert sum(len(v) for v in listed.values()) > 20
        variants = {row["variant"] for rows in truth["malformed_rows"].values() for row in rows}
        assert {"missing_id", "id_string", "name_dict", "oversize", "nul_bytes", "sql_injection", "html_injection", "hostile_unicode"} <= variants
        served = malformed_rows(c)
        for kind in ("persons", "organizations", "deals", "activities", "leads", "notes"):
            rows = truth["malformed_rows"][kind]
            expected = {("abc" if r["variant"] == "id_string" else None if r["variant"] == "missing_id" else r["id"]) for r in rows}
            assert expected <= served.get(kind, set()) | {None}, kind
            # Nothing else is malformed.
            assert served.get(kind, set()) - expected - {None} == set(), kind
        # A NUL byte survives JSON transport as \u0000.
        nul = next(r for r in truth["malformed_rows"]["persons"] + truth["malformed_rows"]["deals"] if r["variant"] == "nul_bytes")
        kind = "persons" if nul in truth["malformed_rows"]["persons"] else "deals"
        raw = c.get(f"/api/v2/{kind}/{nul['id']}").content
        assert b"\\u0000" in raw
        # Body of a malformed message is hostile too.
        msg_rows = truth["malformed_rows"]["mail_messages"]
        assert msg_rows
        sb.configure(faults="")
        assert all(not v for v in sb.truth("malformed")["malformed"].values())
        assert malformed_rows(c) == {}
    with SandboxServer(cfg) as again:
        assert again.truth("malformed") == truth
    with SandboxServer(SandboxConfig(scale="small", seed=12, faults="badrow:0.03")) as other:
        assert other.truth("malformed")["malformed"] != listed
