"""Bad input ends a `migrate` command with one line naming the variable or the value, exit code 2,
no traceback, and nothing left behind:

* every MIGRATE_* number, and DATABASE_URL (unparseable, unreachable host);
* `migrate run --kinds contacts` is checked against the provider's plan before anything is
  launched (no partition, no Dagster run), and so are missing PIPEDRIVE_* variables; a partition a
  failed launch added is taken back;
* `migrate sandbox` on a busy port;
* --timeout (run, sync) and the live rates (sandbox --live, demo --live-rate) refuse 0, negatives,
  nan and inf at parse time;
* a second `migrate ui` on an instance a UI or daemon already serves refuses, naming where;
* a dry run's tables say "would import", never "imported".
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

import psycopg
import pytest
from dagster import DagsterInstance, instance_for_test
from dagster._daemon.types import DaemonHeartbeat

from engine_core import db as dbmod
from engine_core.config import FACE_NUMBERS
from engine_core.providers.registry import provider_for, for_run
from engine_core import rollup as rollups
from engine_core import runs
from engine_core.worker import drain_threads
from migration_pipeline import launch, stack
import migration_pipeline.launch.checks
import migration_pipeline.launch.daemon
import migration_pipeline.launch.place
from migration_pipeline.instance import STORAGE_URL_ENV, dagster_env, to_url
from migration_pipeline.cli.tables import outcome_counts
from migration_pipeline.partitions import TENANTS

pytestmark = pytest.mark.timeout(120)

MIGRATE = str(Path(sys.executable).parent / "migrate")
UNREACHABLE = "postgresql://someone:secret@127.0.0.1:1/nothing"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) and k != "DATABASE_URL"}
    env.update(extra)
    return env


def _migrate(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([MIGRATE, *args], env=env, capture_output=True, text=True, timeout=timeout)


def _migrate_in_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """`migrate ARGS` in this process (click's runner) with exactly `env`'s MIGRATE_*, PIPEDRIVE_*,
    DAGSTER_* and DATABASE_URL (the rest unset, and everything restored after): the same exit
    code and stderr a shell sees, without a new interpreter importing Dagster for each bad value.
    An exception escaping the command (a traceback in a shell) is put into stderr as one."""
    from click.testing import CliRunner

    from migration_pipeline.cli.main import main

    ours = {k: None for k in os.environ if k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) or k == "DATABASE_URL"}
    ours.update({k: v for k, v in env.items() if k.startswith(("MIGRATE_", "PIPEDRIVE_", "DAGSTER_")) or k == "DATABASE_URL"})
    for set_by_commands in ("MIGRATE_SOURCE", STORAGE_URL_ENV, "DAGSTER_HOME"):  # for their children: restored after
        ours.setdefault(set_by_commands, None)
    result = CliRunner().invoke(main, args, env=ours, catch_exceptions=True)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["migrate", *args], result.exit_code, result.stdout, stderr)


def _one_line_error(out: subprocess.CompletedProcess, *needles: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stdout[-2000:], out.stderr[-2000:])
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-3000:]
    assert "Traceback" not in out.stderr + out.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# MIGRATE_LAUNCH_THREADS named on its own: a fresh user's `abc` launched a run that failed with its
# reason only in the daemon's log
NUMBERS = sorted({"MIGRATE_LANE_WIDTH", "MIGRATE_STALE_LOCK_SECONDS", "MIGRATE_HEARTBEAT_SECONDS",
                  "MIGRATE_PRESSURE_THRESHOLD", "MIGRATE_MAX_ATTEMPTS", "MIGRATE_RETRY_BACKOFF_SECONDS",
                  "MIGRATE_LAUNCH_THREADS", *FACE_NUMBERS})


@pytest.mark.parametrize("name", NUMBERS)
def test_a_bad_migrate_number_is_one_line_naming_the_variable(name, tmp_path):
    env = _env(DATABASE_URL=UNREACHABLE, MIGRATE_HOME=str(tmp_path), **{name: "lots"})
    line = _one_line_error(_migrate_in_process(["run", "--tenant", "x", "--source", "example"], env), name, "'lots'")
    assert "secret" not in line


def test_a_bad_number_is_one_line_from_the_installed_command_too(tmp_path):
    # the in-process checks above, once end to end: the `migrate` a shell runs
    env = _env(DATABASE_URL=UNREACHABLE, MIGRATE_HOME=str(tmp_path), MIGRATE_LANE_WIDTH="lots")
    _one_line_error(_migrate(["run", "--tenant", "x", "--source", "example"], env), "MIGRATE_LANE_WIDTH", "'lots'")
    env = _env(DATABASE_URL="postgresql://someone:secret@[::1/db", MIGRATE_HOME=str(tmp_path))
    assert "secret" not in _one_line_error(_migrate(["status", "acme"], env), "DATABASE_URL", "not a valid connection URL")


@pytest.mark.parametrize("url,needle", [
    ("postgresql://someone:secret@host:notaport/db", "not a valid connection URL"),
    ("postgresql://someone:secret@[::1/db", "not a valid connection URL"),
    ("mysql://someone:secret@host/db", "must be a postgresql:// URL"),
    (UNREACHABLE, "cannot reach the database"),
])
def test_a_bad_database_url_is_one_line_without_the_password(url, needle, tmp_path):
    env = _env(DATABASE_URL=url, MIGRATE_HOME=str(tmp_path))
    for args in (["status", "acme"], ["run", "--tenant", "acme", "--source", "example"]):
        line = _one_line_error(_migrate_in_process(args, env), needle)
        assert "secret" not in line and ("DATABASE_URL" in line)


def _storage_rows(db_url: str, sql: str) -> int:
    with psycopg.connect(db_url) as c:
        table = sql.split(" FROM ")[1].split()[0]
        if c.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0] is None:
            return 0
        return c.execute(sql).fetchone()[0]


@pytest.fixture
def run_env(db_url, tmp_path) -> dict[str, str]:
    """A test database for both the engine and Dagster's storage (nothing else is created)."""
    return _env(DATABASE_URL=to_url(db_url), MIGRATE_HOME=str(tmp_path / "home"), MIGRATE_SOURCE="pipedrive",
                **{STORAGE_URL_ENV: to_url(db_url, scheme="postgresql+psycopg2")})


def _nothing_launched(db_url: str) -> None:
    """No run, partition or engine run - and Dagster's storage was never even opened (its tables
    do not exist): the input was refused before an instance, a daemon or a launch was started,
    which is what makes the refusal fast (a launch failing on the same input took ~20 s)."""
    assert _storage_rows(db_url, "SELECT count(*) FROM runs") == 0
    assert _storage_rows(db_url, "SELECT count(*) FROM dynamic_partitions") == 0
    assert _storage_rows(db_url, "SELECT count(*) FROM migrations") == 0
    with psycopg.connect(db_url) as c:
        opened = [t for t in ("runs", "dynamic_partitions", "event_logs")
                  if c.execute("SELECT to_regclass(%s)", (t,)).fetchone()[0] is not None]
    assert not opened, f"Dagster's storage was set up ({opened}) before the input was checked"


def test_kinds_are_checked_against_the_plan_before_anything_is_launched(db_url, run_env):
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    _one_line_error(_migrate_in_process(["run", "--tenant", "acme", "--kinds", "persons,contacts"], env),
                    "--kinds", "'contacts'", "persons")
    _nothing_launched(db_url)


# A fresh user's `--options '{"burst_limit":"abc"}'` was stored with a new engine run whose every task
# then failed, and every relaunch (even --new-run, even after `migrate stop`) joined that run: the
# tenant was stuck. A typo in an option's name was ignored silently.
@pytest.mark.parametrize("options, needles", [
    ('{"burst_limit": "abc"}', ("burst_limit must be an integer", "'abc'")),
    ('{"nope": 1}', ("unknown option 'nope'", "burst_limit", "detect_deletes")),
    ('{"base_url": "ftp://x"}', ("the option base_url must be an http(s) URL",)),
    ('{"detect_deletes": "maybe"}', ("detect_deletes must be true or false",)),
    ('{"api_token": "secret-in-options"}', ("never from run options",)),
])
def test_run_options_are_checked_before_anything_is_launched(db_url, run_env, options, needles):
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    line = _one_line_error(_migrate_in_process(["run", "--tenant", "theta", "--options", options], env), *needles)
    assert "secret-in-options" not in line
    _nothing_launched(db_url)


@pytest.mark.parametrize("kinds", ["", ",,", " , "])
def test_kinds_naming_no_kind_is_an_error_not_every_kind(db_url, run_env, kinds):
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    _one_line_error(_migrate_in_process(["run", "--tenant", "acme", "--kinds", kinds], env), "--kinds names no kind")
    _nothing_launched(db_url)


@pytest.mark.parametrize("command", [["run", "--tenant", "acme"], ["sync", "acme"]])
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e400", "soon"])
def test_a_timeout_must_be_finite_seconds_above_zero(db_url, run_env, command, value):
    # `migrate run --timeout 0` (or -1) launched the run and cancelled it at once, leaving the tenant
    # stopped; `--timeout nan` never timed out
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    _one_line_error(_migrate_in_process([*command, "--timeout", value], env),
                    f"--timeout must be a number of seconds above 0, got {value!r}")
    _nothing_launched(db_url)


@pytest.mark.parametrize("args", [["sandbox", "--live", "nan"], ["sandbox", "--live", "inf"],
                                  ["demo", "--live", "--live-rate", "nan"], ["demo", "--live", "--live-rate", "0"]])
def test_a_live_rate_must_be_finite_and_above_zero(capsys, args):
    # parsed only (make_context): a rate let through would serve or migrate until stopped
    from migration_pipeline.cli.main import main

    with pytest.raises(SystemExit) as exited:
        main.commands[args[0]].make_context(args[0], args[1:])
    assert exited.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert lines == [f"error: {args[-2]} must be a rate above 0 changes per second, got {args[-1]!r}"], lines


@pytest.mark.parametrize("how", ["MIGRATE_SOURCE", "--source"])
def test_an_unknown_source_is_one_line_naming_where_it_came_from(db_url, run_env, how):
    # a fresh user's MIGRATE_SOURCE=bogus launched a run on the fallback example definitions that
    # failed in Dagster ("Can not build subset plan from unknown steps") and left its partition
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    args = ["run", "--tenant", "acme", "--dry-run"]
    if how == "--source":
        args += ["--source", "bogus"]
    else:
        env["MIGRATE_SOURCE"] = "bogus"
    # in-process, the registry also holds the providers other test modules of this process
    # registered ('counter', 'pages', ...), sorted in between: the two built-ins are named, wherever
    line = _one_line_error(_migrate_in_process(args, env), f"{how}='bogus'", "unknown source")
    assert "'example'" in line and "'pipedrive'" in line, line
    _nothing_launched(db_url)


@pytest.mark.parametrize("missing", ["PIPEDRIVE_BASE_URL", "PIPEDRIVE_API_TOKEN"])
def test_missing_pipedrive_variables_are_checked_before_launching(db_url, run_env, missing):
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    env.pop(missing)
    _one_line_error(_migrate_in_process(["run", "--tenant", "acme"], env), missing)
    _nothing_launched(db_url)


def test_a_failed_launch_takes_back_the_partition_it_added():
    with instance_for_test() as instance:
        assert launch.place.add_tenant(instance, "new-tenant") is True
        assert launch.place.add_tenant(instance, "new-tenant") is False  # already there: not ours to remove
        launch.place.undo_failed_launch(instance, "new-tenant", "no-such-run", added=True)
        assert "new-tenant" not in instance.get_dynamic_partitions(TENANTS)
        instance.add_dynamic_partitions(TENANTS, ["old-tenant"])
        launch.place.undo_failed_launch(instance, "old-tenant", "no-such-run", added=False)
        assert "old-tenant" in instance.get_dynamic_partitions(TENANTS)


def test_sandbox_on_a_busy_port_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _one_line_error(_migrate(["sandbox", "--port", str(port), "--scale", "tiny"], _env(MIGRATE_HOME=str(tmp_path)),
                                 timeout=30), f"port {port} is busy", "--port")


def test_ui_beside_a_busy_sandbox_port_says_how_make_ui_takes_another(run_env):
    # the README's rehearsal keeps `migrate sandbox` on 8765, where `make ui` starts its own
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        _one_line_error(_migrate(["ui", "--sandbox", "--port", "1", "--sandbox-port", str(port)],
                                 run_env, timeout=60),
                        f"port {port} is busy", "--sandbox-port", f"make ui UI_ARGS='--sandbox-port {port + 1}'")
    made = subprocess.run(["make", "-n", "ui", "UI_ARGS=--sandbox-port 8766"], cwd=Path(__file__).resolve().parents[2],
                          capture_output=True, text=True, timeout=60)
    assert "migrate ui --sandbox --sandbox-port 8766" in made.stdout, made.stdout + made.stderr


def _instance(env: dict[str, str]) -> DagsterInstance:
    full = dagster_env(env=env)
    os.environ[STORAGE_URL_ENV] = full[STORAGE_URL_ENV]
    return DagsterInstance.from_config(full["DAGSTER_HOME"]), full


def test_a_second_ui_on_one_instance_refuses_and_names_the_first(db_url, run_env):
    instance, full = _instance(run_env)
    saved = os.environ.get(STORAGE_URL_ENV)
    # the first `migrate ui` holds the instance's daemon lock (as `migrate ui` does while it serves)
    lock = launch.daemon.DaemonLock(launch.daemon.lock_path(Path(full["DAGSTER_HOME"]), full[STORAGE_URL_ENV]))
    assert lock.acquire()
    try:
        lock.record(by="migrate ui", pid=os.getpid(), address="http://127.0.0.1:3999", daemon_id=None)
        out = _migrate(["ui", "--port", str(stack.free_port())], run_env, timeout=45)
        _one_line_error(out, "already serves this instance at http://127.0.0.1:3999", "not starting a second daemon")
    finally:
        lock.release()
    # a daemon started by hand (a fresh heartbeat, no lock) counts too
    instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), launch.daemon.RUN_COORDINATOR_DAEMON, "by-hand", None))
    try:
        out = _migrate(["ui", "--port", str(stack.free_port())], run_env, timeout=45)
        _one_line_error(out, "already serves this instance", "not started by migrate")
    finally:
        instance.dispose()
        if saved is None:
            os.environ.pop(STORAGE_URL_ENV, None)
        else:
            os.environ[STORAGE_URL_ENV] = saved


