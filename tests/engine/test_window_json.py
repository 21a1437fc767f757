"""The engine's CPU: a window's new rows go to Postgres as orjson's JSON
(`ledger.rows_json`), which Postgres must read exactly as it read the standard library's ASCII
JSON before - non-ASCII, NUL, floats, times, decimals - and a value orjson cannot write (an integer
beyond 64 bits, say in a custom field) must still be written by the window, through the standard
library. A NaN the Pipedrive client read (`decode.NonFinite`) is written `NaN` as before (refused
by Postgres: the window goes per row), not as orjson's null.

The oracle is the encoding before orjson (`json.dumps(rows, ensure_ascii=True, default=str)`):
the same rows give the same product rows, ledger and counts with either encoder.
"""
from __future__ import annotations

import json
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from engine_core import db as dbmod
from engine_core import ledger, write
from engine_core.context import TaskContext
from engine_core.models import Run, Task
from engine_core.providers.pipedrive import client, decode
from engine_core.providers.pipedrive.fields import FieldBook
from engine_core.providers.pipedrive.mappers import map_deal
from engine_core.rows import Mapped
from engine_core.runlog import RunLog
from tests.engine.support import FAST

SOURCE = "test"
WORKER = "test-window-json"
BIG = 2**70 + 1  # beyond 64 bits: orjson refuses it
TEXTS = ["Zoë Ça va", "東京 📞 \u2028 \u00a0", "quote \" back \\ slash / tab\t nl\n", "\x7f\x01 control", "🦄" * 3]


def before(rows: Any) -> str:
    """The window rows' JSON before orjson (ASCII JSON)."""
    return json.dumps(rows, ensure_ascii=True, default=str)


def _run(db: dbmod.Database, tenant: str) -> Run:
    row = db.sql("INSERT INTO migrations (tenant_id, source, source_account, plan) VALUES (%(t)s, %(s)s, 'acct',"
                 " '[[\"organizations\", \"deals\"]]'::jsonb) RETURNING *", {"t": tenant, "s": SOURCE})[0]
    return Run.from_row(row)


def _context(db: dbmod.Database, run: Run, kind: str, key: str = "0") -> TaskContext:
    row = db.sql(
        "INSERT INTO migration_tasks (migration_id, phase, kind, cursor_key, cursor, status, locked_by, locked_at)"
        " VALUES (%(r)s, 0, %(k)s, %(key)s, '{}'::jsonb, 'running', %(w)s, now()) RETURNING *",
        {"r": run.id, "k": kind, "key": f"{kind}:{key}", "w": WORKER})[0]
    return TaskContext(db=db, run=run, task=Task.from_row(row), worker=WORKER, settings=FAST, log=RunLog(run.id, row["id"]))


def _company(tenant: str):
    def mapper(r: dict[str, Any]) -> Mapped:
        values = {"tenant_id": tenant, "source": SOURCE, "source_id": str(r["id"]), "name": r["name"],
                  "custom_fields": r.get("custom"), "address": r.get("address"),
                  "source_created_at": r.get("at"), "source_updated_at": r.get("at")}
        return Mapped("companies", str(r["id"]), values, version="1")
    return mapper


def _snapshot(db: dbmod.Database, tenant: str) -> tuple[list, list, list]:
    """The tenant's ledger and product rows, ids and times of writing aside."""
    entries = db.sql("SELECT kind, source_id, action, reason, source_version FROM migration_records"
                     " WHERE tenant_id = %(t)s ORDER BY kind, source_id", {"t": tenant})
    companies = db.sql("SELECT source_id, to_jsonb(c) - 'id' - 'tenant_id' - 'created_at' - 'updated_at' AS v"
                       " FROM crm.companies c WHERE tenant_id = %(t)s ORDER BY source_id", {"t": tenant})
    deals = db.sql("SELECT source_id, value::text AS value, to_jsonb(d) - 'id' - 'tenant_id' - 'created_at' - 'updated_at'"
                   " - 'value' AS v FROM crm.deals d WHERE tenant_id = %(t)s ORDER BY source_id", {"t": tenant})
    return entries, companies, deals


@pytest.fixture
def claims(monkeypatch) -> list[tuple[set[str] | None, BaseException | None]]:
    """Every window claim with new rows: what it claimed, or what it raised (then the window went per row)."""
    seen: list[tuple[set[str] | None, BaseException | None]] = []
    real = ledger.claim_window

    def spy(tx, run, kind, mine, new_rows=None):
        if new_rows is None:
            return real(tx, run, kind, mine, new_rows)
        try:
            won = real(tx, run, kind, mine, new_rows)
        except BaseException as e:
            seen.append((None, e))
            raise
        seen.append((won, None))
        return won

    monkeypatch.setattr(ledger, "claim_window", spy)
    return seen


