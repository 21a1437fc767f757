"""A pre-loaded launcher for `migrate run` and `migrate sync`: a process that has imported the
third-party modules a launch needs forks one child per command, and the child runs the command with
the caller's argv, environment, working directory, umask and terminal.

When: MIGRATE_PRELOAD=1 always, =0 never; unset, for a command typed at a terminal (stdin and
stderr are terminals) - the model of Gradle's daemon, on by default for people at a prompt, and of
its advice to leave it off in CI and services: scripts, services, CI and the test suite (pipes, no
terminal) run every command in its own process as before. The first command at a terminal runs
without it and starts the server, saying so in one line on stderr; `migrate preload status|stop`
shows and ends this user's servers.

Why: a launch imports Dagster, dagster-postgres, SQLAlchemy, psycopg, httpx and rich - ~1.0 of the
~1.1 CPU-s its imports cost (fresh interpreters, 4 runs); the project's own modules are ~0.1. Forked
from a process that holds them, a small `migrate run --kinds users` reached its first task 0.3-1.2 s
sooner (median 0.7 s, 6 interleaved pairs, load 9).

What keeps it safe:
* The server imports only third-party modules (and `alembic_later`, stdlib only): the project's own
  code loads fresh in each child, so an edited or checked-out tree is what runs. The server's socket
  name is a hash of what those imports depend on (`server_key`): the interpreter, sys.path and each
  entry's mtime (a package installed or removed), the environment less the variables the project
  reads per command (PER_COMMAND), and this module's own source. Anything else starts a new server.
  The key also holds what a forked child inherits from the server rather than from its caller
  (`_inherited`): the control group (a service's command never runs in another unit's cgroup, where
  stopping that unit would kill it), resource limits, niceness, CPU affinity, user and groups.
* The client hands over only once the child says it runs (`STARTED`, sent by the child itself): no
  answer, and the command runs in the caller's process as without the launcher - never twice. The
  child sends its exit code itself too, so a command goes on to its own end and exit code when its
  server is stopped meanwhile (`migrate preload stop`); only a child killed by a signal after its
  server is gone ends with exit code 1 and a line saying its code is unknown.
* The child is the command: its pid is the worker's, it starts the daemon it may start (holding the
  daemon lock), it stops what it started on SIGINT/SIGTERM/SIGHUP, which the client forwards. A
  Ctrl-Z (SIGTSTP) stops the child (SIGSTOP: the kernel discards SIGTSTP sent to the server's
  orphaned process group) and then the client; SIGCONT (`fg`, `bg`) continues both. When
  the client is gone (SIGKILL, a closed terminal), the child kills itself with SIGKILL at once,
  as the command would have died: the engine run keeps its checkpoints and a rerun resumes it.
* The socket lives in a directory only this user may enter (0700, checked before use); a server
  exits after IDLE_SECONDS without a command, and a missing or dead one is started again by the next
  command (which itself runs without it).
"""
from __future__ import annotations

import array
import gc
import hashlib
import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any, NoReturn

ENABLE_ENV = "MIGRATE_PRELOAD"  # 1/true/yes/on, 0/false/no/off, unset: at a terminal (engine_core.config checks it)
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
COMMANDS = ("run", "sync")  # the launching commands: the ones that import Dagster
# Variables read per command by the project's own modules (which load fresh in the child), or
# describing the shell: left out of the server's key. Third-party modules may read any other
# variable when imported, so every other one is in the key.
PER_COMMAND = ("MIGRATE_", "PIPEDRIVE_", "DATABASE_URL", "DAGSTER_HOME", "PWD", "OLDPWD", "SHLVL", "_", "COLUMNS",
               "LINES", "TERM", "SSH_", "PYTHONPROFILEIMPORTTIME")
IDLE_SECONDS = 900.0
CONNECT_SECONDS = 5.0  # the longest a client waits for the server to start the child
STARTING_SECONDS = 60.0  # a server being started (its marker file younger than this) is not started again
IDLE_ENV = "MIGRATE_PRELOAD_IDLE_SECONDS"
MAX_SOCKET_PATH = 100  # a Unix socket's path fits in 108 bytes (sun_path): a longer TMPDIR means no launcher
STARTED = b"S"  # the child, to the client: it is ready (and its pid)
GO = b"G"  # the client, to the child: run the command (the client has committed to following it)
EXIT = b"E"
PRELOADED = ("click", "rich.console", "rich.progress", "psycopg", "psycopg_pool", "httpx", "yaml", "psycopg2",
             "sqlalchemy", "dagster", "dagster_postgres")
