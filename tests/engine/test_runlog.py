"""Behaviour 13: the run log keeps grouped reasons capped at 200 entries, buffered per task and
appended once per task - a task with 1,000 failed rows appends once, not 1,000 times."""
from __future__ import annotations

from engine_core import runs
from engine_core.providers.registry import provider_for, for_run
from engine_core.runlog import RunLog
from engine_core.worker import Worker
from tests.engine.support import FAST, task_rows


def _count_log_writes(db) -> None:
    db.sql("CREATE TABLE log_writes (n int)")
    db.sql("""CREATE FUNCTION note_log_write() RETURNS trigger AS $$ BEGIN
              IF NEW.log IS DISTINCT FROM OLD.log THEN INSERT INTO log_writes VALUES (1); END IF;
              RETURN NEW; END $$ LANGUAGE plpgsql""")
    db.sql("CREATE TRIGGER t BEFORE UPDATE ON migrations FOR EACH ROW EXECUTE FUNCTION note_log_write()")


def test_a_task_with_1000_failed_rows_appends_to_the_log_once(db) -> None:
    _count_log_writes(db)
    bad = list(range(1, 1001))
    run = runs.start_run(db, provider_for("example"), "acme", kinds=["companies"],
                         options={"page_size": 1010, "counts": {"companies": 1010}, "malformed": {"companies": bad}}, settings=FAST)
    task = task_rows(db, run.id)[0]
    assert Worker(db, settings=FAST, providers=for_run).execute(task["id"]) == "succeeded"
    assert db.sql("SELECT count(*) AS n FROM log_writes")[0]["n"] == 1
    log = db.sql("SELECT log FROM migrations WHERE id = %(r)s", {"r": run.id})[0]["log"]
    assert len(log) == 1 and log[0]["count"] == 1000 and len(log[0]["samples"]) == 5
    assert task_rows(db, run.id)[0]["stats"]["failed"] == 1000


def _word(i: int) -> str:
    return "".join(chr(97 + int(d)) for d in str(i))  # numbers are grouped away; letters are not


def test_the_log_is_capped_at_200_newest_entries(db) -> None:
    run = runs.start_run(db, provider_for("example"), "acme", settings=FAST)
    for batch in range(3):
        log = RunLog(run.id, cap=200)
        for i in range(150):
            log.note("error", "companies", f"distinct reason {_word(batch)}-{_word(i)}")
        with db.connection() as c:
            log.flush(c)
    entries = db.sql("SELECT log FROM migrations WHERE id = %(r)s", {"r": run.id})[0]["log"]
    assert len(entries) == 200
    assert entries[-1]["reason"] == f"distinct reason {_word(2)}-{_word(149)}"
    assert entries[0]["reason"] == f"distinct reason {_word(1)}-{_word(100)}"


def test_a_task_with_more_groups_than_the_cap_flushes_early(db) -> None:
    log = RunLog(1, cap=3)
    for i in range(3):
        log.note("error", "k", f"reason {chr(97 + i)}")
    assert log.should_flush_early()


def test_a_duration_is_one_placeholder_in_a_reasons_shape() -> None:
    # not "paused: the source failed every request for {n}m02s" in `migrate status`
    from engine_core.runlog import reason_shape

    assert reason_shape("the source failed every request for 3m02s (last: HTTP 500)") == \
        "the source failed every request for {n} (last: HTTP 500)"
    assert reason_shape("waited 1h05m for the daily budget") == "waited {n} for the daily budget"
    assert reason_shape("retry 1/5 in 42s") == "retry {n}/{n} in {n}s"


def test_names_with_numbers_are_kept_and_a_thousands_separated_number_is_one_placeholder() -> None:
    # not "UTF-{n}" and "{n},{n}" in the grouped reasons
    from engine_core.runlog import reason_shape

    assert reason_shape("body is not UTF-8 (ISO-8859-1?)") == "body is not UTF-8 (ISO-8859-1?)"
    assert reason_shape("UnicodeDecodeError: 'utf-8' codec can't decode byte 0xff in position 12") == \
        "UnicodeDecodeError: 'utf-8' codec can't decode byte {n} in position {n}"
    assert reason_shape("HTTP/1.1 502 Bad Gateway from the v2 API") == "HTTP/1.1 502 Bad Gateway from the v2 API"
    assert reason_shape("SHA-256 of row 7 differs") == "SHA-256 of row {n} differs"
    assert reason_shape("stopped from Dagster (Dagster run 01c26c1d terminated)") == \
        "stopped from Dagster (Dagster run {id} terminated)"
    assert reason_shape("stopped from Dagster (Dagster run b0f1d123 terminated)") == \
        "stopped from Dagster (Dagster run {id} terminated)"
    assert reason_shape("1,234 rows over the limit of 1,000,000") == "{n} rows over the limit of {n}"
    assert reason_shape("ids 12,5 and 1,2345") == "ids {n},{n} and {n},{n}"  # not thousands: three digits a group
    # ids stay placeholders, in a path too
    assert reason_shape("GET /v1/persons/123 failed: person 42 references org 7") == \
        "GET /v1/persons/{n} failed: person {n} references org {n}"


def test_a_served_value_at_the_end_of_a_reason_is_one_placeholder():
    # else a malformed-row account has a group per row: "name is not text: {'value': 'Carla ...'}"
    from engine_core.runlog import reason_shape

    for served in ("{'value': 'Carla Pereira', 'nes...", "{'value': 'Lukas Meyer'}", "['not', 'an', 'object']",
                   "'abc'", '"seven"', "'a long name cut at forty characters by ..."):
        assert reason_shape(f"MalformedRow: name is not text: {served}") == "MalformedRow: name is not text: {value}", served
    assert reason_shape("MalformedRow: id is missing") == "MalformedRow: id is missing"
    assert reason_shape("HTTP 500 on GET /v1/notes: Internal") == "HTTP 500 on GET /v1/notes: Internal"
