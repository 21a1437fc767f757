"""Progress while a phase runs (issue 10, item 2): the phase op reports every few seconds, as a
Dagster log line and as an asset observation of its partition with numeric metadata (rows seen /
imported / skipped / failed, rows/s, requests/s, 429s, retries in progress, tasks done/total,
percent), so the UI plots them over time; the source client feeds the process's request, 429 and
retry counters with the retry's cause; `run_progress` gives `migrate status` a percent and an ETA;
the `rich` board draws one bar per phase. And "what happened to row X" from the UI: the
`explain_row` job, configured in the launchpad, logs the row's ledger story and returns it as
markdown metadata."""
from __future__ import annotations

import io
import json

import httpx

from engine_core import runs
from engine_core.progress import ProgressBoard, SourceMetrics, run_progress, status_line
from engine_core.providers.registry import provider_for, for_run
from engine_core.providers.pipedrive import client as client_mod
from engine_core.worker import drain_threads
from migration_pipeline.definitions import build_definitions
from migration_pipeline.jobs import EXPLAIN_JOB
from tests.dagster.support import SMALL, materialize_tenant, resources
from tests.engine.support import FAST

FIRST_THREE = ["example/phase_1_companies", "example/phase_2_contacts", "example/phase_3_deals"]


def test_a_running_phase_reports_progress_as_log_lines_and_asset_observations(instance, engine_url, db, monkeypatch):
    from migration_pipeline.assets import phases

    monkeypatch.setattr(phases, "PROGRESS_SECONDS", 0.2)
    monkeypatch.setenv("MIGRATE_LAUNCH_THREADS", "1")  # one lane thread: the phase lasts long enough
    slow = {**SMALL, "row_delay": 0.02, "dangling": {"deals": [1, 2, 3]}}
    # the phases asserted on (each phase more was ~2 s at load 5)
    result = materialize_tenant(instance, "watched", resources(engine_url, options=slow), raise_on_error=True,
                                selection=FIRST_THREE)

    observed = [e for e in result.all_events if e.event_type_value == "ASSET_OBSERVATION"]
    by_phase: dict[str, list] = {}
    for e in observed:
        obs = e.event_specific_data.asset_observation
        assert obs.partition == "watched"
        by_phase.setdefault(obs.asset_key.path[-1], []).append(obs.metadata)
    assert {"phase_2_contacts", "phase_3_deals"} <= set(by_phase), by_phase.keys()
    contacts = by_phase["phase_2_contacts"]
    assert len(contacts) >= 3
    for md in contacts:
        for key in ("seen", "imported", "skipped", "failed", "rows_per_second", "requests_per_second",
                    "rate_limited_429s", "retries_in_progress", "tasks_done", "tasks_total"):
            assert key in md, key
    seen = [md["seen"].value for md in contacts]
    assert seen == sorted(seen) and seen[-1] == 70  # grows, and the last report is the phase's end
    assert max(md["rows_per_second"].value for md in contacts) > 0
    assert contacts[-1]["percent"].value == 100.0 and contacts[-1]["tasks_done"].value == contacts[-1]["tasks_total"].value
    assert by_phase["phase_3_deals"][-1]["skipped"].value == 3

    logs = [r.user_message for r in instance.all_logs(result.run_id) if "progress: phase 2 (contacts)" in r.user_message]
    assert logs and "rows/s" in logs[0] and "tasks" in logs[0]


