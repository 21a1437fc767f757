"""A whole `tiny` Pipedrive account into the product's CRM tables, reconciled with the sandbox's
truth: every source row has exactly one ledger entry, every created or matched entry one target
row, archived deals and leads included; a second run creates nothing; existing contacts and
companies are linked, not duplicated; a dry run writes nothing and reports what it would do; a
notes-and-activities run has two phases, and its placeholders are taken over by a later run that
brings the parents."""
from __future__ import annotations

from collections import Counter

from engine_core import rollup
from engine_core.providers.pipedrive.kinds import BATCH_PATHS, OPT_IN, SINGLE_PATHS
from engine_core.providers.pipedrive.plan import PHASES
from engine_core.providers.pipedrive.writers import NOT_LINKED
from pipedrive_sandbox.data import dataset_for
from tests.pipedrive.support import (
    LEDGER_KIND,
    TABLE,
    actions,
    failed_tasks,
    kind_counts,
    ledger,
    ledger_counts,
    ledger_truth,
    migrate,
    sandbox,
    settled_counts,
)

TENANT = "acme"


def _target_rows(db, tenant: str, table: str) -> list[dict]:
    return db.sql(f"SELECT id, source, source_id FROM crm.{table} WHERE tenant_id = %(t)s", {"t": tenant})


def test_full_tiny_migration_reconciles_with_the_sandbox_truth(db) -> None:
    with sandbox() as sb:
        truth = sb.truth()
        run = migrate(db, sb, TENANT)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    # issue 9: the catch-up phase last; the opt-in kinds are left out of a run that names no kinds
    assert run.plan == (*(tuple(k for k in g if k not in OPT_IN) for g in PHASES if set(g) - OPT_IN), ("catchup",))
    source = ledger_truth(truth)
    # per kind, its phase's counts plus the catch-up's: a row the phase left waiting for the catch-up's
    # walk (a parent deleted at the source, not asked) is counted where the catch-up settled it
    counts = ledger_counts(settled_counts(db, run.id))
    assert rollup.rollup(db, run.id).incomplete == [], "nothing still waits for the catch-up's walk"
    dangling = {k: {str(i).lower() for i in v} for k, v in truth["dangling"].items()}
    created_by_table: Counter[str] = Counter()
    for kind, want in source.items():
        entries = ledger(db, TENANT, kind)
        assert set(entries) == want, f"{kind}: ledger ids differ from the source's"
        created = actions(entries, "created")
        skipped = actions(entries, "skipped")
        assert actions(entries, "failed", "matched") == set(), kind
        assert skipped == set(), f"{kind}: every row is imported, dangling parents included: {skipped}"
        assert counts[kind]["imported"] == len(created) and counts[kind]["skipped"] == 0, kind
        # rows on parents deleted at the source: imported with the link empty, the id kept
        on_purged = {sid for sid, e in entries.items() if e["dangling"]}
        assert on_purged == dangling.get(kind, set()), kind
        for sid in on_purged:
            assert "does not exist at the source" in entries[sid]["reason"], entries[sid]
        created_by_table[TABLE[kind]] += len(created)
        # every created entry points at its own target row
        table = TABLE[kind]
        rows = {r["id"]: r for r in _target_rows(db, TENANT, table)}
        for sid in created:
            assert rows[entries[sid]["record_id"]]["source_id"] == sid
    for table, n in created_by_table.items():
        rows = _target_rows(db, TENANT, table)
        assert len(rows) == n, f"crm.{table}: target rows must be created + matched"
        assert len({r["source_id"] for r in rows}) == len(rows), f"crm.{table} has duplicates"
    # archived deals and leads are there once each, marked archived
    for table, name in (("deals", "deals_archived"), ("leads", "leads_archived")):
        archived = db.sql(f"SELECT source_id FROM crm.{table} WHERE tenant_id = %(t)s AND archived", {"t": TENANT})
        assert {r["source_id"].lower() for r in archived} == {str(i).lower() for i in truth["ids"][name]} != set(), table
    # every message has its body and its deal
    bodies = db.sql("SELECT count(*) AS n FROM crm.emails WHERE tenant_id = %(t)s AND (body IS NULL OR deal_id IS NULL)", {"t": TENANT})
    assert bodies[0]["n"] == 0


