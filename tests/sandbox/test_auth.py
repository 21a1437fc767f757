"""Auth: the three documented ways are accepted, anything else is 401, and the token is never logged.

Pins `x-api-token` header, `api_token` query parameter and `Authorization: Bearer`; a missing or
wrong token is 401 with the error envelope; `/_sandbox/` needs no token; and neither the sandbox
in-process (all loggers at DEBUG) nor its subprocess (stdout/stderr) ever writes the token.
"""
from __future__ import annotations

import logging

import httpx
import pytest

from pipedrive_sandbox import SandboxConfig, SandboxServer, start_subprocess

SECRET = "tok-SECRET-8f3a9c"


def exercise(base_url: str, token: str) -> list[int]:
    codes = []
    with httpx.Client(base_url=base_url, timeout=10) as c:
        codes.append(c.get("/api/v2/deals", headers={"x-api-token": token}).status_code)
        codes.append(c.get("/api/v2/deals", params={"api_token": token}).status_code)
        codes.append(c.get("/v1/notes", headers={"Authorization": f"Bearer {token}"}).status_code)
        codes.append(c.get("/api/v2/nothing-here", params={"api_token": token}).status_code)
        codes.append(c.get("/api/v2/deals", params={"api_token": token, "limit": "9999"}).status_code)
        codes.append(c.get("/v1/recents", params={"api_token": token}).status_code)
        codes.append(c.get("/api/v2/deals", params={"api_token": token + "x"}).status_code)
        codes.append(c.get("/api/v2/deals").status_code)
        codes.append(c.get("/api/v2/deals", headers={"Authorization": f"Basic {token}"}).status_code)
        codes.append(c.get("/v1/mailbox/mailMessages/1", params={"api_token": token, "include_body": 1}).status_code)
    return codes


EXPECTED = [200, 200, 200, 404, 400, 404, 401, 401, 401, 200]


def test_three_ways_accepted_others_401(caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    with SandboxServer(SandboxConfig(token=SECRET, faults="500:0.2,drop:0.1")) as sb:
        sb.configure(faults="")
        assert exercise(sb.base_url, SECRET) == EXPECTED
        r = httpx.get(sb.base_url + "/api/v2/deals", params={"api_token": "wrong"})
        assert r.status_code == 401
        assert r.json() == {
            "success": False,
            "error": "unauthorized access",
            "errorCode": 401,
            "error_info": "Please check developers.pipedrive.com for more information about Pipedrive API.",
            "data": None,
            "additional_data": None,
        }
        assert httpx.get(sb.base_url + "/_sandbox/stats").status_code == 200
        assert SECRET not in httpx.get(sb.base_url + "/_sandbox/stats").text
        assert SECRET not in httpx.get(sb.base_url + "/_sandbox/config").text
        sb.configure(faults="500:0.3,503:0.3,drop:0.2")
        for i in range(20):
            try:
                httpx.get(sb.base_url + f"/api/v2/deals/{i}", params={"api_token": SECRET})
            except httpx.HTTPError:
                pass
    out, err = capfd.readouterr()
    # The test's own HTTP client (httpx/httpcore) logs URLs; everything else is the server side.
    server_records = [r for r in caplog.records if not r.name.startswith(("httpx", "httpcore"))]
    server_text = "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in server_records)
    assert SECRET not in server_text
    assert SECRET not in out and SECRET not in err


def test_token_not_in_subprocess_output(tmp_path) -> None:  # type: ignore[no-untyped-def]
    log_path = tmp_path / "sandbox.log"
    with log_path.open("w") as log:
        proc, base_url = start_subprocess(SandboxConfig(token=SECRET, faults="drop:0.2,500:0.2"), stderr=log)
        try:
            for _ in range(3):
                try:
                    exercise(base_url, SECRET)
                except httpx.HTTPError:
                    pass
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=15)
    text = log_path.read_text() + (out or "")
    assert "SANDBOX_READY" in text or base_url
    assert SECRET not in text
