"""What a full run of the small account asks of the source, per kind: pinned at or under what the
engine spends now (`bench/requests.py` prints it against the floor), so a change that adds
requests fails here. Kinds that fit one page cost one call (the discovery's first page is the
walker's), a list of a few pages one call a page (one walker, no stripes), the company is asked
once, the deals summary never (a list one walker walks counts itself), the deprecated
archived-deals summary never. The rows are reconciled too: fewer
requests, the same account."""
from __future__ import annotations

from engine_core.providers.pipedrive import kinds as pd_kinds
from tests.pipedrive.support import failed_tasks, ledger, ledger_truth, migrate, sandbox

# requests per task kind on the small account (seed 1), all kinds but mail; measured, with the
# probes' parents asked through `ids=` lists or by id as `writers.questions` decides. A kind whose
# pages probe parents may ask one more: which page asks a parent first depends on the lanes' timing
# (the split of a page's parents into a list or gets by id follows what is answered already).
PROBING = {"persons", "deals", "deals_archived", "leads", "leads_archived", "activities", "notes", "catchup"}
# files: 300 rows in pages of 100 (the spec's cap), three pages one walker walks (a list is striped
# only from `stripes.STRIPE_MIN_PAGES` pages on: no stripe's empty page past the end); the catch-up
# walks them again (3 pages). deals: three pages one walker walks and counts (no deals summary).
PINNED = {"fields": 7, "users": 1, "pipelines": 1, "stages": 1, "products": 1, "organizations": 2, "persons": 6,
          "deals": 7, "deals_archived": 2, "leads": 2, "leads_archived": 1, "activities": 9, "notes": 8,
          "deal_products": 12, "files": 3, "catchup": 23}


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
    assert "/v1/deals/summary" not in stats["requests"]  # a list one walker walks counts itself
    assert stats["requests_total"] <= sum(PINNED.values()) + 1 + 3, stats["requests"]
    for kind, want in ledger_truth(truth).items():
        if kind != "emails":
            assert set(ledger(db, "acme", kind)) == want, kind


# A quiet sync of the small account (nothing changed since the run), per list endpoint. Detecting
# deletions needs the whole walk (Pipedrive lists no deleted rows and v2 lists carry no totals):
# one call per 500 rows (100 for files; the v1 walk's overlap of 25 rows a page makes 300 files 4
# pages). With `detect_deletes: false` a list that takes `updated_since` costs one call; files take
# none and are walked whole. The seven field lists and the identity once each; no probe, no GET by id.
QUIET_WALK = {"/api/v2/activities": 2, "/api/v2/deals": 3, "/api/v2/deals/archived": 1, "/api/v2/organizations": 2,
              "/api/v2/persons": 3, "/api/v2/pipelines": 1, "/api/v2/products": 1, "/api/v2/stages": 1,
              "/v1/files": 4, "/v1/leads": 1, "/v1/leads/archived": 1, "/v1/notes": 2, "/v1/users": 1}
QUIET_CHANGES = {path: 1 for path in QUIET_WALK}
FIXED = {"/v1/users/me": 1, **{p: 1 for p in (*pd_kinds.V2_FIELD_LISTS.values(), *pd_kinds.V1_FIELD_LISTS.values())}}


def test_a_quiet_sync_costs_one_walk_of_every_list_and_a_changes_only_sync_one_call_per_kind(db) -> None:
    from engine_core import runs
    from engine_core.providers.pipedrive.provider import PipedriveProvider
    from engine_core.providers.registry import for_run
    from engine_core.worker import drain_threads

    from tests.pipedrive.support import FAST, UNLIMITED

    kinds = [k.name for k in pd_kinds.KINDS if k.default and k.name != "emails"]
    with sandbox(scale="small") as sb:
        run = migrate(db, sb, kinds=kinds)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        spent = []
        for detect in (True, False):
            sb.reset_stats()
            opts = {"base_url": sb.base_url, "burst_limit": UNLIMITED, "detect_deletes": detect}
            started = runs.start_sync(db, PipedriveProvider(base_url=sb.base_url), "acme", options=opts, settings=FAST)
            drain_threads(db, started.id, width=4, settings=FAST, providers=for_run)
            assert runs.get_run(db, started.id).status == "succeeded", failed_tasks(db, started.id)
            spent.append(dict(sb.stats()["requests"]))
    assert spent[0] == {**QUIET_WALK, **FIXED}, spent[0]
    assert spent[1] == {**QUIET_CHANGES, **FIXED}, spent[1]