def test_links_custom_fields_and_definitions_are_stored_for_the_product(db) -> None:
    ds = dataset_for("tiny", 1, None)
    with sandbox() as sb:
        run = migrate(db, sb, TENANT)
    assert run.status == "succeeded"
    defs = db.sql("SELECT entity, count(*) FILTER (WHERE is_custom) AS custom FROM crm.custom_field_definitions"
                  " WHERE tenant_id = %(t)s GROUP BY entity", {"t": TENANT})
    custom = {d["entity"]: d["custom"] for d in defs}
    assert {e: custom.get(e) for e in ("deal", "person", "organization", "lead")} == {"deal": 11, "person": 11, "organization": 11, "lead": 11}
    # a person: linked to its organization's company and its owner, custom values named and labelled
    person = next(i for i in range(ds.count("persons")) if ds.person_org(i) is not None and not ds.is_dangling("persons", i))
    src = ds.record("persons", person)
    row = db.sql(
        "SELECT c.*, co.source_id AS company_source, u.source_id AS owner_source FROM crm.contacts c"
        " LEFT JOIN crm.companies co ON co.id = c.company_id LEFT JOIN crm.users u ON u.id = c.owner_id"
        " WHERE c.tenant_id = %(t)s AND c.source_id = %(s)s",
        {"t": TENANT, "s": str(src["id"])},
    )[0]
    assert row["company_source"] == str(src["org_id"]) and row["owner_source"] == str(src["owner_id"])
    assert row["email"] == (src["emails"][0]["value"].lower() if src["emails"] else None)
    fields = {f.key: f for f in ds.custom_fields["person"]}
    # names and option labels are read through the definitions (crm.custom_field_values), never
    # copied onto the record
    shown = {r["field_key"]: r for r in db.sql("SELECT * FROM crm.custom_field_values WHERE record_type = 'crm.contacts'"
                                                " AND record_id = %(i)s", {"i": row["id"]})}
    for key, value in src["custom_fields"].items():
        f = fields[key]
        if value is None:
            assert key not in row["custom_fields"] and key not in shown
            continue
        stored = row["custom_fields"][key]
        assert set(stored) <= {"type", "value", "currency", "record_id"} and stored["type"] == f.field_type
        assert shown[key]["name"] == f.name and shown[key]["field_type"] == f.field_type
        if f.field_type == "enum":
            assert shown[key]["label"] == dict(f.options)[value]
        if f.field_type == "set":
            assert shown[key]["labels"] == [dict(f.options)[v] for v in value]
        if f.field_type == "monetary":
            assert (stored["value"], stored["currency"]) == (value["value"], value["currency"])
    # a lead (v1: custom values at the top level, sets as "1,2"): the same shape, named through the deal's fields
    lead = db.sql("SELECT id, custom_fields FROM crm.leads WHERE tenant_id = %(t)s AND custom_fields <> '{}'::jsonb LIMIT 1",
                  {"t": TENANT})[0]
    assert all({"type", "value"} <= set(v) and "name" not in v for v in lead["custom_fields"].values())
    named = db.sql("SELECT name FROM crm.custom_field_values WHERE record_type = 'crm.leads' AND record_id = %(i)s", {"i": lead["id"]})
    assert sorted(r["name"] for r in named) == sorted(f.name for f in ds.custom_fields["deal"] if f.key in lead["custom_fields"])
    # every deal shows its pipeline and stage by name, as the source has them; a stage its pipeline
    pipelines = {str(ds.record("pipelines", i)["id"]): ds.record("pipelines", i) for i in range(ds.count("pipelines"))}
    stages = {str(ds.record("stages", i)["id"]): ds.record("stages", i) for i in range(ds.count("stages"))}
    deals = db.sql(
        "SELECT d.source_id, d.pipeline_ref, d.stage_ref, p.name AS pipeline, s.name AS stage, sp.id AS stage_pipeline,"
        "       p.id AS pipeline_id FROM crm.deals d"
        " LEFT JOIN crm.pipelines p ON p.id = d.pipeline_id LEFT JOIN crm.stages s ON s.id = d.stage_id"
        " LEFT JOIN crm.pipelines sp ON sp.id = s.pipeline_id WHERE d.tenant_id = %(t)s", {"t": TENANT})
    assert deals and all(d["stage"] is not None and d["pipeline"] is not None for d in deals)
    for d in deals:
        assert d["stage"] == stages[d["stage_ref"]]["name"] and d["pipeline"] == pipelines[d["pipeline_ref"]]["name"], d
        assert str(stages[d["stage_ref"]]["pipeline_id"]) == d["pipeline_ref"] and d["stage_pipeline"] == d["pipeline_id"]
    # notes and activities point at their deal; emails at theirs
    orphans = db.sql(
        "SELECT count(*) AS n FROM crm.emails e JOIN migration_records r ON r.record_id = e.id AND r.kind = 'emails'"
        " WHERE e.tenant_id = %(t)s AND e.deal_id IS NULL",
        {"t": TENANT},
    )
    assert orphans[0]["n"] == 0


