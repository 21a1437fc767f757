"""What the benches share: the database server and fresh databases on it, the sandbox, interleaved
repetitions with medians, and the closing block of ratios every bench prints last.

The server is DATABASE_URL's when set (e.g. this machine's PostgreSQL 15 service,
postgresql://postgres@127.0.0.1:5432/postgres), else the embedded one under MIGRATE_HOME. A bench
works in databases of its own (`bench_<name>_<pid>...`), created from a template that holds the
engine's schema and dropped at the end: a running Dagster instance's sensors never see them.
"""
from __future__ import annotations

import os
import signal
import statistics as stats
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine_core import db as dbmod  # noqa: E402

TOKEN = "bench-token-" + uuid.uuid4().hex[:12]

# A terminated bench still drops its databases and stops its sandbox (its `finally` blocks run).
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def server_url() -> str:
    """A URL to the server's maintenance database (DATABASE_URL's server, or the embedded one)."""
    url = os.environ.get("DATABASE_URL", "").strip() or dbmod.embedded_url(database="postgres")
    return with_dbname(url, "postgres")


def with_dbname(url: str, name: str) -> str:
    params = conninfo.conninfo_to_dict(url)
    params["dbname"] = name
    return conninfo.make_conninfo(**params)


def server_facts(url: str) -> str:
    """One line: the server's version and whether its autovacuum is on (the benches say so)."""
    with psycopg.connect(url, autocommit=True) as c:
        version = c.execute("SHOW server_version").fetchone()[0]
        autovacuum = c.execute("SHOW autovacuum").fetchone()[0]
    return f"PostgreSQL {version.split()[0]}, autovacuum {autovacuum}, {dbmod.redact(url)}"


# A tree's own schema applied by its own code (`Databases(tree=...)`).
_APPLY_SCHEMA = """
import sys
sys.path.insert(0, sys.argv[1])
from engine_core import db
db.apply_schema(sys.argv[2])
"""


class Databases:
    """Fresh databases with the engine's schema on one server: `new()` is a CREATE DATABASE ...
    TEMPLATE (a fraction of a second), `close()` drops every one made."""

    def __init__(self, label: str, url: str | None = None, tree: Path | None = None) -> None:
        """`tree`: another checkout of this project whose own migrations make the template's schema
        (applied by its code in a child process: `--against` runs that tree's engine on its schema);
        None: this tree's."""
        self.server = url or server_url()
        self.prefix = f"bench_{label}_{os.getpid()}"
        self.template = f"{self.prefix}_template"
        self.made: list[str] = []
        with psycopg.connect(self.server, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
            c.execute(f'CREATE DATABASE "{self.template}"')
        template_url = with_dbname(self.server, self.template)
        if tree is None:
            dbmod.apply_schema(template_url)
        else:
            subprocess.run([sys.executable, "-c", _APPLY_SCHEMA, str(tree), template_url], cwd=tree, check=True)

    def new(self, *, autovacuum: bool = True) -> str:
        """A URL to a new database; `autovacuum=False` switches autovacuum off for each of its tables
        (what a server with autovacuum off does to every table, whatever the server says)."""
        name = f"{self.prefix}_{len(self.made)}"
        with psycopg.connect(self.server, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        self.made.append(name)
        url = with_dbname(self.server, name)
        if not autovacuum:
            with psycopg.connect(url, autocommit=True) as c:
                tables = c.execute("SELECT format('%I.%I', schemaname, relname) FROM pg_stat_user_tables").fetchall()
                for (t,) in tables:
                    c.execute(f"ALTER TABLE {t} SET (autovacuum_enabled = false)")
        return url

    def close(self) -> None:
        with psycopg.connect(self.server, autocommit=True) as c:
            for name in [*self.made, self.template]:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Sandbox:
    """The sandbox's own endpoints (`/_sandbox/...`), over HTTP."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.http = httpx.Client(base_url=base_url, timeout=120)

    def stats(self) -> dict[str, Any]:
        return self.http.get("/_sandbox/stats").json()

    def reset(self) -> None:
        self.http.post("/_sandbox/stats/reset").raise_for_status()

    def configure(self, **changes: Any) -> None:
        self.http.post("/_sandbox/config", json=changes).raise_for_status()

    def truth(self, kind: str | None = None) -> dict[str, Any]:
        return self.http.get("/_sandbox/truth", params={"kind": kind} if kind else None).json()

    def list_v2(self, path: str, limit: int, **params: Any) -> list[dict[str, Any]]:
        """The first `limit` rows of a v2 cursor listing, in pages of 500."""
        rows: list[dict[str, Any]] = []
        cursor = None
        while len(rows) < limit:
            q = {"limit": 500, **params, **({"cursor": cursor} if cursor else {})}
            body = self.http.get(path, params=q, headers={"x-api-token": TOKEN}).json()
            rows.extend(body.get("data") or [])
            cursor = (body.get("additional_data") or {}).get("next_cursor")
            if not cursor:
                break
        return rows[:limit]


@contextmanager
def sandbox(scale: str = "small", **options: Any) -> Iterator[Sandbox]:
    """A sandbox in a subprocess (its own interpreter: its event loop shares no GIL with the engine)."""
    from pipedrive_sandbox.config import SandboxConfig
    from pipedrive_sandbox.server import start_subprocess

    config = SandboxConfig(scale=scale, seed=1, token=TOKEN, **options)
    proc, base_url = start_subprocess(config)
    try:
        yield Sandbox(base_url)
    finally:
        proc.terminate()
        proc.wait(10)


def interleave(variants: Sequence[str], reps: int, run: Callable[[str, int], float]) -> dict[str, list[float]]:
    """Run each variant `reps` times, rotating the order every round (A B C, B C A, ...) so drift
    in the machine's load falls on every variant alike; returns the measurements per variant."""
    out: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(reps):
        order = list(variants[r % len(variants):]) + list(variants[: r % len(variants)])
        for v in order:
            value = run(v, r)
            out[v].append(value)
            print(f"  round {r + 1}: {v:<32} {value:10.1f}", flush=True)
    return out


def median(values: Sequence[float]) -> float:
    return stats.median(values) if values else float("nan")


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def load_line() -> str:
    """The machine's load while the bench ran (other sessions share the two cores)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min) {five:.1f} (5 min) on {os.cpu_count()} cores"


def print_ratios(title: str, lines: Sequence[tuple[str, float, str]]) -> None:
    """The closing block, printed last: `name  value  note` per line."""
    print(f"\nRATIOS {title} ({load_line()})")
    for name, value, note in lines:
        print(f"  {name:<46} {value:8.2f}   {note}")
    sys.stdout.flush()


class Timer:
    def __init__(self) -> None:
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started
