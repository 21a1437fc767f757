"""Each Pipedrive kind is declared once (`kinds.py`): the entries agree with what their mappers write."""
from __future__ import annotations

from engine_core.providers.pipedrive import kinds
from engine_core.providers.pipedrive.fields import FieldBook


def test_every_listed_kind_maps_into_its_declared_table() -> None:
    row = {"id": 1, "name": "n", "title": "t", "subject": "s", "content": "c", "pipeline_id": 1, "deal_id": 1, "product_id": 1,
           "file_name": "f.pdf",
           "add_time": "2024-01-01T00:00:00Z", "update_time": "2024-01-02T00:00:00Z"}
    for k in kinds.KINDS:
        if k.mapper is None:
            continue
        served = {**row, "id": "6f1a0f3e-8b3c-4a55-9d3e-2f0e5b9c1a7d"} if k.ledger == "leads" else row
        assert k.mapper(served, "t", FieldBook()).table == k.table, k.name


def test_phases_parents_and_ledger_kinds_are_read_from_the_entries() -> None:
    names = [k.name for k in kinds.KINDS]
    assert [n for group in kinds.phases() for n in group] == sorted(names, key=lambda n: kinds.kind(n).phase)
    for k in kinds.KINDS:
        for parent in k.depends_on:
            assert kinds.kind(parent).phase < k.phase, (k.name, parent)
    assert kinds.ledger_kind("deals_archived") == "deals" and kinds.ledger_kind("catchup") == "catchup"
