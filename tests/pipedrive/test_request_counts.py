"""What a full run of the small account asks of the source, per kind: pinned at or under what the
engine spends now (`bench/requests.py` prints it against the floor), so a change that adds
requests fails here. Kinds that fit one page cost one call (the discovery's first page is the
walker's; a v1 list's other stripes start only when its first page says more), the company is
asked once, the deprecated archived-deals summary never. The rows are reconciled too: fewer
requests, the same account."""
from __future__ import annotations

from engine_core.providers.pipedrive import kinds as pd_kinds
from tests.pipedrive.support import failed_tasks, ledger, ledger_truth, migrate, sandbox

# requests per task kind on the small account (seed 1), all kinds but mail; measured, with the
# probes' parents asked through `ids=` lists or by id as `writers.questions` decides. A kind whose
# pages probe parents may ask one more: which page asks a parent first depends on the lanes' timing
# (the split of a page's parents into a list or gets by id follows what is answered already).
PROBING = {"persons", "deals", "deals_archived", "leads", "leads_archived", "activities", "notes", "catchup"}
# files: 300 rows in pages of 100 (the spec's cap), four stripes: pages 0-200 and three past the end
# (300, 400, 500: the stripes' page arithmetic); the catch-up walks them again (3 pages).
PINNED = {"fields": 7, "users": 1, "pipelines": 1, "stages": 1, "products": 1, "organizations": 2, "persons": 6,
          "deals": 9, "deals_archived": 2, "leads": 2, "leads_archived": 1, "activities": 9, "notes": 8,
          "deal_products": 12, "files": 6, "catchup": 23}


def test_the_small_accounts_requests_per_kind_stay_at_or_under_the_pinned_counts(db) -> None:
    kinds = [k.name for k in pd_kinds.KINDS if k.default and k.name != "emails"]
    with sandbox(scale="small") as sb:
        truth = sb.truth()
        sb.reset_stats()
        run = migrate(db, sb, kinds=kinds)
        stats = sb.stats()
    assert run.status == "succeeded", failed_tasks(db, run.id)
    spent = {r["kind"]: int(r["n"]) for r in db.sql(
        "SELECT kind, sum(coalesce((stats->>'requests')::int, 0)) AS n FROM migration_tasks"
        " WHERE migration_id = %(r)s GROUP BY kind", {"r": run.id})}
    over = {k: (spent.get(k), n) for k, n in PINNED.items() if spent.get(k, 0) > n + (k in PROBING)}
    assert not over, f"kinds over their pinned requests (spent, pinned): {over}"
    assert stats["requests"].get("/v1/users/me") == 1, stats["requests"]
    assert "/v1/deals/summary/archived" not in stats["requests"]
    assert stats["requests_total"] <= sum(PINNED.values()) + 1 + 3, stats["requests"]
    for kind, want in ledger_truth(truth).items():
        if kind != "emails":
            assert set(ledger(db, "acme", kind)) == want, kind