def test_a_dry_run_says_would_import(db_url, run_env):
    with dbmod.Database(db_url, max_size=6) as db:
        run = runs.start_run(db, provider_for("example"), "dry", dry_run=True,
                             options={"page_size": 20, "counts": {"companies": 30, "contacts": 20, "deals": 10,
                                                                  "activities": 10, "notes": 10},
                                      "malformed": {"contacts": [3, 5]}, "dangling": {"deals": [2]}})
        drain_threads(db, run.id, width=2, providers=for_run)
        own = outcome_counts(rollups.rollup(db, run.id))
    out = _migrate_in_process(["status", "dry"], run_env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "would import" in out.stdout and "would match" in out.stdout
    assert "imported" not in out.stdout.replace("would import", "")
    # a dry run is never listed as a plain "succeeded": its state and its percent say dry run first
    assert "a dry run: succeeded" in out.stdout and "a dry run (nothing is written): 100% done" in out.stdout
    overview = _migrate_in_process(["status"], run_env).stdout
    assert "dry run:" in overview.split("dry ", 1)[1].split("\n", 1)[0], overview  # on the tenant's own row
    # the overview's skipped and failed are the dry run's own, as its table sums them (it wrote no
    # ledger row: the overview had said 0 and 0 beside a table of 58 skipped and 43 failed)
    assert own["skipped"] and own["failed"], own
    listed = next(o for o in json.loads(_migrate_in_process(["status", "--json"], run_env).stdout) if o["tenant"] == "dry")
    assert (listed["dry_run"], listed["skipped"], listed["failed"], listed["waiting"]) == \
        (True, own["skipped"], own["failed"], 0), listed
    assert "a dry run's skipped and failed are its own counts" in overview, overview
    from migration_pipeline.cli.output import console
    from migration_pipeline.cli.tables import print_phase_results
    from migration_pipeline.launch.results import PhaseResult

    with console.capture() as captured:
        print_phase_results([PhaseResult("example/phase_1_companies", "materialized", {"imported": 30})], dry_run=True)
    assert "would import" in captured.get() and "imported" not in captured.get().replace("would import", "")


@pytest.mark.parametrize("tenant", ["", "acme corp", "acme/eu", "a,b", "a...b", "-acme", "t" * 64, "tab\there"])
def test_a_bad_tenant_name_is_one_line_naming_it_before_anything_is_launched(db_url, run_env, tenant):
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    line = _one_line_error(_migrate_in_process(["run", "--tenant", tenant], env), "--tenant", "not a valid tenant name")
    assert repr(tenant)[:40].strip("'") in line
    _nothing_launched(db_url)
    # sync takes the tenant as an argument: the line names it as such, not as --tenant (a fresh user's find)
    sync_line = _one_line_error(_migrate_in_process(["sync", "--", tenant], env), "not a valid tenant name")
    assert sync_line.startswith("error: TENANT "), sync_line


def test_good_tenant_names_pass():
    for tenant in ("acme", "globex-eu", "t_1", "demo-live-4242", "A.b", "t" * 63):
        assert launch.checks.check_tenant(tenant) == tenant


def test_an_unreachable_source_is_one_line_naming_the_variable_before_anything_is_launched(db_url, run_env):
    with socket.socket() as s:  # a port nothing listens on (bound, never listening: refused)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        env = dict(run_env, PIPEDRIVE_BASE_URL=f"http://someone:pw@127.0.0.1:{port}", PIPEDRIVE_API_TOKEN="tok")
        line = _one_line_error(_migrate_in_process(["run", "--tenant", "acme"], env), "PIPEDRIVE_BASE_URL",
                               f"cannot connect to 127.0.0.1:{port}")
    assert "pw" not in line.replace("PIPEDRIVE_BASE_URL", "")
    # the URL is shown without its credentials but with its port (a fresh user saw "http://127.0.0.1:")
    assert f"http://127.0.0.1:{port}" in line, line
    _nothing_launched(db_url)


def test_a_second_ui_on_a_busy_port_names_the_first_ui(db_url, run_env):
    instance, full = _instance(run_env)
    saved = os.environ.get(STORAGE_URL_ENV)
    lock = launch.daemon.DaemonLock(launch.daemon.lock_path(Path(full["DAGSTER_HOME"]), full[STORAGE_URL_ENV]))
    assert lock.acquire()
    try:
        with socket.socket() as s:  # the first UI listens on its port and holds the instance's lock
            s.bind(("127.0.0.1", 0))
            s.listen()
            port = s.getsockname()[1]
            lock.record(by="migrate ui", pid=4321, address=f"http://127.0.0.1:{port}", daemon_id=None)
            out = _migrate(["ui", "--port", str(port)], run_env, timeout=45)
        _one_line_error(out, f"port {port} is busy", f"http://127.0.0.1:{port}", "pid 4321", "migrate ui")
    finally:
        lock.release()
        instance.dispose()
        if saved is None:
            os.environ.pop(STORAGE_URL_ENV, None)
        else:
            os.environ[STORAGE_URL_ENV] = saved


@pytest.mark.parametrize("action", ["resume", "retry"])
def test_resume_without_a_daemon_says_what_to_do_and_changes_nothing(db_url, run_env, action):
    with dbmod.Database(db_url, max_size=4) as db:
        run = runs.start_run(db, provider_for("example"), "paused", options={"page_size": 20})
        runs.stop(db, run.id)
        assert runs.get_run(db, run.id).status == "stopped"
        out = _migrate_in_process([action, "paused"], dict(run_env, MIGRATE_SOURCE="example"))
        line = _one_line_error(out, "nothing would work on it", "--drain")
        assert "no daemon" in line or "not launched through Dagster" in line, line
        assert runs.get_run(db, run.id).status == "stopped", "the run was reopened with nobody to work on it"


@pytest.fixture
def sandbox_url():
    """A tiny sandbox account whose token is "tok"."""
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import start_subprocess

    proc, base_url = start_subprocess(SandboxConfig.from_options(scale="tiny", seed=1, token="tok"))
    try:
        yield base_url
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_wrong_token_is_one_line_naming_the_variable_after_one_request_and_nothing_is_launched(
        db_url, run_env, sandbox_url):
    import httpx

    env = dict(run_env, PIPEDRIVE_BASE_URL=sandbox_url, PIPEDRIVE_API_TOKEN="wrong-token-4f9a")
    line = _one_line_error(_migrate_in_process(["run", "--tenant", "acme"], env), "PIPEDRIVE_API_TOKEN", "refused")
    assert "wrong-token-4f9a" not in line
    _nothing_launched(db_url)
    stats = httpx.get(sandbox_url + "/_sandbox/stats", timeout=10).json()
    assert stats["unauthorized"] == 1 and stats["requests_total"] <= 1, stats  # one request, no retry
    # plan and verify (of a tenant with a run) say it in the same words: they had said "the pipedrive
    # source failed: AuthError: ..." and "Pipedrive rejected the API token (...)", each its own way
    from engine_core.providers.pipedrive.provider import PipedriveProvider

    with dbmod.Database(db_url, max_size=2) as db:
        runs.start_run(db, PipedriveProvider(base_url=sandbox_url, token="tok"), "acme")
    for args in (["plan", "acme"], ["verify", "acme"]):
        assert _one_line_error(_migrate_in_process(args, env)) == line, args


def test_kinds_name_kinds_a_user_can_pick_not_the_catch_up_phase(db_url, run_env):
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    line = _one_line_error(_migrate_in_process(["run", "--tenant", "acme", "--kinds", "contacts"], env),
                           "--kinds", "'contacts'", "persons")
    assert "catchup" not in line
    _one_line_error(_migrate_in_process(["run", "--tenant", "acme", "--kinds", "persons,catchup"], env),
                    "--kinds", "'catchup' is the catch-up phase", "not a kind to pick")
    _nothing_launched(db_url)


def test_explain_names_an_unknown_tenant_or_kind_and_what_there_is(db_url, run_env):
    with dbmod.Database(db_url, max_size=4) as db:
        runs.start_run(db, provider_for("example"), "known", options={"page_size": 20})
    env = dict(run_env, MIGRATE_SOURCE="example")
    _one_line_error(_migrate_in_process(["explain", "nobody", "contacts", "7"], env),
                    "no tenant 'nobody'", "(tenants: known)")
    line = _one_line_error(_migrate_in_process(["explain", "known", "persons", "7"], env),
                           "unknown kind 'persons'", "kinds: ", "contacts")
    assert "not in the ledger" not in line
    out = _migrate_in_process(["explain", "known", "contacts", "7"], env)  # a kind it has: the ledger answers
    assert out.returncode == 1 and "not in the ledger" in out.stdout, (out.returncode, out.stdout, out.stderr)


def test_a_migrated_tenant_is_refused_before_launching_and_pointed_to_sync_and_new_run(db_url, run_env):
    with dbmod.Database(db_url, max_size=6) as db:
        run = runs.start_run(db, provider_for("example"), "done",
                             options={"page_size": 20, "counts": {"companies": 10, "contacts": 10, "deals": 5,
                                                                  "activities": 5, "notes": 5}})
        drain_threads(db, run.id, width=2, providers=for_run)
        assert runs.get_run(db, run.id).status == "succeeded"
    env = dict(run_env, MIGRATE_SOURCE="example")
    _one_line_error(_migrate_in_process(["run", "--tenant", "done", "--source", "example"], env),
                    "'done' is already migrated", "migrate sync done", "--new-run")
    with psycopg.connect(db_url) as c:  # refused before Dagster's storage was opened
        assert c.execute("SELECT to_regclass('runs')").fetchone()[0] is None


@pytest.mark.parametrize("answer", [(404, b'{"error": "no such page"}'), (200, b"<html>welcome</html>")],
                         ids=["404", "html"])
def test_a_server_that_is_no_pipedrive_api_is_one_line_naming_the_base_url_before_anything_is_launched(
        db_url, run_env, answer):
    """A fresh user's find: a host that answers every path with 404 passed the checks; the run was
    launched and its tasks failed on 404s (exit 1, a partition and runs left behind)."""
    import http.server
    import threading

    status, body = answer

    class Everything(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(status)
            self.send_header("content-type", "text/html" if body.startswith(b"<") else "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # quiet
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Everything)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        env = dict(run_env, PIPEDRIVE_BASE_URL=url, PIPEDRIVE_API_TOKEN="tok-5e1f")
        line = _one_line_error(_migrate_in_process(["run", "--tenant", "acme"], env), "PIPEDRIVE_BASE_URL", url,
                               "is not a Pipedrive API")
        assert "tok-5e1f" not in line
        # the hint names the base URL the client and the README use, not a per-company host
        assert "https://api.pipedrive.com" in line and "<company>" not in line, line
    finally:
        server.shutdown()
    _nothing_launched(db_url)


@pytest.mark.parametrize("args", [["sandbox", "--port", "99999"], ["ui", "--port", "0"],
                                  ["ui", "--sandbox-port", "70000"], ["report", "acme", "--top", "-1"]])
def test_an_out_of_range_number_is_refused_by_the_command_line_not_a_traceback(run_env, args):
    # a fresh user's `migrate sandbox --port 99999` ended in OverflowError's traceback from bind()
    out = _migrate_in_process(args, run_env)
    assert out.returncode == 2 and "Traceback" not in out.stderr + out.stdout, (out.stdout[-1000:], out.stderr[-2000:])
    assert "is not in the range" in out.stderr, out.stderr[-2000:]


# Python's json reads NaN and Infinity (and 1e400 as inf): a fresh user's `--options` with them ended
# in a traceback (rc 1); the run's checks refuse them in one line, nothing launched
@pytest.mark.parametrize("options, needles", [
    ('{"snapshot_margin_seconds": NaN}', ("snapshot_margin_seconds must be a number of seconds", "nan")),
    ('{"snapshot_margin_seconds": Infinity}', ("snapshot_margin_seconds must be a number of seconds", "inf")),
    ('{"burst_limit": 1e400}', ("burst_limit must be an integer", "inf")),
])
def test_a_non_finite_option_is_one_line_before_anything_is_launched(db_url, run_env, options, needles):
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    _one_line_error(_migrate_in_process(["run", "--tenant", "theta", "--options", options], env), *needles)
    _nothing_launched(db_url)


def test_kinds_add_opt_in_kinds_with_plus_and_name_unknown_ones_at_start_up(db_url, run_env):
    env = dict(run_env, PIPEDRIVE_BASE_URL="http://127.0.0.1:9", PIPEDRIVE_API_TOKEN="tok")
    _one_line_error(_migrate_in_process(["run", "--tenant", "acme", "--kinds", "+histroy,+particpants"], env),
                    "--kinds", "unknown kinds 'histroy', 'particpants'", "deal_history", "participants")
    _one_line_error(_migrate_in_process(["run", "--tenant", "acme", "--kinds", "persons,+deal_history"], env),
                    "--kinds", "not both")
    _one_line_error(_migrate_in_process(["plan", "acme", "--kinds", "persons,+deal_history"], env),
                    "--kinds: kinds persons and +deal_history", "not both")
    _one_line_error(_migrate_in_process(["run", "--tenant", "acme", "--kinds", "+participants,bogus"], env),
                    "error: --kinds: unknown kind 'bogus'", "deal_history")
    _one_line_error(_migrate_in_process(["run", "--tenant", "acme", "--kinds", "+participants,-participants"], env),
                    "error: --kinds: participants is both added and removed")
    # a good choice passes the kinds check: the next check (the source's address) is what refuses
    line = _one_line_error(_migrate_in_process(["run", "--tenant", "acme", "--kinds", "+deal_history,-notes"], env),
                           "PIPEDRIVE_BASE_URL")
    assert "kind" not in line
    _nothing_launched(db_url)


def test_status_says_what_a_run_left_out(db_url, run_env):
    from tests.pipedrive.support import sandbox, start

    with sandbox() as sb, dbmod.Database(db_url, max_size=4) as db:
        start(db, sb, "lean", kinds=["+followers"])
        out = _migrate_in_process(["status", "lean"], dict(run_env, PIPEDRIVE_BASE_URL=sb.base_url))
    assert out.returncode == 0, out.stderr[-2000:]
    text = " ".join(out.stdout.split())
    assert ("left out: file_contents, participants, deal_history (opt-in: taken only when asked)\n"
            "to add them: a run of those kinds alone, --kinds file_contents,participants,deal_history"
            in out.stdout), out.stdout


@pytest.mark.parametrize("args, needle", [
    (["plan"], "Missing argument 'TENANT'"),
    (["nosuch"], "No such command 'nosuch'"),
    (["status", "--bogus"], "No such option '--bogus'"),
    (["db", "nosuch"], "No such command 'nosuch'"),
    (["rows", "acme", "--action", "bogus"],
     "Invalid value for '--action': 'bogus' is not one of 'skipped', 'waiting', 'failed', 'all'"),
])
def test_a_usage_error_begins_error_as_every_other_failure_does(args, needle):
    # click's own usage errors said "Error: ", every other failure of the command line "error: "
    from click.testing import CliRunner

    from migration_pipeline.cli.main import main

    out = CliRunner().invoke(main, args, prog_name="migrate")
    lines = out.stderr.splitlines()
    assert out.exit_code == 2 and lines[0].startswith("Usage: migrate"), out.stderr
    assert lines[-1] == f"error: {needle}." and "Error" not in out.stderr, out.stderr
    assert all(ln.strip() for ln in lines), out.stderr  # no blank line before the error (`rows --action bogus` had one)
