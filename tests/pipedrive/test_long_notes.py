"""A note of 1,500,000+ characters (HTML with an inline base64 image: Pipedrive allowed notes of
about 3,000,000 characters for years) is kept whole, reconciled with the sandbox's `long_notes`."""
from __future__ import annotations

from tests.pipedrive.support import failed_tasks, migrate, product_row, sandbox

TENANT = "acme"


def test_a_note_of_a_million_and_a_half_characters_is_kept_whole(db) -> None:
    with sandbox(long_notes=2) as sb:
        truth = sb.truth(kind="long_notes")["long_notes"]
        run = migrate(db, sb, TENANT, kinds=["users", "pipelines", "stages", "organizations", "persons", "deals",
                                            "deals_archived", "leads", "leads_archived", "notes"])
        rows = sb.truth_rows("notes")
    assert run.status == "succeeded", failed_tasks(db, run.id)
    assert len(truth) == 2 and all(n["length"] >= 1_500_000 for n in truth)
    for n in truth:
        note = product_row(db, "notes", n["id"])
        assert note["content"] == rows[str(n["id"])]["content"] and len(note["content"]) == n["length"]
        assert (note["content_truncated"], note["content_original_length"]) == (False, None)