def test_second_run_creates_nothing_and_reports_everything_already_here(db) -> None:
    with sandbox() as sb:
        first = migrate(db, sb, TENANT)
        before = {t: len(_target_rows(db, TENANT, t)) for t in set(TABLE.values())}
        second = migrate(db, sb, TENANT)
    assert first.status == second.status == "succeeded"
    # the first run's counts with the rows its catch-up settled (`settled_counts`): the second run
    # finds every row written, those with a dangling link too, and leaves nothing waiting
    one, two = settled_counts(db, first.id), kind_counts(db, second.id)
    for kind in LEDGER_KIND.values():
        assert two[kind]["imported"] == two[kind]["matched"] == two[kind]["failed"] == two[kind]["waiting"] == 0, kind
        assert two[kind]["already_here"] == one[kind]["imported"] + one[kind]["matched"], kind
        assert two[kind]["skipped"] == one[kind]["skipped"], kind  # their parents are still missing
    assert {t: len(_target_rows(db, TENANT, t)) for t in set(TABLE.values())} == before


def test_existing_contacts_and_companies_are_matched_not_duplicated(db) -> None:
    ds = dataset_for("tiny", 1, None)
    with_mail = [i for i in range(ds.count("persons")) if ds.person_emails(i) and not ds.is_dangling("persons", i)][:3]
    org = 0
    db.sql("INSERT INTO crm.companies (tenant_id, name) VALUES (%(t)s, %(n)s), ('other', %(n)s)",
           {"t": TENANT, "n": "  " + ds.org_name(org).upper() + " "})
    existing = {}
    for i in with_mail:
        email = ds.person_emails(i)[0]
        existing[i] = db.sql("INSERT INTO crm.contacts (tenant_id, name, email) VALUES (%(t)s, 'Already here', %(e)s) RETURNING id",
                             {"t": TENANT, "e": email.upper()})[0]["id"]
        db.sql("INSERT INTO crm.contacts (tenant_id, name, email) VALUES ('other', 'Other tenant', %(e)s)", {"e": email})
    # an owner who is already a user of the product (the tenant's own team)
    owner = ds.record("users", 1)
    owner_user = db.sql("INSERT INTO crm.users (tenant_id, name, email) VALUES (%(t)s, 'Team member', %(e)s) RETURNING id",
                        {"t": TENANT, "e": " " + owner["email"].upper()})[0]["id"]
    db.sql("UPDATE crm.users SET email = btrim(email) WHERE id = %(u)s", {"u": owner_user})
    with sandbox() as sb:
        run = migrate(db, sb, TENANT)
    assert run.status == "succeeded"
    user_entry = ledger(db, TENANT, "users")[str(owner["id"])]
    assert user_entry["action"] == "matched" and user_entry["record_id"] == owner_user
    assert db.sql("SELECT count(*) AS n FROM crm.users WHERE tenant_id = %(t)s AND lower(email) = %(e)s",
                  {"t": TENANT, "e": owner["email"].lower()})[0]["n"] == 1
    owned = db.sql("SELECT count(*) AS n FROM crm.deals WHERE tenant_id = %(t)s AND owner_id = %(u)s", {"t": TENANT, "u": owner_user})
    assert owned[0]["n"] > 0, "the owner's deals link to the user who was already here"
    persons = ledger(db, TENANT, "persons")
    for i, contact_id in existing.items():
        entry = persons[str(ds.ident("persons", i))]
        assert entry["action"] == "matched" and entry["record_id"] == contact_id
    company = db.sql("SELECT id FROM crm.companies WHERE tenant_id = %(t)s AND source IS NULL", {"t": TENANT})[0]["id"]
    org_entry = ledger(db, TENANT, "organizations")[str(ds.ident("organizations", org))]
    assert org_entry["action"] == "matched" and org_entry["record_id"] == company
    counts = kind_counts(db, run.id)
    assert counts["persons"]["matched"] == len(existing)
    # linked, not duplicated: no second contact with those addresses in the tenant, other tenant untouched
    for i in existing:
        n = db.sql("SELECT count(*) AS n FROM crm.contacts WHERE tenant_id = %(t)s AND lower(email) = %(e)s",
                   {"t": TENANT, "e": ds.person_emails(i)[0].lower()})[0]["n"]
        assert n == 1
    assert db.sql("SELECT count(*) AS n FROM crm.contacts WHERE tenant_id = 'other'")[0]["n"] == len(existing)
    # rows that point at the matched organization link to the company that was already here
    linked = db.sql("SELECT count(*) AS n FROM crm.contacts WHERE tenant_id = %(t)s AND company_id = %(c)s", {"t": TENANT, "c": company})
    assert linked[0]["n"] == sum(1 for p in range(ds.count("persons")) if ds.person_org(p) == org and not ds.is_dangling("persons", p)
                                 and str(ds.ident("persons", p)) in actions(persons, "created", "matched"))
    # target rows = created + matched, per table
    for kind in ("persons", "organizations"):
        entries = ledger(db, TENANT, kind)
        distinct = {e["record_id"] for e in entries.values() if e["action"] in ("created", "matched")}
        table = TABLE[kind]
        assert len(distinct) == len(_target_rows(db, TENANT, table)), table


