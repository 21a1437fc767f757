"""Deal products, files and file contents are kinds of the run: a whole tiny account's deal lines
reach crm.deal_products and its files crm.files through the ledger (their deal, product, person,
organization and activity linked through it), row by row against the sandbox's truth, and each
file's bytes the file store by sha256 (403, 404 and over the size limit kept as metadata with the
reason); a product removed from a deal and a file replaced at the source are caught up by the next
sync, and `verify` proves the kinds before and after. A dry run lists the lines and writes none."""
from __future__ import annotations

from typing import Any

from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify

from .support import FAST, failed_tasks, history, ledger, live_op, migrate, sandbox, sync

TENANT = "acme"


def lines_held(db) -> dict[str, dict[str, Any]]:
    """The product's live lines: source id -> line with its deal's and product's source ids."""
    rows = db.sql(
        "SELECT l.*, d.source_id AS deal_ref, p.source_id AS product_link FROM crm.deal_products l"
        " JOIN crm.deals d ON d.id = l.deal_id LEFT JOIN crm.products p ON p.id = l.product_id"
        " WHERE l.tenant_id = %(t)s AND l.deleted_at_source IS NULL", {"t": TENANT})
    return {r["source_id"]: r for r in rows}


def reconcile_lines(db, truth: dict[str, list[dict[str, Any]]]) -> None:
    """Every line the source serves now is one live product row with its values, deal and product,
    and the product holds no other live line."""
    want = {str(line["id"]): (deal, line) for deal, served in truth.items() for line in served}
    held = lines_held(db)
    assert set(held) == set(want) != set()
    products = {r["source_id"] for r in db.sql("SELECT source_id FROM crm.products WHERE tenant_id = %(t)s", {"t": TENANT})}
    for sid, (deal, line) in want.items():
        mine = held[sid]
        assert mine["deal_ref"] == deal
        assert (float(mine["quantity"]), float(mine["item_price"]), float(mine["sum"]), mine["order_nr"], mine["currency"]) == (
            line["quantity"], line["item_price"], line["sum"], line["order_nr"], line["currency"]), sid
        assert mine["product_ref"] == str(line["product_id"])
        # the product through the ledger where the source has it; a purged product's line keeps its id
        assert mine["product_link"] == (str(line["product_id"]) if str(line["product_id"]) in products else None), sid


