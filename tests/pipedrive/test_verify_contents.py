"""`migrate verify` of file contents on a faulty source: a download broken off (the sandbox's
`badjson` cuts a download's stream at half with a clean end) is asked again and checked against
the listed `file_size`, as the migration's own download is, so verify proves stored contents
equal and names no file stale because a body came short."""
from __future__ import annotations

from engine_core.providers.pipedrive.provider import PipedriveProvider
from engine_core.verify import verify

from .support import FAST, failed_tasks, migrate, sandbox

TENANT = "acme"
LIMIT = 1_000_000  # MIGRATE_FILE_MAX_BYTES: the tiny account has files above and below it


def test_verify_of_file_contents_under_cut_downloads_finds_no_stale_content(db, monkeypatch) -> None:
    monkeypatch.setenv("MIGRATE_FILE_MAX_BYTES", str(LIMIT))
    with sandbox() as sb:
        run = migrate(db, sb, TENANT, kinds=["+file_contents"])
        assert run.status == "succeeded", failed_tasks(db, run.id)
        sb.configure(faults="badjson:0.25")
        sb.reset_stats()
        proof = verify(db, PipedriveProvider(base_url=sb.base_url), TENANT, FAST, kinds=["file_contents"])
        cut = sb.stats()["faults"]
    assert cut.get("badjson"), "the sandbox broke some requests off"
    (kind,) = proof.kinds
    assert kind.checked and not kind.stale, proof.lines()
    assert proof.passed, proof.lines()
