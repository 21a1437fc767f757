"""`migrate preload status` and `migrate preload stop`: this user's pre-loaded launchers
(`migration_pipeline.preload`), which a `migrate run`/`sync` typed at a terminal starts and which
exit after MIGRATE_PRELOAD_IDLE_SECONDS without a command."""
from __future__ import annotations

import os
import signal
import time

import click

from migration_pipeline import preload


@click.group("preload")
def preload_group() -> None:
    """This user's pre-loaded launchers for `migrate run` and `sync` (MIGRATE_PRELOAD)."""


@preload_group.command("status")
def status_cmd() -> None:
    """Whether the launcher is on for commands typed here, and each running launcher: its pid, when
    it started, the commands it runs now and whether it serves this shell's environment."""
    value = os.environ.get(preload.ENABLE_ENV, "").strip()
    if value:
        mode = "on" if preload.enabled(["migrate", "run"], interactive=False) else "off"
        click.echo(f"launcher {mode} ({preload.ENABLE_ENV}={value})")
    else:
        where = "typed at a terminal" if preload.at_terminal() else "typed at a terminal (this one is not)"
        click.echo(f"launcher on for `migrate run`/`sync` {where} ({preload.ENABLE_ENV} unset)")
    found = preload.servers()
    if not found:
        click.echo("no launcher running")
        return
    here = f"{preload.server_key()}.sock"
    for pid, sock in found:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(sock.with_suffix(".pid").stat().st_mtime))
        running = len(preload.children_of(pid))
        serves = "; serves this shell" if sock.name == here else ""
        click.echo(f"pid {pid}: started {started}, {running} command{'' if running == 1 else 's'} running{serves}")


@preload_group.command("stop")
def stop_cmd() -> None:
    """Stop this user's launchers (SIGTERM). Commands they are running go on to their end."""
    found = preload.servers()
    for pid, _ in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    n = len(found)
    click.echo(f"stopped {n} launcher{'' if n == 1 else 's'}" + ("; the commands they ran go on" if n else ""))

