"""A fresh user's finds at the command line, each pinned at the level it lives (no launch):

* a relaunch that joins, retries or resumes an existing run says, in one line on stderr, that the
  --options (--kinds, --dry-run) it was given are ignored: the run keeps what it started with;
"""
from __future__ import annotations

from engine_core import db as dbmod
from engine_core import runs
from engine_core.providers.base import provider_for
from migration_pipeline.cli import ignored_on_relaunch
from migration_pipeline.launch import new_run_config

EXAMPLE = {"page_size": 20, "counts": {"companies": 10, "contacts": 10, "deals": 5, "activities": 5, "notes": 5}}


def _cfg(**kw) -> dict:
    return new_run_config(**kw)["resources"]["new_run"]["config"]


def test_options_given_to_a_relaunch_of_an_existing_run_are_said_to_be_ignored(db_url):
    with dbmod.Database(db_url, max_size=4) as db:
        assert ignored_on_relaunch(db, "t1", "example", _cfg(options={"page_size": 5})) is None  # a new run: used
        run = runs.start_run(db, provider_for("example"), "t1", options=EXAMPLE)
        line = ignored_on_relaunch(db, "t1", "example", _cfg(options={"page_size": 5}))
        assert line is not None and "\n" not in line
        assert line.startswith("note: --options ignored: this launch joins the running run #")
        assert '"page_size": 20' in line  # the options it keeps
        assert ignored_on_relaunch(db, "t1", "example", _cfg()) is None  # nothing given, nothing to say
        runs.stop(db, run.id)
        line = ignored_on_relaunch(db, "t1", "example", _cfg(kinds=["notes"], dry_run=True))
        assert "--kinds and --dry-run ignored: this launch resumes the stopped run #" in line