def test_dry_run_lists_the_same_writes_nothing_and_reports_what_it_would_do(db) -> None:
    with sandbox() as sb:
        dry = migrate(db, sb, TENANT, dry_run=True)
        dry_stats = sb.stats()
        sb.reset_stats()
        real = migrate(db, sb, TENANT)
        real_stats = sb.stats()
    assert dry.status == "succeeded" and dry.dry_run
    # the same listing calls; no bodies in a dry run. Probes apart: a full run leaves the parents
    # deleted at the source to its catch-up's walk (walk_proof), a dry run - whose catch-up writes
    # nothing - asks them: by id (`SINGLE_PATHS`, the "/{id}" paths) and, for a kind of several
    # parents, in one question of its v2 list's `ids` (`BATCH_PATHS`: a list path, one request more)
    single = {path.replace("{}", "{id}") for path in SINGLE_PATHS.values()}
    listing_paths = lambda s: {k: v for k, v in s["requests"].items()  # noqa: E731
                               if "mailMessages/{id}" not in k and k not in single}
    dry_lists, real_lists = listing_paths(dry_stats), listing_paths(real_stats)
    batched = {path for paths in BATCH_PATHS.values() for path in paths}
    assert {k for k in dry_lists.keys() | real_lists.keys() if dry_lists.get(k) != real_lists.get(k)} <= batched
    assert all(0 <= dry_lists[k] - real_lists[k] <= 1 for k in batched & dry_lists.keys())
    assert not single & real_stats["requests"].keys(), "a full run asks about no parent by id"
    assert dry_stats["requests"].get("/v1/mailbox/mailMessages/{id}", 0) == 0
    report = {k.kind: k for k in rollup.rollup(db, dry.id).kinds}
    one = settled_counts(db, real.id)  # the rows its catch-up settled counted with their kinds
    phases = kind_counts(db, real.id)
    for kind in LEDGER_KIND.values():
        assert report[kind].seen == phases[kind]["seen"], kind  # the catch-up's sightings are its own
        assert report[kind].imported + report[kind].skipped == one[kind]["imported"] + one[kind]["skipped"], kind
        # the dry run links only to parents it would itself have written: its report is exact
        assert (report[kind].imported, report[kind].skipped) == (one[kind]["imported"], one[kind]["skipped"]), kind
    # nothing of the dry run is in the ledger
    assert db.sql("SELECT count(*) AS n FROM migration_records WHERE migration_id = %(r)s", {"r": dry.id})[0]["n"] == 0


