"""`migrate rows TENANT`: every skipped or failed row of a tenant without SQL (`status` and `report`
show five samples per reason group; a fresh user could not list the rest):

* the ledger's skipped/failed rows now (every run of the tenant, each line naming the run that last
  wrote the row) and the rows kept beside it for want of a readable id (failed, their raw key as id,
  flagged "no readable id"), one line each, sorted by kind, action, id (9 before 10), then a count;
* a placeholder left to the catch-up's walk (`rows.WAITS_FOR_WALK`) is listed and counted `waiting`,
  not skipped (`--action waiting` alone lists those);
* --kind, --action, --run and --limit narrow it; --json is one object per line (JSON Lines) with
  the count on stderr; an unknown tenant, kind or run is one line, exit 2;
* the rows are streamed through a server-side cursor, not fetched whole.
"""
from __future__ import annotations

import json

import psycopg

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for
from engine_core.rows import WAITS_FOR_WALK
from tests.dagster.test_cli_errors import _migrate_in_process, _one_line_error
from tests.dagster.test_cli_finds import EXAMPLE, migrated  # noqa: F401 - the fixture

KEY = "abc sha256:0123456789abcdef"


def _mark(db_url: str) -> int:
    """In tenant "done" (run #1, migrated): contacts 9 and 10 skipped, contacts 8 waiting for the
    catch-up's walk, contacts 2 failed, companies 3 failed by a later run (#2), a contacts row without
    a readable id; returns run #2's id."""
    with dbmod.Database(db_url, max_size=2) as db:
        later = runs.start_run(db, provider_for("example"), "done", options=EXAMPLE)
        db.sql("UPDATE migration_records SET action = 'skipped', reason = 'parent gone'"
               " WHERE tenant_id = 'done' AND kind = 'contacts' AND source_id IN ('9', '10') RETURNING 1")
        db.sql("UPDATE migration_records SET action = 'skipped', reason = %(r)s"
               " WHERE tenant_id = 'done' AND kind = 'contacts' AND source_id = '8' RETURNING 1",
               {"r": f"companies 4 is not here, {WAITS_FOR_WALK}"})
        db.sql("UPDATE migration_records SET action = 'failed', reason = 'ValueError: contacts row has a non-text name'"
               " WHERE tenant_id = 'done' AND kind = 'contacts' AND source_id = '2' RETURNING 1")
        db.sql("UPDATE migration_records SET action = 'failed', reason = 'boom', migration_id = %(r)s"
               " WHERE tenant_id = 'done' AND kind = 'companies' AND source_id = '3' RETURNING 1", {"r": later.id})
        db.sql("INSERT INTO migration_unreadable (migration_id, tenant_id, source, kind, raw_key, reason, excerpt)"
               " VALUES (1, 'done', 'example', 'contacts', %s, %s, %s) RETURNING 1",
               (KEY, "MalformedRow: id is not a positive integer: 'abc'", '{"id":"abc"}'))
    return later.id