STORAGE_MODULES = ("dagster_postgres.event_log", "dagster_postgres.run_storage", "dagster_postgres.schedule_storage")


_in_child = False  # this process is a server's child: it runs the command itself
_client: socket.socket | None = None  # in a child: the connection to the client that follows it


def enabled(argv: list[str], env: dict[str, str] | None = None, interactive: bool | None = None) -> bool:
    """Whether this command goes through the launcher: a launching command (COMMANDS), not already
    in a launcher's child, and MIGRATE_PRELOAD on - or unset and the command `interactive` (default:
    stdin and stderr are terminals). A value that is neither on nor off is not on: the command runs
    here and `engine_core.config.check_environment` refuses it, naming the variable."""
    env = os.environ if env is None else env
    if _in_child or len(argv) < 2 or argv[1] not in COMMANDS:
        return False
    value = env.get(ENABLE_ENV, "").strip().lower()
    if value:
        return value in _ON
    return at_terminal() if interactive is None else interactive


def at_terminal() -> bool:
    """Whether this command was typed at a terminal: stdin and stderr are terminals."""
    try:
        return os.isatty(0) and os.isatty(2)
    except OSError:
        return False


def by_default(env: dict[str, str] | None = None) -> bool:
    """Whether the launcher is on only by default (MIGRATE_PRELOAD unset): then a command that
    starts a server says so."""
    env = os.environ if env is None else env
    return not env.get(ENABLE_ENV, "").strip()


def server_key(env: dict[str, str] | None = None) -> str:
    """What the server's imports depend on, hashed (see the module docstring)."""
    env = os.environ if env is None else env
    h = hashlib.sha256()
    h.update(sys.executable.encode())
    for entry in sys.path:
        try:
            mtime = os.stat(entry or ".").st_mtime_ns
        except OSError:
            mtime = -1
        h.update(f"\0{entry}\0{mtime}".encode())
    for k in sorted(env):
        if not k.startswith(PER_COMMAND):
            h.update(f"\0{k}={env[k]}".encode())
    h.update(f"\0{_inherited()}".encode())
    h.update(Path(__file__).read_bytes())
    h.update((Path(__file__).parent / "alembic_later.py").read_bytes())
    h.update((Path(__file__).parent / "entry.py").read_bytes())  # loaded in the server: `serve`'s caller
    return h.hexdigest()[:24]


def _inherited() -> str:
    """What a forked child inherits from the server, not from its caller: this process's control
    group (Linux: /proc/self/cgroup), resource limits, niceness, CPU affinity, user and groups."""
    try:
        cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        cgroup = ""
    limits = [resource.getrlimit(getattr(resource, name)) for name in sorted(dir(resource))
              if name.startswith("RLIMIT_")]
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = []
    return repr((cgroup, limits, os.getpriority(os.PRIO_PROCESS, 0), affinity, os.getuid(), os.getgid(),
                 sorted(os.getgroups())))


def socket_dir() -> Path | None:
    """This user's directory for launcher sockets (0700), or None when it is not safely ours."""
    path = Path(tempfile.gettempdir()) / f"migrate-preload-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except OSError:
        return None
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not path.is_dir() or path.is_symlink():
        return None
    return path


# ---- the client: the `migrate` process a user started -------------------------------------------

