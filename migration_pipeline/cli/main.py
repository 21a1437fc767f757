"""The `migrate` click group: every command registered, and bad input or an unreachable service
ended in one line (exit 2), never a traceback."""
from __future__ import annotations

from typing import Any

import click

from engine_core.config import check_environment
from engine_core.errors import EngineError
from migration_pipeline.cli import control, demo, inspect, plan, preloaded, run
from migration_pipeline.cli.output import JSON_ASKED, fail, lowercase_error
from migration_pipeline.launch.checks import LaunchError


class _Commands(click.Group):
    """Bad input and unreachable services end every command with one line naming the variable or
    value (the engine's ConfigError / DatabaseUnavailable, a refused launch), never a traceback."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        """click's, with a usage error's line beginning "error: " (`lowercase_error`)."""
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.ClickException as e:
            raise lowercase_error(e) from None

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """click's, noting whether the command line holds --json (before any `--`) for an error
        that ends the command before or after the command's own flags are parsed (`output.fail`)."""
        ctx.meta[JSON_ASKED] = "--json" in (args[:args.index("--")] if "--" in args else args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        """Invoke the command; an EngineError or LaunchError becomes one line on stderr and exit 2,
        a usage error's line begins "error: " as those do (`lowercase_error`)."""
        try:
            return super().invoke(ctx)
        except (EngineError, LaunchError) as e:
            fail(e)
        except click.ClickException as e:
            raise lowercase_error(e) from None


@click.group(cls=_Commands)
def main() -> None:
    """Checkpointed CRM migrations: start, watch, stop, retry, explain."""
    check_environment()  # every MIGRATE_* number, before a command (or a code location) reads one


for command in (inspect.status, inspect.report, inspect.explain, inspect.rows_command, control.stop, control.retry,
                control.resume, run.run_cmd, plan.plan_cmd, run.verify_cmd, run.sync_cmd, demo.demo, demo.ui, demo.sandbox,
                demo.dagster_group, demo.db, preloaded.preload_group):
    main.add_command(command)
