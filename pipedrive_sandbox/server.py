"""Running the sandbox: in a background thread, in a subprocess, or blocking in the foreground.

* `SandboxServer(config)` - a context manager serving on a free 127.0.0.1 port in a thread;
  `base_url`, and httpx helpers `stats()`, `truth(kind=None)`, `truth_rows(kind)`, `reset_stats()`,
  `configure(**changes)`, and for the live account `live_step(n)`, `live_stop()`, `live()`,
  `changes(since_seq=0)`.
* `start_subprocess(config, port=None)` - `python -m pipedrive_sandbox ...` in a child process;
  returns (Popen, base_url) once the server answers.
* `serve(config, port, host="127.0.0.1")` - blocks; what `migrate sandbox` and `python -m
  pipedrive_sandbox` run. Prints one line `SANDBOX_READY <base_url>` on stdout when listening.

uvicorn runs with the access log off (the token may be in a query string), no concurrency limit
and a listen backlog of 2048.
"""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import httpx
import uvicorn

from .app import create_app
from .config import SandboxConfig

READY_PREFIX = "SANDBOX_READY "
BACKLOG = 2048


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this: without it, Nagle + delayed ACK add ~40 ms to every response
    # (headers and body go out in two writes).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


def _uvicorn_config(config: SandboxConfig, host: str, port: int, app: Any = None) -> uvicorn.Config:
    return uvicorn.Config(
        app if app is not None else create_app(config),
        host=host,
        port=port,
        access_log=False,
        log_level="warning",
        limit_concurrency=None,
        backlog=BACKLOG,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=1,
        lifespan="off",
        server_header=False,
    )


class _Server(uvicorn.Server):
    def install_signal_handlers(self) -> None:  # pragma: no cover - threads cannot
        """Install uvicorn's signal handlers only on the main thread (a thread cannot; `SandboxServer` runs in one)."""
        if threading.current_thread() is threading.main_thread():
            super().install_signal_handlers()


class SandboxServer:
    """Serve a sandbox in a background thread: `with SandboxServer(cfg) as sb: sb.base_url`."""

    def __init__(self, config: SandboxConfig | None = None, host: str = "127.0.0.1", port: int = 0) -> None:
        self.config = config or SandboxConfig()
        self.host = host
        self._sock = _bind(host, port)
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}"
        self.app = create_app(self.config)
        self._server = _Server(_uvicorn_config(self.config, host, self.port, self.app))
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None

    def start(self) -> "SandboxServer":
        """Serve in a daemon thread and wait until uvicorn is listening; returns self.

        RuntimeError when the thread dies during start-up or the server is not up within 30 s."""
        def run() -> None:
            asyncio.run(self._server.serve(sockets=[self._sock]))

        self._thread = threading.Thread(target=run, name=f"pipedrive-sandbox-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("sandbox server thread died during start-up")
            if time.monotonic() > deadline:
                raise RuntimeError("sandbox server did not start within 30 s")
            time.sleep(0.01)
        self._client = httpx.Client(base_url=self.base_url, timeout=60)
        return self

    def stop(self) -> None:
        """Stop the live changes, the client and the server thread (forced after 15 s), and close the socket."""
        self.app.state.sandbox.live.stop()  # no background changes outlive the server
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=15)
            if self._thread.is_alive():
                self._server.force_exit = True
                self._thread.join(timeout=5)
            self._thread = None
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> "SandboxServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def client(self) -> httpx.Client:
        """An httpx client on the server's base URL (60 s timeout); RuntimeError before `start`."""
        if self._client is None:
            raise RuntimeError("server not started")
        return self._client

    def stats(self) -> dict[str, Any]:
        """`GET /_sandbox/stats` (the traffic counters, daily budget and config)."""
        r = self.client.get("/_sandbox/stats")
        r.raise_for_status()
        return r.json()

    def truth(self, kind: str | None = None) -> dict[str, Any]:
        """`GET /_sandbox/truth`, all of it or the part `kind` (see admin.py for the kinds)."""
        r = self.client.get("/_sandbox/truth", params={"kind": kind} if kind else None)
        r.raise_for_status()
        return r.json()

    def reset_stats(self) -> None:
        """`POST /_sandbox/stats/reset`: start the traffic counters over."""
        self.client.post("/_sandbox/stats/reset").raise_for_status()

    def truth_rows(self, kind: str) -> dict[str, Any]:
        """`{id (as a string): row exactly as the API serves it now}` for a truth kind."""
        r = self.client.get("/_sandbox/truth", params={"kind": kind, "rows": "1"})
        r.raise_for_status()
        return r.json()["rows"]

    def live_step(self, n: int = 1) -> list[dict[str, Any]]:
        """Apply n live changes now (synchronously); returns them (see live.py for their shape)."""
        r = self.client.post("/_sandbox/live/step", json={"n": n})
        if r.status_code == 400:
            raise ValueError(r.json().get("error"))
        r.raise_for_status()
        return r.json()["changes"]

    def live_stop(self) -> dict[str, Any]:
        """Stop the background changes; returns the live status {applied, running, rate, max, mix}."""
        r = self.client.post("/_sandbox/live/stop")
        r.raise_for_status()
        return r.json()

    def live(self) -> dict[str, Any]:
        """The live status: {"applied": n, "running": bool, "rate": r, "max": n, "mix": {op: weight}}."""
        r = self.client.get("/_sandbox/live")
        r.raise_for_status()
        return r.json()

    def changes(self, since_seq: int = 0) -> list[dict[str, Any]]:
        """The changes applied after seq `since_seq`, oldest first."""
        r = self.client.get("/_sandbox/changes", params={"since_seq": since_seq})
        r.raise_for_status()
        return r.json()["changes"]

    def configure(self, **changes: Any) -> dict[str, Any]:
        """Change options at run time (`POST /_sandbox/config`); returns the public config.

        ValueError names a bad option."""
        r = self.client.post("/_sandbox/config", json=changes)
        if r.status_code == 400:
            raise ValueError(r.json().get("error"))
        r.raise_for_status()
        return r.json()