# --- what Postgres reads ---------------------------------------------------------------------


def _read(db: dbmod.Database, text: str) -> list[dict[str, Any]]:
    return db.sql("SELECT to_jsonb(r) - 'id' AS v FROM json_populate_recordset(NULL::crm.deals, %(rows)s::json) AS r",
                  {"rows": text})


def test_postgres_reads_orjsons_rows_as_it_read_the_ascii_json(db) -> None:
    when = datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    rows = [
        {"source_id": str(i), "title": t, "value": v, "currency": "EUR", "probability": p,
         "closed_at": when, "won_at": datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc), "lost_at": None,
         "expected_close_date": date(2024, 12, 31), "archived": i % 2 == 0,
         "label_ids": [i, "é", None, 1.5], "origin": Decimal("12.3400") if i == 1 else None,
         "custom_fields": {"k": {"name": t, "value": v, "when": when, "at": time(9, 30), "deep": [[{"x": t}]],
                                 "big": 2**63 - 1, "small": -(2**63), "tiny": 1e-7, "huge": 1.7976931348623157e308}}}
        for i, (t, v, p) in enumerate(zip(TEXTS, [0.1, 1e16, -0.0, 123456789.0, 3], [0.5, 1e-7, 100, None, 2.5e-310]))
    ]
    new = ledger.rows_json(rows)
    assert new != before(rows)  # premise: orjson's text differs (raw UTF-8, shorter floats) ...
    assert _read(db, new) == _read(db, before(rows))  # ... and reads the same, value by value
    assert _read(db, new)[1]["v"]["title"] == TEXTS[1]


def test_nul_is_refused_as_before(db_url) -> None:
    # Postgres text and jsonb cannot hold NUL: both encodings send \u0000, and both are refused alike
    for value in ({"title": "a\x00b"}, {"custom_fields": {"k\x00": 1}}):
        rows = [{"source_id": "1", "title": "t", **value}]
        errors = []
        for text in (ledger.rows_json(rows), before(rows)):
            with pytest.raises(psycopg.errors.UntranslatableCharacter) as e:
                with psycopg.connect(db_url) as conn:
                    conn.execute("SELECT * FROM json_populate_recordset(NULL::crm.deals, %s::json)", [text]).fetchall()
            errors.append(str(e.value).splitlines()[0])
        assert errors[0] == errors[1]


@pytest.mark.parametrize("value", [BIG, -(2**63) - 1, 2**64, {1: "int key"}, "lone \ud800 surrogate"])
def test_a_value_orjson_refuses_is_written_by_the_standard_library(value) -> None:
    rows = [{"source_id": "1", "custom_fields": {"k": value}}]
    assert ledger.rows_json(rows) == before(rows)


def test_a_nonfinite_float_the_client_read_is_written_as_before() -> None:
    rows = [{"source_id": "1", "value": decode.NonFinite("nan"), "custom_fields": {"k": decode.NonFinite("-inf")}}]
    assert ledger.rows_json(rows) == before(rows) == '[{"source_id": "1", "value": NaN, "custom_fields": {"k": -Infinity}}]'


@pytest.mark.parametrize("values, as_text", [
    (["1", "2", None, ""], True), (['a"b', "c\\d", 'e\\"f', "NULL", "null", "{x}", "a,b", " sp ", *TEXTS[:2]], True),
    (["a\nb", "\x01", "tab\t", "\\\n"], False), ([1, -2, None, 2**63 - 1], True), ([], True), (["lone \ud800"], False)])
def test_an_array_parameter_reads_as_the_list_did(db_url, values, as_text) -> None:
    # `ledger.array`: a page's id arrays sent as the array's text; a value orjson escapes otherwise
    # than an array would read it (a control character), or refuses, goes as the list, as before
    param = ledger.array(values)
    assert isinstance(param, str) == as_text
    cast = "bigint[]" if values and isinstance(values[0], int) else "text[]"
    got = []
    for sent in (param, list(values)):
        with psycopg.connect(db_url) as conn:
            try:
                got.append(conn.execute(f"SELECT %s::{cast}", [sent]).fetchone()[0])
            except (psycopg.Error, UnicodeEncodeError) as e:
                got.append(type(e).__name__)
    assert got[0] == got[1]
    assert as_text is False or got[0] == values


