"""A faithful Pipedrive API sandbox served over HTTP on 127.0.0.1.

The migration engine's tests, demo and benchmarks talk to it over a real socket; the engine never
imports this package. Public API:

* `SandboxConfig` (config.py) - scale, seed, token, latency, faults, limits;
  `SandboxConfig.from_options(...)` parses strings and raises ValueError naming the bad option.
* `SandboxServer`, `start_subprocess`, `serve` (server.py) - run it in a thread, a child process,
  or the foreground.
* `create_app` (app.py) - the Starlette application.
* `Dataset` (data.py) - the deterministic generated account.
* live.py - the live account: changes to the account while it serves.

README.md maps every module.
"""
from __future__ import annotations

from .config import SandboxConfig
from .data import Dataset
from .server import SandboxServer, serve, start_subprocess
from .app import create_app

__all__ = ["SandboxConfig", "SandboxServer", "serve", "start_subprocess", "create_app", "Dataset"]
