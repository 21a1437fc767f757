"""`migrate sandbox` takes `python -m pipedrive_sandbox`'s options (a fresh user's find: `migrate
sandbox --burst-limit 80` was "No such option", only the module took it), with the same defaults,
the scale included (`small` for both; the module had served `tiny`)."""
from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from pipedrive_sandbox.__main__ import build_parser, config_from_args
from pipedrive_sandbox.config import SandboxConfig

pytestmark = pytest.mark.timeout(120)
MIGRATE = str(Path(sys.executable).parent / "migrate")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _served_config(args: list[str], port: int) -> dict:
    """Start `migrate sandbox ARGS --port PORT`, read its /_sandbox/stats config, stop it."""
    proc = subprocess.Popen([MIGRATE, "sandbox", *args, "--port", str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"migrate sandbox exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/_sandbox/stats", timeout=5).json()["config"]
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError("migrate sandbox did not answer")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_migrate_sandbox_passes_the_rate_limit_and_shape_options_to_the_server():
    config = _served_config(["--scale", "tiny", "--burst-limit", "7", "--burst-window-seconds", "3.5",
                             "--day-seconds", "60", "--page-cap", "4", "--hostile-mail"], _free_port())
    assert (config["burst_limit"], config["burst_window_seconds"], config["day_seconds"]) == (7, 3.5, 60.0), config
    assert (config["page_cap"], config["hostile_mail"]) == (4, True), config


def test_the_two_sandbox_commands_have_the_same_options_and_defaults():
    from click.testing import CliRunner

    from migration_pipeline.cli.demo import SANDBOX_TUNING, sandbox
    from migration_pipeline.cli.main import main

    module_options = {a.dest for a in build_parser()._actions if a.dest not in ("help", "host", "port")}
    click_options = {p.name for p in sandbox.params if p.name != "port"}
    assert module_options == click_options, module_options ^ click_options
    # the defaults of both are SandboxConfig's (the scale: small for both)
    fields = {f.name: f.default for f in dataclasses.fields(SandboxConfig)}
    for name, default, _kind, _help in SANDBOX_TUNING:
        assert default == fields[name], (name, default, fields[name])
    assert {p.name: p.default for p in sandbox.params}["scale"] == "small"
    assert config_from_args(build_parser().parse_args([])).scale == "small"
    refused = CliRunner().invoke(main, ["sandbox", "--burst-limit", "0"])
    assert refused.exit_code == 2 and "--burst-limit" in refused.output, refused.output
    refused = CliRunner().invoke(main, ["sandbox", "--live-mix", "update:1"])
    assert refused.exit_code == 2 and "--live-mix needs --live" in refused.output, refused.output