def serve(config: SandboxConfig, port: int, host: str = "127.0.0.1") -> None:
    """Serve in the foreground until interrupted; prints `SANDBOX_READY <url>` once listening."""
    sock = _bind(host, port)
    actual = sock.getsockname()[1]
    server = uvicorn.Server(_uvicorn_config(config, host, actual))

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if server.started:
            print(f"{READY_PREFIX}http://{host}:{actual}", flush=True)
        await task

    try:
        asyncio.run(main())
    finally:
        sock.close()


def _package_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def start_subprocess(
    config: SandboxConfig,
    port: int | None = None,
    *,
    host: str = "127.0.0.1",
    stderr: int | IO[Any] | None = None,
    timeout: float = 60.0,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """Run `python -m pipedrive_sandbox` and wait until it answers; returns (process, base_url).

    port None lets the child pick a free port (it reports it on stdout). The caller owns the
    process: terminate() and wait() it.
    """
    child_env = dict(os.environ if env is None else env)
    root = _package_root()
    child_env["PYTHONPATH"] = root + (os.pathsep + child_env["PYTHONPATH"] if child_env.get("PYTHONPATH") else "")
    args = [sys.executable, "-m", "pipedrive_sandbox", "--host", host, "--port", str(port or 0), *config.to_cli_args()]
    proc = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env=child_env,
    )
    lines: list[str] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=reader, daemon=True).start()
    deadline = time.monotonic() + timeout
    base_url = None
    while base_url is None:
        for line in list(lines):
            if line.startswith(READY_PREFIX):
                base_url = line[len(READY_PREFIX):].strip()
        if base_url is None:
            if proc.poll() is not None:
                raise RuntimeError(f"sandbox subprocess exited with {proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"sandbox subprocess not ready within {timeout} s")
            time.sleep(0.02)
    while True:
        try:
            if httpx.get(base_url + "/_sandbox/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("sandbox subprocess did not answer")
        time.sleep(0.02)
    return proc, base_url
