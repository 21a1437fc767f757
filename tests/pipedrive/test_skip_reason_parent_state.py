"""A row skipped for a missing parent says what became of that parent, reconciled with the
sandbox's truth (`skip_reason`): a parent the source serves but the run failed (NUL bytes in its
name, say) is named "failed at import" with the `migrate explain` that tells its own reason - not
"is not here" - and a parent served without a readable id (so it has no ledger entry under the id
its children point at) is said to exist at the source, with how many of its kind were kept apart
as failed and where `migrate rows` lists them."""
from __future__ import annotations

import re

from engine_core.providers.pipedrive.mapping import sound_id

from .support import failed_tasks, ledger, migrate, sandbox

TENANT = "acme"
ORG = re.compile(r"organization (\d+) ([^;]*)")


def test_a_childs_reason_names_its_parents_failure_or_its_parent_kept_apart(db) -> None:
    # the tiny account of seed 3: organizations failed and kept apart, each a skipped child's parent
    with sandbox(seed=3, faults="badrow:0.05") as sb:
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        orgs_served = sb.truth_rows("organizations")
    orgs = ledger(db, TENANT, "organizations")
    failed = {sid for sid, r in orgs.items() if r["action"] == "failed"}
    without_id = {sid for sid, row in orgs_served.items() if sound_id(row) is None}
    kept_apart = db.sql("SELECT count(*) AS n FROM migration_unreadable WHERE tenant_id = %(t)s"
                        " AND kind = 'organizations'", {"t": TENANT})[0]["n"]
    assert failed and without_id and kept_apart == len(without_id), (failed, without_id, kept_apart)
    told = {"failed": 0, "apart": 0}
    for kind in ("persons", "deals"):
        for sid, r in ledger(db, TENANT, kind).items():
            if r["action"] != "skipped":
                continue
            for org, words in ORG.findall(r["reason"] or ""):
                assert org in orgs_served, (kind, sid, r["reason"])  # every such parent is at the source
                if org in failed:
                    assert words == (f"failed at import (`migrate explain` of organizations {org} says why)"), \
                        (kind, sid, r["reason"])
                    told["failed"] += 1
                elif org in without_id:
                    assert words == (f"exists at the source but is not written - {kept_apart} organizations row(s) "
                                     f"were served without a readable id, kept apart as failed "
                                     f"(`migrate rows --kind organizations --action failed` lists them)"), \
                        (kind, sid, r["reason"])
                    told["apart"] += 1
    assert told["failed"] and told["apart"], told