def test_dry_run_writes_nothing(db) -> None:
    with sandbox() as sb:
        run = migrate(db, sb, TENANT, dry_run=True)
    assert run.status == "succeeded"
    assert db.sql("SELECT count(*) AS n FROM migration_records")[0]["n"] == 0
    for table in set(TABLE.values()) | {"custom_field_definitions"}:
        assert db.sql(f"SELECT count(*) AS n FROM crm.{table}")[0]["n"] == 0, table
    counts = kind_counts(db, run.id)
    assert counts["persons"]["imported"] > 0 and counts["emails"]["imported"] > 0


def test_notes_and_activities_run_has_two_phases_and_a_later_run_takes_its_placeholders_over(db) -> None:
    with sandbox() as sb:
        truth = sb.truth()
        subset = migrate(db, sb, TENANT, kinds=["notes", "activities"])
        assert subset.plan == (("activities",), ("notes",), ("catchup",))  # the catch-up stays (issue 9)
        assert subset.status == "succeeded"
        for kind in ("activities", "notes"):
            entries = ledger(db, TENANT, kind)
            assert set(entries) == {str(i) for i in truth["ids"][kind]}
            attached = {sid for sid, e in entries.items()}
            assert actions(entries, "skipped") == attached, "nothing they point at is here yet"
            assert all(e["reason"].startswith(NOT_LINKED) for e in entries.values())
        assert db.sql("SELECT count(*) AS n FROM crm.notes")[0]["n"] == 0
        full = migrate(db, sb, TENANT)
    assert full.status == "succeeded"
    counts = settled_counts(db, full.id)  # with the placeholders its catch-up's walk settled
    for kind in ("activities", "notes"):
        entries = ledger(db, TENANT, kind)
        created = actions(entries, "created")
        assert created and counts[kind]["imported"] == len(created), kind
        assert all(entries[s]["migration_id"] == full.id for s in created), "the later run took them over"
        assert actions(entries, "skipped") == set(), "the parents are here now, or deleted at the source"
        on_purged = {sid for sid, e in entries.items() if e["dangling"]}
        assert on_purged == {str(i) for i in truth["dangling"][kind]}
        rows = db.sql(f"SELECT count(*) AS n FROM crm.{kind} WHERE tenant_id = %(t)s", {"t": TENANT})[0]["n"]
        assert rows == len(created)
