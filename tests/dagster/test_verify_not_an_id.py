"""`migrate verify` on a tenant whose source served a row with an id that is not one ("abc") says
so in one line under the kind (the id, that the source's count holds it, that it is kept as
failed), instead of counting it silently as one more source id. Reconciled with the sandbox's
truth of its malformed rows."""
from __future__ import annotations

from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify
from tests.pipedrive.support import FAST, failed_tasks, migrate, sandbox


def test_verify_names_a_served_id_that_is_not_one(db) -> None:
    with sandbox(seed=1, faults="badrow:0.03") as sb:
        truth = sb.truth()
        run = migrate(db, sb, "acme")
        assert run.status == "succeeded", failed_tasks(db, run.id)
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), "acme", FAST)
    served = {kind for kind, rows in truth["malformed_rows"].items() for r in rows if r["variant"] == "id_string"}
    assert served, "the seed serves an id that is not one"
    named = {k.kind: k for k in proof.kinds if k.not_ids}
    assert set(named) == {k for k in served if k in {p.kind for p in proof.kinds}}, (named, served)
    lines = proof.lines()
    for kind, k in named.items():
        assert k.not_ids == ["abc"] and "abc" in k.unwritten_ids, k.as_dict()
        i = next(n for n, ln in enumerate(lines) if ln.startswith(f"{kind}: "))
        said = []
        for ln in lines[i + 1:]:  # the kind's own detail lines
            if not ln.startswith("  "):
                break
            said.append(ln)
        assert any(ln.startswith("  not an id 1: 'abc': served by the source as a row's id") for ln in said), said
