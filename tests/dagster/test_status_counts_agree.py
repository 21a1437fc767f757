"""The per-kind skipped and failed figures of `migrate status T` agree with `migrate rows` and the
tenants overview (`ledger_reads.bad_row_counts`): the mail of a deal no listing can serve (a deal without
a readable id, or whose mail the source refuses) is kept as one failed record per deal, which no
email task counted as a row; the rollup counts it into the kind's failed figure (`kept_apart`) and
its seen figure, so every row of the table adds up (seen = the sum of its outcomes). On a sandbox
with malformed rows and private deal mail, reconciled with the sandbox's truth of both."""
from __future__ import annotations

import json

from engine_core import ledger_reads, rollup
from engine_core.rollup import COUNTERS
from migration_pipeline.instance import to_url
from tests.dagster.test_cli_errors import _migrate_in_process
from tests.pipedrive.support import failed_tasks, migrate, sandbox

TENANT = "acme"
ACCOUNT = {"seed": 1, "faults": "badrow:0.03", "private_deal_mail": 2}  # seed 1: deal 10 has no readable id


def test_status_rows_and_overview_count_the_same_failed_mail(db, db_url) -> None:
    with sandbox(**ACCOUNT) as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    kept = db.sql("SELECT raw_key FROM migration_unreadable WHERE migration_id = %(r)s AND kind = 'emails'"
                  " AND raw_key LIKE 'deal %%'", {"r": run.id})
    private = {f"deal {d['deal_id']}" for d in truth["private_deal_mail"]}
    assert private < {k["raw_key"] for k in kept} and len(kept) > len(private), kept  # both shapes are here
    held = ledger_reads.bad_row_counts(db, TENANT)
    assert not any(v["waiting"] for v in held.values()), held  # the catch-up settled every waiting row
    bad = {k: {"skipped": v["skipped"], "failed": v["failed"]} for k, v in held.items()}
    r = rollup.rollup(db, run.id)
    assert r.complete, r.incomplete
    # per ledger kind (the catch-up's own row counts rows of the other kinds again, as their carrier)
    figures = {k.kind: {"skipped": k.skipped, "failed": k.failed} for k in r.kinds
               if (k.skipped or k.failed) and not k.handed_over}
    assert figures == bad, (figures, bad)
    emails = next(k for k in r.kinds if k.kind == "emails")
    assert emails.kept_apart == len(kept)
    for k in r.kinds:  # the table's rows add up: a kept record is a row seen and failed
        assert k.seen == sum(getattr(k, c) for c in COUNTERS), (k.kind, k)
    # as the commands print them: `status T --json` per kind, `status --json` per tenant, `rows T --json`
    env = {"DATABASE_URL": to_url(db_url), "MIGRATE_SOURCE": "pipedrive"}
    status = json.loads(_migrate_in_process(["status", TENANT, "--json"], env).stdout)
    assert {k["kind"]: {"skipped": k["skipped"], "failed": k["failed"]} for k in status["kinds"]
            if (k["skipped"] or k["failed"]) and not k["handed_over"]} == bad
    (overview,) = [o for o in json.loads(_migrate_in_process(["status", "--json"], env).stdout) if o["tenant"] == TENANT]
    assert overview["failed"] == sum(v["failed"] for v in bad.values())