def test_the_client_counts_requests_429s_and_retries_in_progress_with_their_cause(monkeypatch):
    metrics = SourceMetrics()
    monkeypatch.setattr(client_mod, "source_metrics", metrics)
    answers = iter([httpx.Response(500, json={"success": False}),
                    httpx.Response(429, json={"success": False}, headers={"retry-after": "0"}),
                    httpx.Response(200, json={"success": True, "data": [{"id": 1}]})])
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 1:  # while the first retry waits, it is "in progress" with its cause
            assert metrics.snapshot()["retrying"] == {"HTTP 500": 1}

    c = client_mod.PipedriveClient("http://pipedrive.test", "tok", transport=httpx.MockTransport(lambda r: next(answers)),
                                   sleep=sleep, rng=lambda: 0.0)
    c.get("/v1/persons")
    snap = metrics.snapshot()
    assert (snap["requests"], snap["failed_requests"], snap["rate_limited"], snap["retries"]) == (3, 2, 1, 2)
    assert snap["failing_for_seconds"] == 0.0  # the last request succeeded


def test_status_gets_a_percent_and_an_eta_and_the_board_draws_a_bar_per_phase(db, monkeypatch):
    from rich.console import Console

    from migration_pipeline import cli
    from migration_pipeline.cli.inspect import tenant_overview
    from migration_pipeline.cli.tables import print_overview

    opts = {"page_size": 10, "counts": {"companies": 20, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}
    run = runs.start_run(db, provider_for("example"), "pct", options=opts, settings=FAST)
    before = run_progress(db, run.id)
    assert before["percent"] == 0.0 and before["eta_seconds"] is None
    assert [p["tasks_total"] for p in before["phases"]][:2] == [4, 0]
    # half of the first phase's tasks done: 10% of a five-phase run
    db.sql("UPDATE migration_tasks SET status = 'succeeded', finished_at = now() WHERE id IN (SELECT id FROM"
           " migration_tasks WHERE migration_id = %(r)s ORDER BY id LIMIT 2)", {"r": run.id})
    db.sql("UPDATE migrations SET started_at = now() - interval '60 seconds' WHERE id = %(r)s", {"r": run.id})
    mid = run_progress(db, run.id)
    assert mid["phases"][0]["percent"] == 50.0 and mid["percent"] == 10.0
    assert 500 <= mid["eta_seconds"] <= 560  # 60 s for 10%: about 540 s to go
    assert mid["idle_seconds"] < 60 and "ETA" in status_line(mid, stale_after=120)
    # a live run at 99.6% is not "100% done" (a small run's catch-up had shown "100% done, ETA 0s")
    assert status_line({**mid, "percent": 99.6, "phases": []}).startswith("99% done, ETA")

    # nothing has touched the run for 10 minutes (its command was killed, no daemon): no ETA, said so
    db.sql("UPDATE migrations SET heartbeat_at = now() - interval '10 minutes' WHERE id = %(r)s", {"r": run.id})
    db.sql("UPDATE migration_tasks SET updated_at = now() - interval '11 minutes',"
           " locked_at = now() - interval '12 minutes' WHERE migration_id = %(r)s", {"r": run.id})
    idle = run_progress(db, run.id)
    assert 600 <= idle["idle_seconds"] < 660, idle
    line = status_line(idle, stale_after=120)
    assert "ETA" not in line and "nothing has worked on it for 10m" in line and "no worker is draining it" in line, line
    # `migrate status --json` says the same: no ETA for a run nothing works on (it had kept one)
    judged = run_progress(db, run.id, stale_after=120)
    assert judged["eta_seconds"] is None and judged["unattended"] is True, judged
    assert run_progress(db, run.id, stale_after=3600)["eta_seconds"] is not None  # idle, but not for that long
    # and `migrate status` without a tenant marks it in its table (it had shown a plain "running")
    overview = tenant_overview(db, stale_after=120)
    assert [(o["tenant"], o["unattended"]) for o in overview] == [("pct", True)] and overview[0]["idle_seconds"] >= 600
    table = Console(file=io.StringIO(), width=140, record=True)  # room for the skipped and failed columns
    monkeypatch.setattr(cli.tables, "console", table)
    print_overview(overview)
    shown = " ".join(table.export_text().split())  # the caption wraps at the table's width
    assert "running (idle 10m" in shown and "no worker is draining it" in shown, shown
    assert not tenant_overview(db, stale_after=3600)[0]["unattended"]
    # a running task's lock renewed a minute ago: something works on it
    db.sql("UPDATE migration_tasks SET locked_at = now() - interval '1 minute' WHERE id = (SELECT min(id) FROM"
           " migration_tasks WHERE migration_id = %(r)s)", {"r": run.id})
    assert "ETA" in status_line(run_progress(db, run.id), stale_after=120)

    db.sql("UPDATE migration_tasks SET status = 'pending', finished_at = NULL WHERE migration_id = %(r)s", {"r": run.id})
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    done = run_progress(db, run.id)
    assert done["percent"] == 100.0 and done["eta_seconds"] is None

    out = io.StringIO()
    with ProgressBoard(run.id, runs.get_run(db, run.id).plan, console=Console(file=out, width=200)) as board:
        shown = board.update(db)
    assert [p.phase for p in shown] == [0, 1, 2, 3, 4] and all(p.percent == 100.0 for p in shown)
    assert "phase 2 contacts" in out.getvalue() and "10 seen 10 imported" in out.getvalue()
    out = io.StringIO()  # a dry run's bars use the results tables' words (they said "imported")
    with ProgressBoard(run.id, runs.get_run(db, run.id).plan, console=Console(file=out, width=200), dry_run=True) as board:
        board.update(db)
    assert "10 seen 10 would import" in out.getvalue() and " imported" not in out.getvalue(), out.getvalue()


def test_explain_row_tells_a_rows_story_from_the_launchpad(instance, engine_url, db):
    options = {**SMALL, "dangling": {"deals": [3]}}
    materialize_tenant(instance, "explained", resources(engine_url, options=options), raise_on_error=True,
                       selection=FIRST_THREE)  # the companies and deals explained
    job = build_definitions("example").resolve_job_def(EXPLAIN_JOB)
    res = {"database": resources(engine_url)["database"]}

    def explain(kind: str, source_id: str):
        result = job.execute_in_process(
            instance=instance, resources=res,
            run_config={"ops": {"explain": {"config": {"tenant": "explained", "kind": kind, "source_id": source_id}}}})
        (out,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        return out.event_specific_data.metadata

    deal = explain("deals", "3")
    assert deal["action"].value == "skipped" and deal["reason"].value == "not linked to any record"
    assert "**skipped** by run #" in deal["story"].value and "not linked to any record" in deal["story"].value
    company = explain("companies", "1")
    assert "**created**" in company["story"].value and "`example_items`" in company["story"].value
    missing = explain("deals", "999")
    assert missing["entries"].value == 0 and "no entry for this row" in missing["story"].value


def test_migrate_status_shows_grouped_skip_reasons_completeness_percent_and_eta(db, engine_url, monkeypatch):
    """`migrate status --json` used to say `reasons: []` while rows were skipped."""
    import json

    from click.testing import CliRunner

    from migration_pipeline.cli.main import main

    opts = {"page_size": 10, "counts": {"companies": 10, "contacts": 10, "deals": 30, "activities": 5, "notes": 5},
            "dangling": {"deals": list(range(1, 22))}, "malformed": {"contacts": [2]}}
    run = runs.start_run(db, provider_for("example"), "told", options=opts, settings=FAST)
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    monkeypatch.setenv("DATABASE_URL", engine_url)
    out = CliRunner().invoke(main, ["status", "told", "--json"])
    assert out.exit_code == 0, out.output
    status = json.loads(out.output)
    reasons = {(g["kind"], g["action"]): g for g in status["reasons"]}
    assert reasons[("deals", "skipped")]["count"] == 21 and reasons[("deals", "skipped")]["reason"] == "not linked to any record"
    assert reasons[("contacts", "failed")]["samples"] == ["2"]
    assert status["counts_add_up"] is True and status["verdict"] == "succeeded"
    assert status["progress"]["percent"] == 100.0

    text = CliRunner().invoke(main, ["status", "told"])
    assert text.exit_code == 0 and "not linked to any record" in text.output and "100% done" in text.output


def test_migrate_report_lists_power_of_two_buckets_and_the_grouped_reasons(db, engine_url, monkeypatch):
    import json

    from click.testing import CliRunner

    from migration_pipeline.cli.main import main

    opts = {"page_size": 10, "counts": {"companies": 10, "contacts": 10, "deals": 30, "activities": 5, "notes": 5},
            "dangling": {"deals": [4, 5, 6]}}
    run = runs.start_run(db, provider_for("example"), "reported", options=opts, settings=FAST)
    drain_threads(db, run.id, width=2, settings=FAST, providers=for_run)
    monkeypatch.setenv("DATABASE_URL", engine_url)
    out = CliRunner().invoke(main, ["report", "reported", "--kind", "deals", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert {r["payload"] for r in report["durations"]} <= {"0", "4-7", "8-15"}
    assert [(g["kind"], g["action"], g["count"]) for g in report["reasons"]] == [("deals", "skipped", 3)]
    # it says which run it reports, and how to pick another (it had reported the latest without a word)
    shown = CliRunner().invoke(main, ["report", "reported", "--kind", "deals"])
    assert f"reporting {run.name}, the tenant's latest run (a full run); --run N reports another" in \
        " ".join(shown.output.split()), shown.output
    assert "reporting" not in CliRunner().invoke(main, ["report", "reported", "--run", str(run.id)]).output
    bogus = CliRunner().invoke(main, ["report", "reported", "--kind", "bogus"])  # a fresh user's find: an empty table, rc 0
    assert bogus.exit_code == 2 and "unknown kind 'bogus' (kinds: " in bogus.output and "deals" in bogus.output, bogus.output


def test_a_budget_wait_is_said_in_the_phase_progress_events(instance, engine_url, db, monkeypatch):
    # The account's budget row says the daily budget is spent until a reset: every progress report
    # of the running phase says so with the time, so the UI's event log never shows a silent wait.
    from migration_pipeline.assets import phases

    monkeypatch.setattr(phases, "PROGRESS_SECONDS", 0.2)
    db.sql("INSERT INTO source_budgets (source, account, burst_limit, daily_reset_at, daily_reason)"
           " VALUES ('example', 'example-account', 80, now() + interval '1 hour', 'spent')")
    monkeypatch.setenv("MIGRATE_LAUNCH_THREADS", "1")  # one lane thread: the phase reports while it runs
    slow = {**SMALL, "row_delay": 0.02}
    # the first phase says it as well as all five did (every phase took ~10 s at load 5)
    result = materialize_tenant(instance, "parked", resources(engine_url, options=slow), raise_on_error=True,
                                selection=["example/phase_1_companies"])
    lines = [r.user_message for r in instance.all_logs(result.run_id) if r.user_message.startswith("progress: phase")]
    assert lines and all("waiting on the daily token budget: the source says it is spent, until " in ln
                         for ln in lines), lines[:3]


def test_the_bars_leave_stdout_and_stderr_where_they_point():
    """On a terminal, rich's progress swaps sys.stdout/sys.stderr for proxies that print above the
    bars; `migrate run` executing its Dagster run in-process then showed Dagster's console log
    lines (its handler, made during the run, held the proxy) on the terminal, not in
    in-process-runs.log where descriptors 1 and 2 point (a fresh user's find: 89 lines in 20 s)."""
    import logging
    import sys

    from rich.console import Console

    shown = io.StringIO()
    before = (sys.stdout, sys.stderr)
    with ProgressBoard(1, [["companies"]], console=Console(file=shown, force_terminal=True, width=120)):
        assert (sys.stdout, sys.stderr) == before
        handler = logging.StreamHandler()  # as Dagster's console logger makes its handler: sys.stderr now
        assert handler.stream is before[1]


def test_the_run_percent_weighs_phases_by_their_cost_so_mail_gets_its_eta_and_nothing_steps_back(db):
    from engine_core.source import progress_weights

    # Pipedrive's weights: the mail phase is most of a default run (requests and written rows)
    weights = progress_weights(provider_for("pipedrive"))
    default = [k for g in provider_for("pipedrive").phases() for k in g
               if k not in ("participants", "followers", "deal_history", "file_contents")]
    assert 0.6 < weights["emails"] / sum(weights[k] for k in default) < 0.9, weights

    # a five-phase run whose last phase ("notes" here) costs what the other four do twelve times over
    opts = {"page_size": 10, "counts": {"companies": 20, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}
    run = runs.start_run(db, provider_for("example"), "weighed", options=opts, settings=FAST)
    dear = {"companies": 1.0, "contacts": 1.0, "deals": 1.0, "activities": 1.0, "notes": 48.0}
    db.sql("UPDATE migrations SET started_at = now() - interval '100 seconds' WHERE id = %(r)s", {"r": run.id})

    def at(phase: int, done: int, total: int, seen: int | None = None, source_total: int | None = None) -> dict:
        """The run with its barrier at `phase`, that phase's `kind` with `done` of `total` tasks."""
        kind = runs.get_run(db, run.id).plan[phase][0]
        db.sql("DELETE FROM migration_tasks WHERE migration_id = %(r)s AND phase >= %(p)s", {"r": run.id, "p": phase})
        for n in range(total):
            stats = {"seen": seen // total} if seen is not None else {}
            if source_total is not None:
                stats["source_total"] = source_total
            db.sql("INSERT INTO migration_tasks (migration_id, phase, kind, cursor_key, status, stats) VALUES"
                   " (%(r)s, %(p)s, %(k)s, %(c)s, %(s)s, %(st)s::jsonb)",
                   {"r": run.id, "p": phase, "k": kind, "c": f"t{n}", "s": "succeeded" if n < done else "pending",
                    "st": json.dumps(stats)})
        db.sql("UPDATE migrations SET current_phase = %(p)s WHERE id = %(r)s", {"r": run.id, "p": phase})
        return run_progress(db, run.id, weights=dear)

    seq = [at(0, 2, 4), at(1, 0, 1), at(1, 1, 3), at(2, 1, 1, seen=0, source_total=50), at(2, 1, 1, seen=40, source_total=50),
           at(3, 3, 3), at(4, 0, 1), at(4, 1, 21), at(4, 10, 20)]
    shown = [p["percent"] for p in seq]
    assert shown == sorted(shown), shown  # forward only
    # half the dear phase done after 100 s: 54% of the run (not 90%: an ETA of 11 s), about as long again to go
    mail = seq[-1]
    assert mail["percent"] == 53.8 and mail["phases"][4]["weight"] == 92.3, mail
    assert 80 <= mail["eta_seconds"] <= 95, mail


def test_a_discovery_not_yet_run_counts_the_tasks_it_is_expected_to_seed_so_the_percent_never_steps_back(db):
    from engine_core.progress import PhaseMeter
    from engine_core.providers.pipedrive.mail_expect import expected_after

    # the small sandbox's mail walk: its first page listed 500 of 1,101 deals, 163 with mail; the
    # rest seeded 23 tasks (18 on its second page, the third page and its 4): the estimate errs high
    assert expected_after(500, 163, 1101) == 23
    assert expected_after(1000, 334, 1101) == 4
    # the list's count unknown, or passed (the list grew since counted): one full page more
    assert expected_after(500, 163, None) == 18 and expected_after(1101, 367, 1101) == 18

    opts = {"page_size": 10, "counts": {"companies": 20, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}
    run = runs.start_run(db, provider_for("example"), "expected", options=opts, settings=FAST)
    last = len(runs.get_run(db, run.id).plan) - 1
    kind = runs.get_run(db, run.id).plan[last][0]
    db.sql("UPDATE migrations SET current_phase = %(p)s, started_at = now() - interval '100 seconds'"
           " WHERE id = %(r)s", {"r": run.id, "p": last})
    db.sql("DELETE FROM migration_tasks WHERE migration_id = %(r)s AND phase = %(p)s", {"r": run.id, "p": last})

    def seed(key: str, status: str = "pending", expected: int | None = None) -> None:
        cursor = {"expected_tasks": expected} if expected is not None else {}
        db.sql("INSERT INTO migration_tasks (migration_id, phase, kind, cursor_key, status, cursor, started_at)"
               " VALUES (%(r)s, %(p)s, %(k)s, %(c)s, %(s)s, %(cur)s::jsonb, now() - interval '60 seconds')",
               {"r": run.id, "p": last, "k": kind, "c": key, "s": status, "cur": json.dumps(cursor)})

    def finish(n: int) -> dict:
        db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE id IN (SELECT id FROM migration_tasks WHERE"
               " migration_id = %(r)s AND phase = %(p)s AND status = 'pending' AND cursor_key LIKE 'mail%%'"
               " ORDER BY id LIMIT %(n)s)", {"r": run.id, "p": last, "n": n})
        return run_progress(db, run.id)

    # the first discovery page ran: 24 tasks of its deals, its next page expects 23 more
    seed("discover:p0", "succeeded")
    for n in range(24):
        seed(f"mail:p0:c{n}")
    seed("discover:p1", expected=23)
    seq = [finish(0), finish(8), finish(8)]
    mail = seq[-1]["phases"][last]
    assert (mail["tasks_done"], mail["tasks_total"], mail["tasks_expected"]) == (17, 26, 23), mail
    assert mail["percent"] == round(100 * 17 / 49, 1), mail  # not 17/26: 65%, to step back to 35%
    assert "17/26 tasks, about 49 expected" in status_line(seq[-1]), status_line(seq[-1])
    # numbered as the phase assets are where `migrate status` labels it (phase_9_catchup is 9/9)
    labelled = {**seq[-1], "phases": [{**ph, "label": f"{ph['phase'] + 2}/9"} for ph in seq[-1]["phases"]]}
    assert f"; phase {last + 2}/9 ({kind}): " in status_line(labelled), status_line(labelled)
    meter = PhaseMeter(db, run.id, last, [kind]).snapshot()
    assert (meter.tasks_expected, meter.percent) == (23, mail["percent"]) and "about 49 expected" in meter.line()
    # the second page ran: 18 tasks, the third page expects 4; then the third: 4 tasks, nothing more
    db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE migration_id = %(r)s AND cursor_key = 'discover:p1'",
           {"r": run.id})
    for n in range(18):
        seed(f"mail:p1:c{n}")
    seed("discover:p2", expected=4)
    seq.append(finish(0))
    db.sql("UPDATE migration_tasks SET status = 'succeeded' WHERE migration_id = %(r)s AND cursor_key = 'discover:p2'",
           {"r": run.id})
    for n in range(4):
        seed(f"mail:p2:c{n}")
    seq += [finish(0), finish(10), finish(20)]
    shown = [p["percent"] for p in seq]
    assert shown == sorted(shown), shown  # forward only
    assert seq[-2]["phases"][last]["tasks_expected"] == 0 and seq[-2]["phases"][last]["tasks_total"] == 49

    # the ETA follows the open phase's pace once it is 5% done: 29 of its 49 tasks in the 60 s since
    # its first task started, 20 to go: 41 s, not the run's 100 s over its 91.8% (9 s: the four
    # phases before it were quick)
    paced = seq[-2]
    assert paced["percent"] == 91.8 and abs(paced["eta_seconds"] - 60 * 20 / 29) < 2, paced
