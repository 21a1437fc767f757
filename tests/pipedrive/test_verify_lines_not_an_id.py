"""`migrate verify` of deal product lines and file contents on a source that serves some without a
readable id (one with none, one with "abc"): each is listed under the key its run kept it by
(`mapping.unreadable_key`), counted once among the source's rows and accounted for as unwritten
(failed beside the ledger), none missing. A file without a readable id fails as a `files` row and
its content is never asked for: `file_contents` counts it with that row.

The sandbox serves such rows through its handlers, wrapped here: its generated lines and files
all have ids, and its pages are ordered by them."""
from __future__ import annotations

from typing import Any

import pytest

from engine_core.providers.pipedrive.mapping import unreadable_key
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify
from pipedrive_sandbox.live_crm import LiveCrm
from pipedrive_sandbox.v2_crm import V2Crm

from .support import FAST, failed_tasks, migrate, sandbox

TENANT = "acme"
DEAL_ID = 2  # a deal of the tiny account with product lines


def bad_lines(line: dict[str, Any]) -> list[dict[str, Any]]:
    """Two lines of the deal of `line` without a readable id (none, "abc"), each its own row."""
    none = {k: v for k, v in line.items() if k != "id"} | {"add_time": "2021-01-02T03:04:05Z", "order_nr": 90}
    return [none, {**line, "id": "abc", "add_time": "2021-01-03T03:04:05Z", "order_nr": 91}]


@pytest.fixture
def unreadable_rows(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[dict[str, Any]]]:
    """The sandbox serves two lines of deal DEAL_ID and files 1 and 2 without a readable id."""
    served: dict[str, list[dict[str, Any]]] = {"deal_products": [], "files": []}
    lines_page, file_record = V2Crm.v2_deals_products, LiveCrm.file_record

    def with_bad_lines(self: V2Crm, *args: Any) -> dict[str, Any]:
        body = lines_page(self, *args)
        mine = [r for r in body["data"] if r.get("deal_id") == DEAL_ID]
        if mine:
            bad = bad_lines(mine[0])
            served["deal_products"] = bad
            body = {**body, "data": body["data"] + bad}
        return body

    def bad_file(self: LiveCrm, i: int) -> dict[str, Any]:
        row = file_record(self, i)
        if i == 0:
            row = {k: v for k, v in row.items() if k != "id"}
        elif i == 1:
            row = {**row, "id": "abc"}
        if i in (0, 1):
            served["files"] = [r for r in served["files"] if r.get("file_name") != row["file_name"]] + [row]
        return row

    monkeypatch.setattr(V2Crm, "v2_deals_products", with_bad_lines)
    monkeypatch.setattr(LiveCrm, "file_record", bad_file)
    return served


def test_verify_lists_lines_and_files_without_a_readable_id_under_their_kept_keys(db, unreadable_rows) -> None:
    with sandbox() as sb:
        run = migrate(db, sb, TENANT, kinds=["+file_contents"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST,
                       kinds=["deal_products", "files", "file_contents"])
    kinds = {k.kind: k for k in proof.kinds}
    kept = {k: sorted(r["raw_key"] for r in db.sql(
        "SELECT raw_key FROM migration_unreadable WHERE tenant_id = %(t)s AND kind = %(k)s", {"t": TENANT, "k": k}))
        for k in ("deal_products", "files")}
    for kind, held_as in (("deal_products", "deal_products"), ("files", "files"), ("file_contents", "files")):
        k = kinds[kind]
        keys = sorted(unreadable_key(r) for r in unreadable_rows[held_as])
        assert len(set(keys)) == 2 and keys == kept[held_as], (kind, keys, kept)
        # listed under the keys the run kept them by: counted once each, unwritten, none missing
        assert sorted(k.not_ids) == keys and set(keys) <= set(k.unwritten_ids), k.as_dict()
        assert not k.missing and not k.extra, k.as_dict()
        assert k.product + k.unwritten == k.source, k.as_dict()
    assert proof.passed, proof.lines()