def test_rows_lists_every_skipped_and_failed_row_of_the_tenant_with_its_run(migrated, db_url):  # noqa: F811
    later = _mark(db_url)
    out = _migrate_in_process(["rows", "done"], migrated)
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert out.stdout.splitlines() == [
        f"companies 3 failed run #{later}: boom",
        "contacts 2 failed run #1: ValueError: contacts row has a non-text name",
        f"contacts {KEY} failed run #1 (no readable id): MalformedRow: id is not a positive integer: 'abc'",
        "contacts 9 skipped run #1: parent gone",
        "contacts 10 skipped run #1: parent gone",
        f"contacts 8 waiting run #1: companies 4 is not here, {WAITS_FOR_WALK}",
        "6 rows: 2 skipped, 1 waiting for the catch-up, 3 failed (1 without a readable id)",
    ], out.stdout
    out = _migrate_in_process(["rows", "done", "--action", "waiting"], migrated)
    assert out.stdout.splitlines() == [f"contacts 8 waiting run #1: companies 4 is not here, {WAITS_FOR_WALK}",
                                       "1 row: 0 skipped, 1 waiting for the catch-up, 0 failed (0 without a readable id)"], out.stdout

    out = _migrate_in_process(["rows", "done", "--kind", "contacts", "--action", "skipped"], migrated)
    assert out.stdout.splitlines() == ["contacts 9 skipped run #1: parent gone", "contacts 10 skipped run #1: parent gone",
                                       "2 rows: 2 skipped, 0 failed (0 without a readable id)"], out.stdout
    out = _migrate_in_process(["rows", "done", "--run", str(later)], migrated)
    assert out.stdout.splitlines() == [f"companies 3 failed run #{later}: boom",
                                       "1 row: 0 skipped, 1 failed (0 without a readable id)"], out.stdout
    out = _migrate_in_process(["rows", "done", "--limit", "2"], migrated)
    assert out.stdout.splitlines()[2:] == ["6 rows: 2 skipped, 1 waiting for the catch-up, 3 failed (1 without a readable id); "
                                           "2 shown (--limit 2)"]

    out = _migrate_in_process(["rows", "done", "--json", "--action", "failed"], migrated)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(ln) for ln in out.stdout.splitlines()]
    assert [(r["kind"], r["id"], r["action"], r["run_id"], r["unreadable"]) for r in lines] == [
        ("companies", "3", "failed", later, False), ("contacts", "2", "failed", 1, False),
        ("contacts", KEY, "failed", 1, True)], lines
    assert out.stderr.strip() == "3 rows: 0 skipped, 3 failed (1 without a readable id)"


def test_rows_of_an_unknown_tenant_kind_or_run_is_one_line(migrated, db_url):  # noqa: F811
    _one_line_error(_migrate_in_process(["rows", "nobody"], migrated), "no tenant 'nobody'", "done")
    _one_line_error(_migrate_in_process(["rows", "done", "--kind", "persons"], migrated), "unknown kind 'persons'", "contacts")
    _one_line_error(_migrate_in_process(["rows", "done", "--run", "99"], migrated), "no migration run #99")
    with dbmod.Database(db_url, max_size=2) as db:
        other = runs.start_run(db, provider_for("example"), "other", options=EXAMPLE)
    _one_line_error(_migrate_in_process(["rows", "done", "--run", str(other.id)], migrated),
                    f"run #{other.id} belongs to tenant 'other'")


def test_rows_are_streamed_through_a_server_side_cursor(migrated, db_url, monkeypatch):  # noqa: F811
    from engine_core import ledger_reads

    with dbmod.Database(db_url, max_size=2) as db:
        db.sql("UPDATE migration_records SET action = 'failed', reason = 'x' WHERE tenant_id = 'done' RETURNING 1")
        total = db.sql("SELECT count(*) AS n FROM migration_records WHERE tenant_id = 'done'")[0]["n"]
        monkeypatch.setattr(ledger_reads, "ROWS_PAGE", 7)
        found = ledger_reads.tenant_rows(db, "done")
        first = next(found)
        assert first["action"] == "failed"
        with psycopg.connect(db_url) as c:  # the cursor's session fetches pages of 7
            queries = [q for (q,) in c.execute("SELECT query FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
                                               " AND datname = current_database()").fetchall()]
        assert any(q.startswith("FETCH FORWARD 7 FROM") for q in queries), queries
        assert 1 + sum(1 for _ in found) == total > 7


