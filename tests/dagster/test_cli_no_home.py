"""A command that only reads, where MIGRATE_HOME holds no embedded database, and a tenant no run
was started for.

* `status`, `report`, `explain`, `rows`, `verify`, `stop`, `retry`, `resume`, `sync` under a MIGRATE_HOME
  without `pgdata` (a mistyped path, another directory's ./.migrate) refuse in one line naming where
  they looked (exit 2), and make (initdb) and start nothing: an empty database there answered "no
  tenant has a migration run yet", as if every tenant's data were gone. `plan` (before any run)
  answers without one, and makes none either.
* An unknown tenant is one line naming the tenants there are, the same from every command that
  takes one.
"""
from __future__ import annotations

import pytest

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.registry import provider_for
from tests.dagster.test_cli_errors import _env, _migrate_in_process, _one_line_error, run_env  # noqa: F401 - fixture

pytestmark = pytest.mark.timeout(120)

READERS = [["status"], ["status", "acme"], ["report", "acme"], ["explain", "acme", "persons", "1"],
           ["rows", "acme"], ["verify", "acme"], ["stop", "acme"], ["retry", "acme"], ["resume", "acme"], ["sync", "acme"]]


@pytest.mark.parametrize("args", READERS, ids=lambda a: "-".join(a))
def test_a_read_without_an_embedded_database_says_where_it_looked_and_makes_none(args, tmp_path):
    from tests.conftest import stop_embedded_server

    home = tmp_path / "nonexistent" / "dir"
    try:
        out = _migrate_in_process(args, _env(MIGRATE_HOME=str(home)))
        _one_line_error(out, f"no embedded database under {home} (MIGRATE_HOME)", "DATABASE_URL", "`migrate run`")
        assert not home.exists(), list(home.iterdir())
    finally:
        if (home / "pgdata" / "postmaster.pid").exists():  # a server the command had started: not left running
            stop_embedded_server(home / "pgdata")


def test_plan_without_an_embedded_database_makes_none(tmp_path):
    """`plan` is what a new user runs before any run: it answers (here: the missing token's line)
    without making a database to learn that nothing was migrated."""
    from tests.conftest import stop_embedded_server

    home = tmp_path / "fresh"
    try:
        _one_line_error(_migrate_in_process(["plan", "acme"], _env(MIGRATE_HOME=str(home))), "PIPEDRIVE_")
        assert not home.exists(), list(home.iterdir())
    finally:
        if (home / "pgdata" / "postmaster.pid").exists():
            stop_embedded_server(home / "pgdata")


@pytest.mark.parametrize("args", [["status", "nosuch"], ["stop", "nosuch"], ["report", "nosuch"],
                                  ["retry", "nosuch"], ["resume", "nosuch"], ["verify", "nosuch"],
                                  ["rows", "nosuch"], ["explain", "nosuch", "contacts", "1"]],
                         ids=lambda a: a[0])
def test_an_unknown_tenant_is_one_wording_naming_the_tenants(args, db_url, run_env):  # noqa: F811 - fixture
    with dbmod.Database(db_url, max_size=2) as db:
        runs.start_run(db, provider_for("example"), "known", options={"page_size": 20})
    line = _one_line_error(_migrate_in_process(args, dict(run_env, MIGRATE_SOURCE="example")),
                           "no tenant 'nosuch' (tenants: known)")
    assert "has no migration run" not in line


def test_plan_reads_where_the_database_is_once(tmp_path, monkeypatch):
    """`plan --kinds` asks whether there is an embedded database once, for both of its reads (is the
    next run a sync; which kinds' parents the tenant already has), not once for each."""
    from tests.conftest import stop_embedded_server
    from tests.pipedrive.support import TOKEN, sandbox

    calls: list[str | None] = []
    looked = dbmod.missing_embedded
    monkeypatch.setattr(dbmod, "missing_embedded", lambda env=None: calls.append(looked(env)) or calls[-1])
    home = tmp_path / "fresh"
    try:
        with sandbox() as sb:
            out = _migrate_in_process(["plan", "acme", "--kinds", "persons,deals", "--json"],
                                      _env(MIGRATE_HOME=str(home), PIPEDRIVE_BASE_URL=sb.base_url, PIPEDRIVE_API_TOKEN=TOKEN))
        assert out.returncode == 0, out.stderr
        assert len(calls) == 1 and calls[0].startswith("no embedded database under"), calls
        assert not home.exists(), list(home.iterdir())
    finally:
        if (home / "pgdata" / "postmaster.pid").exists():
            stop_embedded_server(home / "pgdata")


def test_a_tenants_run_is_one_read_and_its_refusals_keep_their_lines(db, monkeypatch, capsys):
    """`tenant_run` reads the tenant's latest run and nothing else when it has one (the run proves
    the tenant known); the tenants' list is read only to name them when it has none."""
    from engine_core import runs_reads
    from migration_pipeline.cli.tenants import tenant_run

    run = runs.start_run(db, provider_for("example"), "known", options={"page_size": 20})
    listed: list[int] = []
    tenants = runs_reads.tenants
    monkeypatch.setattr(runs_reads, "tenants", lambda d: listed.append(1) or tenants(d))
    assert tenant_run(db, "known", "example").id == run.id and tenant_run(db, "known", None).id == run.id
    assert listed == [], "the tenants' list was read for a tenant whose run was found"
    for tenant, source, line in (("nosuch", "example", "no tenant 'nosuch' (tenants: known)"),
                                 ("nosuch", None, "no tenant 'nosuch' (tenants: known)"),
                                 ("known", "pipedrive", "tenant 'known' has no run of source 'pipedrive' (its runs are of: example)")):
        with pytest.raises(SystemExit) as ended:
            tenant_run(db, tenant, source)
        assert ended.value.code == 2 and capsys.readouterr().err == f"error: {line}\n", (tenant, source)
