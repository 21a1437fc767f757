"""The kinds the docs list for `--kinds` are the provider's: a kind added to `kinds.KINDS` and not to
docs/commands.md and docs/configuration.md leaves a user unable to find it there."""
from __future__ import annotations

import re
from pathlib import Path

from engine_core.providers.pipedrive.kinds import KINDS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _listed(path: Path) -> set[str]:
    """The words of every backticked span of the file (spans may run over lines)."""
    words: set[str] = set()
    for span in path.read_text().split("`")[1::2]:
        if re.fullmatch(r"[a-z_\s]+", span):
            words.update(span.split())
    return words


def test_the_docs_list_every_kind_a_run_takes() -> None:
    kinds = {k.name for k in KINDS}
    for doc in ("commands.md", "configuration.md"):
        missing = kinds - _listed(DOCS / doc)
        assert not missing, f"docs/{doc} does not list {sorted(missing)}"