def hand_over(argv: list[str]) -> int | None:
    """Run the command in a child of this user's server for this environment; its exit code. None
    when no server took it (the caller runs the command itself): then one is started for the next."""
    where = socket_dir()
    if where is None:
        return None
    path = where / f"{server_key()}.sock"
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_SECONDS)
        conn.connect(str(path))
        request = json.dumps({"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "umask": _umask(),
                              "path": sys.path}).encode()
        conn.sendmsg([struct.pack("!I", len(request)), request],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
        answer = _recv_exact(conn, 5)
        if answer[:1] != STARTED:
            raise OSError("the launcher did not start the command")
        conn.sendall(GO)  # the child waits for it: a client that gave up before leaves a child that exits
    except OSError:
        conn.close()
        if start_server(path) and by_default():
            sys.stderr.write(STARTED_NOTE.format(minutes=round(_idle_seconds() / 60)))
        return None
    child = struct.unpack("!I", answer[1:])[0]
    return _follow(conn, child)


STARTED_NOTE = ("migrate: started a pre-loaded launcher for the next `migrate run`/`sync` typed here (they start"
                " about a second sooner; it exits after {minutes} idle minutes; `migrate preload stop` ends it,"
                " MIGRATE_PRELOAD=0 keeps it off)\n")


def _idle_seconds() -> float:
    """MIGRATE_PRELOAD_IDLE_SECONDS, else IDLE_SECONDS (a bad value: IDLE_SECONDS; the command that
    reads the environment refuses it, naming the variable)."""
    try:
        return max(1.0, float(os.environ.get(IDLE_ENV) or IDLE_SECONDS))
    except ValueError:
        return IDLE_SECONDS


def _follow(conn: socket.socket, child: int) -> int:
    """Forward the stop signals to the child until the server says how it ended; its exit code."""
    def forward(signo: int, frame: Any) -> None:
        try:
            os.kill(child, signo)
        except ProcessLookupError:
            pass

    def suspend(signo: int, frame: Any) -> None:  # Ctrl-Z: the child, then this process, until SIGCONT
        forward(signal.SIGSTOP, frame)
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)
        signal.signal(signal.SIGTSTP, suspend)
        forward(signal.SIGCONT, frame)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCONT):
        signal.signal(sig, forward)
    signal.signal(signal.SIGTSTP, suspend)
    conn.settimeout(None)
    data = b""
    while len(data) < 5:
        try:
            chunk = conn.recv(5 - len(data))
        except InterruptedError:
            continue
        if not chunk:
            break
        data += chunk
    if len(data) == 5 and data[:1] == EXIT:
        status = struct.unpack("!i", data[1:])[0]
        return status if status >= 0 else 128 - status
    sys.stderr.write("migrate: the command ended without its exit code (killed, its pre-loaded launcher gone)\n")
    return 1


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise OSError("connection closed")
        data += chunk
    return data


def start_server(path: Path) -> bool:
    """Start a server for `path` in a session of its own (it outlives this command); whether this
    call started one - not when another command started one in the last STARTING_SECONDS (its
    marker file)."""
    marker = path.with_suffix(".starting")
    try:
        if time.time() - marker.stat().st_mtime < STARTING_SECONDS:
            return False
        marker.unlink()
    except OSError:
        pass
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        subprocess.Popen([sys.executable, "-c", f"from migration_pipeline.entry import serve; serve({str(path)!r})"],
                         start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, close_fds=True)
    except OSError:
        return False
    return True


def children_of(parent: int) -> list[int]:
    """Live (not zombie) processes whose parent is `parent` (Linux /proc): a server's running commands."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == parent and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def servers() -> list[tuple[int, Path]]:
    """This user's running servers: (pid, socket path), from their pid files (stale ones skipped)."""
    where = socket_dir()
    found = []
    for pid_file in sorted(where.glob("*.pid")) if where is not None else []:
        try:
            pid = int(pid_file.read_text())
            os.kill(pid, 0)
        except (OSError, ValueError):
            continue
        found.append((pid, pid_file.with_suffix(".sock")))
    return found


# ---- the server ----------------------------------------------------------------------------------

