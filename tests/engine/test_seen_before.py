"""What a listed row the ledger already has needs before anything is fetched for it
(`sighting.seen_before`, the rule mail's tasks ask before a body costs a request): a window for a new
row, a placeholder or a newer version; nothing for a row this run recorded in a committed window
(unless revisited, or a placeholder taken over); a count without a write for a written one."""
from __future__ import annotations

import pytest

from engine_core.models import Run
from engine_core.sighting import RECORDED, seen_before

RUN = Run(id=7, tenant_id="t", source="s", source_account="a", status="running", current_phase=0,
          plan=(("emails",),), options={}, dry_run=False, cancel_requested=False)

V1, V2 = "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"


@pytest.mark.parametrize("state, held, version, kw, expected", [
    (None, None, V1, {}, None),  # not in the ledger: a window
    ({"migration_id": 3, "action": "created"}, V1, V1, {}, "already_here"),  # another run wrote it
    ({"migration_id": 3, "action": "created"}, V1, V2, {}, None),  # a newer version: fetched and updated
    ({"migration_id": 3, "action": "created"}, None, V2, {}, "already_here"),  # written before versions
    ({"migration_id": 3, "action": "skipped"}, None, V1, {}, None),  # another run's placeholder
    ({"migration_id": 7, "action": "created"}, V1, V1, {}, RECORDED),  # this run, committed
    ({"migration_id": 7, "action": "skipped"}, None, V1, {}, RECORDED),
    ({"migration_id": 7, "action": "skipped"}, None, V1, {"retake": True}, None),  # a catch-up takes it over
    ({"migration_id": 7, "action": "created"}, V1, V1, {"revisit": True}, "imported"),  # a retry's fresh counts
    ({"migration_id": 7, "action": "matched"}, V1, V1, {"revisit": True}, "matched"),
    ({"migration_id": 7, "action": "failed"}, None, V1, {"revisit": True}, None),
])
def test_seen_before(state, held, version, kw, expected):
    assert seen_before(RUN, state, held, version, **kw) == expected
