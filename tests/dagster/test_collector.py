"""`migrate run` imports Dagster with Python's cyclic collector paused (`cli.collector_paused`,
issue 11: ~0.85 s of collections per launch, measured with gc.callbacks); the collector must be on
again afterwards whatever happened, or a long run would never collect its cycles."""
from __future__ import annotations

import gc

import pytest

from migration_pipeline import cli
import migration_pipeline.cli.launching
import migration_pipeline.cli.main


@pytest.fixture(autouse=True)
def _collector_restored():
    was_on = gc.isenabled()
    yield
    gc.unfreeze()
    if was_on:
        gc.enable()


def test_off_inside_on_after_with_what_was_made_frozen():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with cli.launching.collector_paused():
        assert not gc.isenabled()
        made = [[i] for i in range(1000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() >= frozen + len(made)


def test_on_again_after_an_error_and_nested_blocks_leave_it_to_the_outer_one():
    with pytest.raises(RuntimeError):
        with cli.launching.collector_paused():
            raise RuntimeError("boom")
    assert gc.isenabled()
    with cli.launching.collector_paused():
        with cli.launching.collector_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_launch_refused_before_dagster_leaves_the_collector_on():
    from engine_core.errors import ConfigError

    with pytest.raises(ConfigError, match="not a valid tenant name"):
        cli.launching.launch_through_dagster("not a tenant!", "pipedrive", {"resources": {}}, as_json=True)
    assert gc.isenabled()


def test_engine_commands_do_not_import_dagster(db_url):
    """`migrate status` (and the other engine commands) import no Dagster: the command group's error
    handling imported the launch module, hence Dagster (~2 s), for every command, and outside the
    paused collector for `migrate run` (two full collections of ~0.1-0.17 s each, gc.callbacks)."""
    import os
    import subprocess
    import sys

    from migration_pipeline.instance import to_url

    script = ("import sys\nfrom click.testing import CliRunner\nfrom migration_pipeline.cli.main import main\n"
              "r = CliRunner().invoke(main, ['status'])\nprint(r.exit_code, 'dagster' in sys.modules)\nprint(r.output, file=sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MIGRATE_", "DAGSTER_"))}
    env["DATABASE_URL"] = to_url(db_url)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0", "False"], out.stdout + out.stderr[-2000:]


def test_a_launch_error_is_still_one_line_from_any_command():
    import click
    from click.testing import CliRunner

    from migration_pipeline import launch
    import migration_pipeline.launch.checks

    @click.group(cls=cli.main._Commands)
    def group() -> None:
        pass

    @group.command("refused")
    def refused() -> None:
        raise launch.checks.LaunchError("the daemon serving this instance reads another source")

    r = CliRunner().invoke(group, ["refused"])
    assert r.exit_code == 2 and r.output.strip() == "error: the daemon serving this instance reads another source", r.output
