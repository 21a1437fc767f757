"""End to end over a real socket against the sandbox with faults on (500/502/503, dropped
connections, cut-off JSON, slow answers past the timeout): the client's retries still deliver every
row of a v2 and a v1 listing and every mail body of every deal, exactly the sandbox's ground truth;
and the sandbox's refusals arrive as their typed errors.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from engine_core.budget import Budget
from engine_core.db import Database
from engine_core.providers.pipedrive.client import PipedriveClient
from engine_core.providers.pipedrive.errors import AuthError, NotFound, RequestRejected

sandbox_server = pytest.importorskip("pipedrive_sandbox.server", reason="the sandbox server is not built yet")
from pipedrive_sandbox.config import SandboxConfig  # noqa: E402

TOKEN = "client-test-token"
FAULTS = "500:0.04,502:0.04,503:0.04,drop:0.04,badjson:0.04,slow:0.02"


@pytest.fixture
def sandbox() -> Iterator[Any]:
    config = SandboxConfig(scale="tiny", seed=3, token=TOKEN, faults=FAULTS, latency="none", slow_seconds=1.0)
    with sandbox_server.SandboxServer(config) as sb:
        yield sb


def quick_sleep(seconds: float) -> None:
    time.sleep(min(seconds, 0.02))  # the waits' values are pinned by the unit tests


def test_faults_are_retried_and_nothing_is_lost(sandbox: Any, db: Database) -> None:
    truth = sandbox.truth()
    budget = Budget(db, "pipedrive", "sandbox-company", burst_limit=80)
    client = PipedriveClient(sandbox.base_url, TOKEN, budget=budget, timeout=0.5, max_retries=10, sleep=quick_sleep)
    deals = [row["id"] for page in client.iter_v2("/api/v2/deals", {"sort_by": "id"}, limit=7) for row in page.rows]
    assert deals == truth["ids"]["deals"]
    notes = [row["id"] for page in client.iter_v1("/v1/notes", limit=7) for row in page.rows]
    assert len(notes) == truth["counts"]["notes"] and len(set(notes)) == len(notes)
    bodies: dict[str, list[int]] = {}
    for deal_id, expected in truth["deals_with_mail"].items():
        ids = [row["data"]["id"] for page in _pages(client, int(deal_id)) for row in page.rows]
        assert sorted(ids) == sorted(expected)
        for message_id in ids:
            message = client.mail_body(message_id)
            assert message["id"] == message_id and isinstance(message["body"], str)
        bodies[deal_id] = ids
    stats = sandbox.stats()
    faults = stats["faults"]
    print(f"\nsandbox faults survived: {faults} over {stats['requests_total']} requests")
    assert sum(faults.values()) >= 3  # the faults were real
    assert stats["rate_limited"]["burst"] == 0
    client.close()


def _pages(client: PipedriveClient, deal_id: int) -> Iterator[Any]:
    start = 0
    while True:
        page = client.mail_messages(deal_id, start=start, limit=2)
        yield page
        if not page.more or page.next_start is None:
            return
        start = page.next_start


def test_refusals_are_typed(sandbox: Any) -> None:
    sandbox.configure(faults="")
    wrong = PipedriveClient(sandbox.base_url, "not-the-token")
    with pytest.raises(AuthError):
        wrong.get("/api/v2/deals")
    client = PipedriveClient(sandbox.base_url, TOKEN)
    with pytest.raises(NotFound):
        client.get("/api/v2/deals/999999")
    with pytest.raises(RequestRejected) as info:
        client.list_v1("/v1/deals")  # out of support since 2026-08-01
    assert info.value.status == 410
    assert TOKEN not in str(info.value)
    wrong.close()
    client.close()