# --- a window ---------------------------------------------------------------------------------


def _write_companies(db: dbmod.Database, tenant: str, *pages: list[dict[str, Any]]) -> list[Any]:
    run = _run(db, tenant)
    return [write.write_page(_context(db, run, "organizations", str(i)), rows, _company(tenant))
            for i, rows in enumerate(pages)]


def test_an_integer_beyond_64_bits_in_a_custom_field_is_written_by_the_window(db, claims) -> None:
    rows = [{"id": 1, "name": "Acme", "custom": {"f": {"name": "Big", "type": "double", "value": BIG}}},
            {"id": 2, "name": "Other", "custom": {"f": {"name": "Big", "type": "double", "value": -BIG}}, "address": {"z": 2**64}}]
    [result] = _write_companies(db, "acme", rows)
    assert result.outcomes == {"imported": 2}
    assert [(won, type(e).__name__ if e else None) for won, e in claims] == [({"1", "2"}, None)], "the window wrote them"
    got = db.sql("SELECT source_id, custom_fields #>> '{f,value}' AS big, address ->> 'z' AS z FROM crm.companies ORDER BY source_id")
    assert [(r["source_id"], r["big"], r["z"]) for r in got] == [("1", str(BIG), None), ("2", str(-BIG), str(2**64))]


def test_a_window_with_non_ascii_and_nul_writes_what_it_wrote_before(db, claims, monkeypatch) -> None:
    at = datetime(2024, 5, 6, 7, 8, 9, 101112, tzinfo=timezone.utc)
    texts = [{"id": i, "name": t, "at": at, "custom": {"k": {"name": t, "value": [t, i, 0.1, None]}}, "address": {"line": t}}
             for i, t in enumerate(TEXTS, start=1)]
    nul = [{**r, "id": r["id"] + 10} for r in texts] + [
        # NUL in a jsonb value and in a key (Postgres cannot hold it: each fails alone; a NUL in a
        # name is refused before the JSON, by the match query's parameters)
        {"id": 50, "name": "nul in a key", "at": at, "address": {"li\x00ne": "é"}},
        {"id": 51, "name": "nul in a value", "custom": {"k": {"name": "ü", "value": "a\x00"}}}]
    now = _write_companies(db, "now", texts, nul)
    monkeypatch.setattr(ledger, "rows_json", before)
    then = _write_companies(db, "then", texts, nul)
    assert now == then and [r.outcomes for r in now] == [{"imported": 5}, {"imported": 5, "failed": 2}]
    a, b = _snapshot(db, "now"), _snapshot(db, "then")
    assert a == b and [{r["source_id"]: r["v"]["name"] for r in a[1]}[str(i)] for i in range(1, 6)] == TEXTS
    # the non-ASCII page went in one set-based window; the one with NUL was refused set-based (in its
    # window, then in its windows of 100 and of 25: window.SET_WINDOW_FALLBACK) and written per row
    assert [e is not None for _, e in claims] == [False, True, True, True] * 2
    assert [type(e).__name__ for _, e in claims if e] == ["UntranslatableCharacter"] * 6


def test_a_nan_the_client_read_goes_per_row_as_before(db, claims, monkeypatch) -> None:
    body = (b'{"success": true, "data": [{"id": 7, "title": "NaN deal", "value": NaN, "probability": 50,'
            b' "update_time": "2024-01-02T03:04:05Z"},'
            b' {"id": 8, "title": "Infinite", "value": -Infinity, "update_time": "2024-01-02T03:04:05Z"},'
            b' {"id": 9, "title": "Plain", "value": 1.5, "update_time": "2024-01-02T03:04:05Z"}]}')
    data, _ = decode._decode_json(body)

    def deals(tenant: str) -> Any:
        run = _run(db, tenant)
        return write.write_page(_context(db, run, "deals"), data["data"], lambda r: map_deal(r, tenant, FieldBook()))

    now = deals("now")
    monkeypatch.setattr(ledger, "rows_json", before)
    then = deals("then")
    assert now == then and now.outcomes == {"imported": 3}
    a, b = _snapshot(db, "now"), _snapshot(db, "then")
    assert a == b and [r["value"] for r in a[2]] == ["NaN", "-Infinity", "1.5"]
    assert [e is not None for _, e in claims] == [True] * 6, "refused set-based (NaN: 500, 100, 25 rows), then per row"
