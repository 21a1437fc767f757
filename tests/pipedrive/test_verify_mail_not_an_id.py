"""`migrate verify` of the mail of deals served without a readable id, reconciled with the
sandbox's truth: such a deal's mail is asked by the deal's id, so none of it can be listed; its run
keeps it as one record apart ("deal " + `mapping.unreadable_key`, failed beside the ledger), and
the proof's listing serves it once under that key. So every message of the truth is accounted for:
listed one by one, or held by one of those records, which the source figure counts (as the run's
`seen` does), the ledger matches as unwritten and the "without a readable id" line names."""
from __future__ import annotations

import re

from engine_core.providers.pipedrive.mapping import sound_id, unreadable_key
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify

from .support import FAST, failed_tasks, migrate, sandbox

TENANT = "acme"


def test_verify_counts_the_mail_of_deals_without_a_readable_id_once_each_as_its_run_kept_it(db) -> None:
    with sandbox(seed=4, faults="badrow:0.1") as sb:  # tiny, seed 4: two deals with mail served without a readable id
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        with_mail = {str(d): [str(m) for m in msgs] for d, msgs in sb.truth()["deals_with_mail"].items()}
        served = {**sb.truth_rows("deals"), **sb.truth_rows("deals_archived")}
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["emails"])
    # the deals of the truth served without a readable id, by the key their mail was kept under
    unlisted = {"deal " + unreadable_key(row): with_mail[d] for d, row in served.items()
                if sound_id(row) is None and with_mail.get(d)}
    assert len(unlisted) >= 2, "the seed serves deals with mail but without a readable id"
    kept = {r["raw_key"]: r["reason"] for r in db.sql(
        "SELECT raw_key, reason FROM migration_unreadable WHERE tenant_id = %(t)s AND kind = 'emails'"
        " AND raw_key LIKE 'deal %%'", {"t": TENANT})}
    assert set(kept) == set(unlisted), (kept, unlisted)
    for key, msgs in unlisted.items():  # the run's reason names the messages the record holds
        assert re.search(rf"\b{len(msgs)} email\(s\) not fetched", kept[key]), (key, kept[key], msgs)
    (k,) = proof.kinds
    messages = sum(len(m) for m in with_mail.values())
    held = sum(len(m) for m in unlisted.values())
    # every message: listed, or in one record of its deal (counted once, as the run counts it)
    assert k.source == messages - held + len(unlisted), (k.source, messages, held, unlisted)
    assert set(unlisted) <= set(k.not_ids) and set(unlisted) <= set(k.unwritten_ids), k.as_dict()
    assert not k.missing and not k.extra, k.as_dict()
    assert k.product + k.unwritten == k.source, k.as_dict()
    line = next(x for x in proof.lines() if x.startswith("  without a readable id"))
    assert all(repr(key) in line for key in unlisted) and f"{len(unlisted)} of them a deal" in line, line
