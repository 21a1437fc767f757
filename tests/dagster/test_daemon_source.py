"""A run executes in the daemon's processes with the daemon's environment, not the launching
shell's. A `migrate run` whose PIPEDRIVE_* settings reach another account than the live daemon's
is refused in one line before anything is launched (found by a fresh user: a run "succeeded" with
another tenant's data read from the daemon's sandbox)."""
from __future__ import annotations

from pathlib import Path

import pytest

from migration_pipeline import launch
import migration_pipeline.launch.checks
import migration_pipeline.launch.daemon

SANDBOX = {"PIPEDRIVE_BASE_URL": "http://127.0.0.1:8765", "PIPEDRIVE_API_TOKEN": "sandbox-token"}
OTHER = {"PIPEDRIVE_BASE_URL": "http://127.0.0.1:1", "PIPEDRIVE_API_TOKEN": "customer-secret-token"}


def _serving(tmp_path: Path, env: dict[str, str]) -> launch.daemon.DaemonLock:
    """A daemon lock held (as `migrate ui` holds it) and recorded with `env`'s source."""
    lock = launch.daemon.DaemonLock(tmp_path / "daemon-x.lock")
    assert lock.acquire()
    lock.record(by="migrate ui", pid=4242, address="http://127.0.0.1:3000", daemon_id=None,
                source=launch.daemon.source_record(env))
    return lock


def test_a_live_daemon_reading_another_account_refuses_the_launch_in_one_line(tmp_path: Path) -> None:
    lock = _serving(tmp_path, SANDBOX)
    try:
        keeper = launch.daemon.DaemonKeeper(None, dict(OTHER), tmp_path, tmp_path / "daemon.log")  # type: ignore[arg-type]
        keeper.lock = launch.daemon.DaemonLock(lock.path)
        with pytest.raises(launch.checks.LaunchError) as e:
            keeper.ensure()
        msg = str(e.value)
        assert "\n" not in msg and "pid 4242" in msg and "127.0.0.1:8765" in msg and "127.0.0.1:1" in msg
        assert "customer-secret-token" not in msg and "sandbox-token" not in msg
        assert "customer-secret-token" not in lock.path.read_text() and "sandbox-token" not in lock.path.read_text()
        # the same account (another spelling of nothing: same URL, same token) is served
        keeper = launch.daemon.DaemonKeeper(None, dict(SANDBOX), tmp_path, tmp_path / "daemon.log")  # type: ignore[arg-type]
        keeper.lock = launch.daemon.DaemonLock(lock.path)
        assert keeper.ensure().alive
    finally:
        lock.release()


def test_source_record_keeps_hosts_apart_and_the_token_out() -> None:
    a, b = launch.daemon.source_record(SANDBOX), launch.daemon.source_record(OTHER)
    assert a["host"] == "127.0.0.1:8765" and b["host"] == "127.0.0.1:1" and "sandbox-token" not in str(a)
    again = launch.daemon.source_record(SANDBOX, a["salt"])
    assert again == a and launch.daemon.source_record({**SANDBOX, "PIPEDRIVE_API_TOKEN": "rotated"}, a["salt"]) != a
    assert launch.daemon.source_record(SANDBOX)["token"] != a["token"]  # salted: no value to look a token up by
    assert launch.daemon.source_record({})["host"] == "default" and launch.daemon.source_record({})["token"] == ""
