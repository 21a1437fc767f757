"""The "what now" lines a run ends with say what the run left, in figures a user can check:

* the psql query it suggests counts the failed rows kept without a readable id
  (`migration_unreadable`, beside the ledger) with the ledger's, so its failed figures are the
  verdict line's (the sandbox's `badrow` fault serves rows without a readable id);
* rows imported with a changed body (a mail body cut at `EMAIL_BODY_MAX`: the sandbox's hostile
  mail) are said on the verdict line, which counts them neither skipped nor failed;
* the psql line connects with what can log in: `"$DATABASE_URL"` when it is set (`migrate db url`
  hides the password as ***), the embedded server's `"$(migrate db url)"` otherwise; never the secret."""
from __future__ import annotations

from engine_core import ledger_reads
from migration_pipeline.cli.output import what_now
from migration_pipeline.instance import to_url
from tests.pipedrive.support import failed_tasks, migrate, sandbox


def _psql_query(lines: list[str]) -> str:
    (psql,) = [ln for ln in lines if ln.lstrip().startswith("psql ")]
    return psql.split(' -c "', 1)[1].rstrip('"')


def test_the_psql_query_counts_the_failed_rows_kept_without_a_readable_id(db) -> None:
    with sandbox(seed=2, faults="badrow:0.15") as sb:
        run = migrate(db, sb, "acme")
        assert run.status == "succeeded", failed_tasks(db, run.id)
    bad = ledger_reads.bad_row_counts(db, "acme")
    failed = sum(v["failed"] for v in bad.values())
    unreadable = db.sql("SELECT count(*) AS n FROM migration_unreadable WHERE tenant_id = 'acme'")[0]["n"]
    assert unreadable and failed > unreadable, (bad, unreadable)
    lines = what_now("acme", f"{run.name} succeeded", bad, None, env={})
    assert lines[0].endswith(f", {failed} failed"), lines
    counted = {(r["kind"], r["action"]): r["count"] for r in db.sql(_psql_query(lines))}
    assert sum(n for (_, action), n in counted.items() if action == "failed") == failed, counted
    per_kind = {k: n for (k, action), n in counted.items() if action == "failed"}
    assert per_kind == {k: v["failed"] for k, v in bad.items() if v["failed"]}, (per_kind, bad)


def test_a_body_cut_on_import_is_said_beside_the_skipped_and_failed(db, db_url, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", to_url(db_url))  # the test's own database, which `what_now` reads
    with sandbox(hostile_mail=True) as sb:
        run = migrate(db, sb, "acme")
        assert run.status == "succeeded", failed_tasks(db, run.id)
    bad = ledger_reads.bad_row_counts(db, "acme")
    changed = ledger_reads.changed_bodies(db, "acme")
    assert changed["emails_cut"] == 1, changed
    first = what_now("acme", f"{run.name} succeeded", bad, None, env={})[0]  # read from the database itself
    assert first.endswith(", 0 failed, 1 imported with a changed body: 1 email body cut at 1,000,000 characters "
                          "(body_truncated)"), first
    assert "changed body" not in what_now("acme", "run #1 succeeded", {}, None, changed={}, env={})[0]
    both = what_now("acme", "run #1 succeeded", {}, None, changed={"emails_cut": 0, "emails_unavailable": 2,
                                                                    "notes_cut": 1}, env={})[0]
    assert both.endswith(", 3 imported with a changed body: 2 emails without their body, refused by the source "
                         "(body_unavailable); 1 note cut at 100,000,000 characters (content_truncated)"), both


def test_the_psql_line_connects_with_what_can_log_in_and_prints_no_secret() -> None:
    given = {"DATABASE_URL": "postgresql://app:s3cret@db.example:5432/crm"}
    text = "\n".join(what_now("acme", "run #1 succeeded", {}, None, changed={}, env=given))
    assert 'psql "$DATABASE_URL" -c "SELECT' in text and "s3cret" not in text and "migrate db url" not in text, text
    embedded = "\n".join(what_now("acme", "run #1 succeeded", {}, None, changed={}, env={}))
    assert 'psql "$(migrate db url)" -c "SELECT' in embedded, embedded