def test_explain_of_an_id_served_with_several_rows_lists_the_others_keys(migrated, db_url, monkeypatch):  # noqa: F811
    # it said "2 other row(s) were served with this id" and named none of them
    with dbmod.Database(db_url, max_size=2) as db:
        for n in range(3):
            db.sql("INSERT INTO migration_unreadable (migration_id, tenant_id, source, kind, raw_key, reason, excerpt,"
                   " created_at) VALUES (1, 'done', 'example', 'contacts', %s, 'MalformedRow: bad id', '{}',"
                   " now() - make_interval(mins => %s)) RETURNING 1", (f"abc sha256:{n:016d}", n))
    out = _migrate_in_process(["explain", "done", "contacts", "abc"], migrated)
    assert out.returncode == 0, (out.stdout, out.stderr)
    lines = out.stdout.splitlines()
    assert lines[0].startswith("contacts abc: failed by run #1") and "2 other row(s)" in lines[0], lines
    assert lines[-3:] == ["the other 2 row(s) served with this id, by their keys:",
                          "  abc sha256:0000000000000001", "  abc sha256:0000000000000002"], lines
    again = _migrate_in_process(["explain", "done", "contacts", "abc sha256:0000000000000002"], migrated)
    assert again.returncode == 0 and again.stdout.startswith("contacts abc sha256:0000000000000002: failed"), again.stdout

    from migration_pipeline import cli
    import migration_pipeline.cli.inspect

    monkeypatch.setattr(cli.inspect, "EXPLAIN_OTHERS", 1)
    out = _migrate_in_process(["explain", "done", "contacts", "abc"], migrated)
    assert out.stdout.splitlines()[-2:] == [
        "the other 2 row(s) served with this id (the latest 1; `migrate rows done --kind contacts --action failed` "
        "lists all), by their keys:", "  abc sha256:0000000000000001"], out.stdout


def test_explain_says_a_placeholder_is_not_final_while_its_runs_catch_up_is_ahead(migrated, db_url):  # noqa: F811
    """A pipedrive run of tenant "done" stopped in its first phase, before its catch-up: a person it
    left waiting for the catch-up's walk is `waiting`, not skipped, and both it and a skipped email
    say the catch-up settles or retries them and that `migrate run --tenant done` resumes the run;
    once the run has closed its catch-up nothing is foretold."""
    with dbmod.Database(db_url, max_size=2) as db:
        (run,) = db.sql("INSERT INTO migrations (tenant_id, source, source_account, status, plan)"
                        " VALUES ('done', 'pipedrive', 'acct', 'stopped', %(p)s::jsonb) RETURNING id",
                        {"p": json.dumps([["persons"], ["emails"], ["catchup"]])})
        db.sql("INSERT INTO migration_records (migration_id, tenant_id, source, kind, source_id, action, reason)"
               " VALUES (%(r)s, 'done', 'pipedrive', 'persons', '641', 'skipped', %(w)s),"
               "        (%(r)s, 'done', 'pipedrive', 'emails', '7', 'skipped', 'deal 12 is not here') RETURNING 1",
               {"r": run["id"], "w": f"organization 3 is not here, {WAITS_FOR_WALK}"})
    out = _migrate_in_process(["explain", "done", "persons", "641"], migrated)
    assert out.returncode == 0, (out.stdout, out.stderr)
    head, nxt = out.stdout.splitlines()[:2]
    assert head.startswith(f"persons 641: waiting for the catch-up's walk, left by run #{run['id']} "), head
    assert nxt == (f"not final: run #{run['id']} stopped before its catch-up, which settles it: "
                   "`migrate run --tenant done` resumes it"), out.stdout
    out = _migrate_in_process(["explain", "done", "emails", "7"], migrated)
    assert out.stdout.splitlines()[0].startswith(f"emails 7: skipped by run #{run['id']} "), out.stdout
    assert "catch-up, which retries it" in out.stdout.splitlines()[1], out.stdout
    with dbmod.Database(db_url, max_size=2) as db:
        db.sql("UPDATE migrations SET status = 'succeeded', current_phase = 3 WHERE id = %(r)s RETURNING 1",
               {"r": run["id"]})
    out = _migrate_in_process(["explain", "done", "emails", "7"], migrated)
    assert len(out.stdout.splitlines()) == 1 and "not final" not in out.stdout, out.stdout
