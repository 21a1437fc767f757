"""`migrate verify` on a tenant whose source served rows without a readable id - one with an id
that is not one ("abc"), one with none - proves each such row on its own: the source's count holds
every row it served, each unreadable row is listed under the key its run kept it by
(`mapping.unreadable_key`) and matched to that record, and the kind's detail line says how many
there are and where they are listed. Reconciled row by row with the sandbox's truth."""
from __future__ import annotations

from engine_core.providers.pipedrive.mapping import unreadable_key
from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify
from pipedrive_sandbox.data import dataset_for
from tests.pipedrive.support import FAST, failed_tasks, migrate, sandbox

SEED, RATE = 2, 0.15  # persons: one row served with id "abc", two without an id; activities: three "abc"
UNREADABLE = ("missing_id", "id_string")


def test_verify_accounts_for_every_row_without_a_readable_id(db) -> None:
    with sandbox(seed=SEED, faults=f"badrow:{RATE},503:0.02") as sb:
        truth = sb.truth()
        run = migrate(db, sb, "acme")
        assert run.status == "succeeded", failed_tasks(db, run.id)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), "acme", FAST)
    ds = dataset_for("tiny", SEED, None)
    kinds = {k.kind: k for k in proof.kinds}
    lines = proof.lines()
    for kind in ("persons", "activities"):
        k = kinds[kind]
        bad = [r for r in truth["malformed_rows"][kind] if r["variant"] in UNREADABLE]
        assert len(bad) >= 2, "the seed serves several rows without a readable id"
        # every row the source serves is counted once: the truth's rows, readable or not
        assert k.source == len(truth["ids"][kind]), k.as_dict()
        # row by row: each unreadable row under its own key, the one its run kept it by
        keys = sorted((unreadable_key(ds.record(kind, r["position"], RATE)) for r in bad), key=lambda s: (len(s), s))
        assert len(set(keys)) == len(bad), keys
        assert k.not_ids == keys and set(keys) <= set(k.unwritten_ids), k.as_dict()
        rows = db.sql("SELECT raw_key FROM migration_unreadable WHERE tenant_id = 'acme' AND kind = %(k)s", {"k": kind})
        assert sorted((r["raw_key"] for r in rows), key=lambda s: (len(s), s)) == keys
        # the readable rows: listed by their ids, none missing, the ledger's with the product's
        readable = {str(i) for i in truth["ids"][kind]} - {str(r["id"]) for r in bad}
        assert not k.missing and not k.extra, k.as_dict()
        assert k.product + k.unwritten == k.source, k.as_dict()
        assert len(readable) == k.source - len(bad)
        i = next(n for n, ln in enumerate(lines) if ln.startswith(f"{kind}: "))
        said = []
        for ln in lines[i + 1:]:  # the kind's own detail lines
            if not ln.startswith("  "):
                break
            said.append(ln)
        assert any(ln.startswith(f"  without a readable id {len(bad)}: ") and f"`migrate rows acme --kind {kind}" in ln
                   for ln in said), said