def serve(path: str | Path, command: Callable[[], None]) -> None:
    """Import PRELOADED, listen on `path`, fork a child per command, which calls `command` (the
    `migrate` group: `entry.run_group`) with the caller's argv; exit after IDLE_SECONDS
    (MIGRATE_PRELOAD_IDLE_SECONDS) with no command and no child running. Single-threaded: a fork
    copies only this thread. `path`.pid holds its pid while it listens."""
    import importlib

    path = Path(path)
    idle = _idle_seconds()
    for name in PRELOADED:
        importlib.import_module(name)
    from migration_pipeline.alembic_later import storage_modules

    storage_modules()
    for name in STORAGE_MODULES:
        importlib.import_module(name)
    if threading.active_count() > 1:  # a fork copies only the forking thread: never serve from more than one
        return
    gc.freeze()  # what the imports built: out of the children's collections, as `collector_paused` leaves it
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signo, frame: None)  # a child ended: the select below wakes
    signal.signal(signal.SIGTERM, _stop)  # its socket and pid file removed on the way out
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    listener.bind(str(staging))
    listener.listen(16)
    os.replace(staging, path)  # atomically: a client never meets a half-made socket
    inode = os.stat(path).st_ino
    path.with_suffix(".pid").write_text(str(os.getpid()))
    path.with_suffix(".starting").unlink(missing_ok=True)
    children: dict[int, socket.socket] = {}
    last = time.monotonic()
    try:
        while children or time.monotonic() - last < idle:
            ready, _, _ = select.select([listener, wake_r], [], [], 5.0)
            if wake_r in ready:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
            if listener in ready:
                conn, _ = listener.accept()
                last = time.monotonic()
                pid = _start_child(conn, [listener.fileno(), wake_r, wake_w, *(c.fileno() for c in children.values())],
                                   command)
                if pid is None:
                    conn.close()
                else:
                    children[pid] = conn
            _reap(children)
            if not _still_ours(path, inode):
                break
    finally:
        if _still_ours(path, inode):
            path.unlink(missing_ok=True)
            path.with_suffix(".pid").unlink(missing_ok=True)
        listener.close()


def _stop(signo: int, frame: Any) -> NoReturn:
    """SIGTERM to the server: leave through `serve`'s cleanup (running children go on)."""
    raise SystemExit(0)


def _still_ours(path: Path, inode: int) -> bool:
    """Whether `path` is still the socket file this server bound (`inode`): another server may have
    replaced it."""
    try:
        return os.stat(path).st_ino == inode
    except OSError:
        return False


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell each finished child's client how it ended (exit code, or minus the signal)."""
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if not done:
            continue
        conn = children.pop(pid)
        try:
            conn.sendall(EXIT + struct.pack("!i", os.waitstatus_to_exitcode(status)))
        except OSError:
            pass
        conn.close()


def _start_child(conn: socket.socket, server_fds: list[int], command: Callable[[], None]) -> int | None:
    """Read a command's request and fork its child; the child's pid, None when the request is bad.
    `server_fds`: the server's own descriptors, closed in the child."""
    try:
        conn.settimeout(CONNECT_SECONDS)
        head, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_LEN(3 * array.array("i").itemsize))
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        if len(head) != 4 or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            return None
        request = json.loads(_recv_exact(conn, struct.unpack("!I", head)[0]))
    except (OSError, ValueError):
        return None
    pid = os.fork()
    if pid == 0:
        for fd in server_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        _child(conn, request, list(fds), command)
    for fd in fds:
        os.close(fd)
    return pid


def _child(conn: socket.socket, request: dict[str, Any], fds: list[int], command: Callable[[], None]) -> NoReturn:
    """The command, in the forked child: the caller's terminal, environment, directory, umask and
    sys.path; SIGKILL to itself when the caller is gone (see the module docstring)."""
    global _in_child
    _in_child = True
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.umask(int(request["umask"]))
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:] = list(request["path"])
        sys.argv = list(request["argv"])
        conn.settimeout(None)
        conn.sendall(STARTED + struct.pack("!I", os.getpid()))
        if _recv_exact(conn, 1) != GO:
            raise OSError("no go")
    except BaseException:  # noqa: BLE001 - the client gave up (or the set-up failed): nothing was run
        os._exit(75)
    global _client
    _client = conn
    threading.Thread(target=_die_with_caller, args=(conn,), name="migrate-preload-caller", daemon=True).start()
    code = 1
    try:
        command()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - printed as the interpreter would, then exit 1
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            exit_now(code)


def exit_now(code: int) -> NoReturn:
    """`os._exit(code)`; in a launcher's child, its client is told `code` first. The child tells it
    itself because its server may be gone (`migrate preload stop`, a kill) while it ran on: the
    server's own report (`_reap`) is then never sent. Commands that end with `os._exit` (a launch:
    `cli.launching.exit_launched`) end through this."""
    if _client is not None:
        try:
            _client.sendall(EXIT + struct.pack("!i", code))
        except OSError:
            pass
    os._exit(code)


def _die_with_caller(conn: socket.socket) -> None:
    """Block until the caller's end of the connection closes, then SIGKILL this process."""
    try:
        while conn.recv(64):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)