def test_a_run_imports_every_deal_line_and_a_sync_marks_a_removed_one(db) -> None:
    with sandbox() as sb:
        truth = sb.truth("deal_products")["deal_products"]
        sb.reset_stats()
        run = migrate(db, sb, TENANT)
        calls = sb.stats()["requests"].get("/api/v2/deals/products", 0)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["deal_products"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        assert proof.passed and proof.kinds[0].checked, proof.lines()
        reconcile_lines(db, truth)
        deals = len(db.sql("SELECT 1 FROM crm.deals WHERE tenant_id = %(t)s", {"t": TENANT}))
        assert calls == -(-deals // 100), ("one call per 100 deals the ledger holds", calls, deals)

        change = live_op(sb, "product_remove")
        synced = sync(db, sb)
        after = sb.truth("deal_products")["deal_products"]
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["deal_products"])
    assert proof.passed, proof.lines()
    reconcile_lines(db, after)
    entry = ledger(db, TENANT, "deal_products")[str(change["id"])]
    gone = db.sql("SELECT deleted_at_source FROM crm.deal_products WHERE tenant_id = %(t)s AND source_id = %(s)s",
                  {"t": TENANT, "s": str(change["id"])})
    assert entry["action"] == "created" and gone and gone[0]["deleted_at_source"] is not None, (change, gone)
    marked = db.sql("SELECT count(*) AS n FROM migration_record_history h JOIN migration_records r ON r.id = h.record_id"
                    " WHERE h.migration_id = %(r)s AND r.kind = 'deal_products' AND h.action = 'deleted'", {"r": synced.id})
    assert marked[0]["n"] == 1, "exactly the removed line is marked, by the sync"


# --- files: metadata, then (opt-in) every file's bytes --------------------------------------------

LIMIT = 1_000_000  # MIGRATE_FILE_MAX_BYTES for the test: the tiny account has files above and below it
LINKS = (("deal_id", "deals", "deal_id"), ("contact_id", "contacts", "person_id"), ("company_id", "companies", "org_id"),
         ("activity_id", "activities", "activity_id"))
STATUS = {403: "forbidden", 404: "missing"}


def reconcile_files(db, truth: list[dict[str, Any]], store: Any = None) -> None:
    """Every file the source lists is one crm.files row with its metadata and links (through the
    ledger: the parent's product row when the product holds it), and its content as the source
    serves it now: stored under its sha256 (the store's bytes hashed again), or the reason it is
    not (403/404/over the limit) on the row and as a skipped ledger entry of file_contents."""
    import hashlib

    from engine_core.target.files import PostgresFileStore

    rows = {r["source_id"]: r for r in db.sql("SELECT * FROM crm.files WHERE tenant_id = %(t)s", {"t": TENANT})}
    assert sorted(rows, key=int) == [str(f["id"]) for f in truth]
    entries = ledger(db, TENANT, "file_contents")
    for f in truth:
        sid, mine = str(f["id"]), rows[str(f["id"])]
        assert (mine["file_name"], mine["file_size"]) == (f["file_name"], f["file_size"]), sid
        for column, table, field in LINKS:
            want = db.sql(f"SELECT id FROM crm.{table} WHERE tenant_id = %(t)s AND source_id = %(s)s",
                          {"t": TENANT, "s": str(f[field])}) if f[field] is not None else []
            assert mine[column] == (want[0]["id"] if want else None), (sid, column)
        entry = entries[sid]
        if f["download"] == 200 and f["file_size"] <= LIMIT:
            assert (mine["content_status"], mine["content_sha256"]) == ("stored", f["sha256"]), sid
            assert entry["action"] in ("created", "matched") and entry["record_id"] == mine["id"], entry
            with db.transaction() as tx:
                digest = hashlib.sha256(b"".join((store or PostgresFileStore()).read(tx, TENANT, f["sha256"]))).hexdigest()
            assert digest == f["sha256"], sid
        else:
            status = STATUS.get(f["download"], "too_large")
            assert (mine["content_status"], entry["action"]) == (status, "skipped"), (sid, mine["content_status"], entry)
            assert entry["reason"] and ("HTTP" in entry["reason"] or "MIGRATE_FILE_MAX_BYTES" in entry["reason"]), entry
    blobs = [b["sha256"] for b in db.sql("SELECT sha256 FROM crm.file_blobs WHERE tenant_id = %(t)s", {"t": TENANT})]
    held = {r["content_sha256"] for r in rows.values() if r["content_sha256"]}
    # one copy per content, none partial; a replaced file's earlier bytes stay (its history names them)
    assert None not in blobs and len(blobs) == len(set(blobs)) and held <= set(blobs), (len(blobs), len(held))


def downloads(sb) -> int:
    return sum(n for path, n in sb.stats()["requests"].items() if path.endswith("/download"))


def test_a_whole_account_with_file_contents_reconciles_and_a_sync_brings_a_removed_line_and_a_replaced_file(db, monkeypatch) -> None:
    monkeypatch.setenv("MIGRATE_FILE_MAX_BYTES", str(LIMIT))
    with sandbox() as sb:
        truth = sb.truth("files")["files"]
        assert {f["download"] for f in truth} >= {200, 403, 404} and any(f["file_size"] > LIMIT for f in truth)
        sb.reset_stats()
        run = migrate(db, sb, TENANT, kinds=["+file_contents"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        assert downloads(sb) == len(truth), "each file's bytes are asked once"
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["files", "file_contents"])
        assert proof.passed and all(k.checked for k in proof.kinds), proof.lines()
        reconcile_files(db, truth)

        reconcile_lines(db, sb.truth("deal_products")["deal_products"])

        removed = live_op(sb, "product_remove")
        change = live_op(sb, "file_replace")
        sb.reset_stats()
        synced = sync(db, sb)
        replaced = downloads(sb)
        after = sb.truth("files")["files"]
        lines_after = sb.truth("deal_products")["deal_products"]
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST,
                       kinds=["deal_products", "files", "file_contents"])
    assert proof.passed, proof.lines()
    reconcile_files(db, after)
    reconcile_lines(db, lines_after)
    assert str(removed["id"]) not in lines_held(db)
    pending = [f for f in truth if f["download"] == 200 and f["file_size"] > LIMIT]
    assert replaced == 1, ("the sync downloads the replaced file alone", replaced, change)
    assert [h["action"] for h in history(db, synced.id, "file_contents", change["id"])] == ["updated"]
    assert pending, "a file over the limit stays metadata with its reason"


def test_a_run_without_file_contents_keeps_the_metadata_and_downloads_nothing(db) -> None:
    with sandbox() as sb:
        sb.reset_stats()
        run = migrate(db, sb, TENANT, kinds=["files", "deals", "persons", "organizations", "activities", "users"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        assert downloads(sb) == 0 and "file_contents" not in run.kinds
        listed = len(sb.truth("files")["files"])
    statuses = db.sql("SELECT content_status, count(*) AS n FROM crm.files WHERE tenant_id = %(t)s GROUP BY 1", {"t": TENANT})
    assert [(s["content_status"], s["n"]) for s in statuses] == [("pending", listed)]


def test_a_dry_run_lists_every_deal_line_and_writes_none(db) -> None:
    with sandbox() as sb:
        truth = sb.truth("deal_products")["deal_products"]
        run = migrate(db, sb, TENANT, dry_run=True)
    assert run.status == "succeeded", failed_tasks(db, run.id)
    stats = db.sql("SELECT sum(coalesce((stats->>'lines_listed')::int, 0)) AS listed,"
                   " sum(coalesce((stats->>'imported')::int, 0)) AS imported FROM migration_tasks"
                   " WHERE migration_id = %(r)s AND kind = 'deal_products'", {"r": run.id})[0]
    lines = sum(map(len, truth.values()))
    assert (stats["listed"], stats["imported"]) == (lines, lines), "the dry run says it would import every line"
    assert not db.sql("SELECT 1 FROM crm.deal_products") and not ledger(db, TENANT, "deal_products")


def test_a_deal_deleted_at_the_source_takes_its_lines_with_it(db) -> None:
    with sandbox() as sb:
        run = migrate(db, sb, TENANT)
        assert run.status == "succeeded", failed_tasks(db, run.id)
        held = {str(d) for d, lines in sb.truth("deal_products")["deal_products"].items() if lines}
        for _ in range(60):  # the delete op picks its kind by weight: until a deal with lines goes
            change = live_op(sb, "delete")
            if change["kind"] == "deals" and str(change["id"]) in held:
                break
        else:
            raise AssertionError("no deal with lines was deleted")
        sync(db, sb)
        after = sb.truth("deal_products")["deal_products"]
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["deals", "deal_products"])
    assert str(change["id"]) not in after
    assert proof.passed, proof.lines()
    reconcile_lines(db, after)


def test_a_bad_file_store_setting_refuses_the_run_in_one_line_naming_it(db, monkeypatch) -> None:
    import pytest

    from engine_core.errors import ConfigError

    from .support import start

    with sandbox() as sb:
        for name, value in (("MIGRATE_FILE_MAX_BYTES", "10MB"), ("MIGRATE_FILE_STORE", "relative/dir")):
            with monkeypatch.context() as m:
                m.setenv(name, value)
                with pytest.raises(ConfigError, match=name) as refused:
                    start(db, sb, TENANT)
            assert "\n" not in str(refused.value)
    assert not db.sql("SELECT 1 FROM migrations WHERE tenant_id = %(t)s", {"t": TENANT}), "refused before the run exists"


def test_downloads_broken_off_are_asked_again_and_no_cut_content_is_stored(db, monkeypatch, quick_retries) -> None:
    # badjson cuts a download's stream at half with a clean end and no length: only the file's
    # size tells it from the whole file (the listings it breaks are retried by the client)
    monkeypatch.setenv("MIGRATE_FILE_MAX_BYTES", str(LIMIT))
    with sandbox(faults="badjson:0.25") as sb:
        truth = sb.truth("files")["files"]
        run = migrate(db, sb, TENANT, kinds=["+file_contents"])
        cut = sb.stats()["faults"]
    assert run.status == "succeeded", failed_tasks(db, run.id)
    assert cut, "the sandbox broke some requests off"
    reconcile_files(db, truth)


def test_file_contents_run_alone_on_a_migrated_tenant_fetches_every_file_once(db, monkeypatch) -> None:
    monkeypatch.setenv("MIGRATE_FILE_MAX_BYTES", str(LIMIT))
    with sandbox() as sb:
        truth = sb.truth("files")["files"]
        first = migrate(db, sb, TENANT)
        assert first.status == "succeeded" and downloads(sb) == 0, failed_tasks(db, first.id)
        run = migrate(db, sb, TENANT, kinds=["file_contents"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        assert downloads(sb) == len(truth)
    reconcile_files(db, truth)


def test_file_contents_go_to_a_directory_store_when_asked(db, monkeypatch, tmp_path) -> None:
    from engine_core.target.files import DirectoryFileStore

    monkeypatch.setenv("MIGRATE_FILE_MAX_BYTES", str(LIMIT))
    monkeypatch.setenv("MIGRATE_FILE_STORE", str(tmp_path))
    with sandbox() as sb:
        truth = sb.truth("files")["files"]
        run = migrate(db, sb, TENANT, kinds=["+file_contents"])
    assert run.status == "succeeded", failed_tasks(db, run.id)
    reconcile_files(db, truth, DirectoryFileStore(tmp_path))
    assert not db.sql("SELECT 1 FROM crm.file_blob_chunks"), "no bytes in the database"
    kept = {p.name for p in (tmp_path / TENANT).rglob("*") if p.is_file()}
    assert kept == {f["sha256"] for f in truth if f["download"] == 200 and f["file_size"] <= LIMIT}
