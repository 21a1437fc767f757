"""The two halves: engine_core imports neither dagster nor the sandbox, and every named query exists."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from engine_core.db import QUERIES

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_engine_core_imports_without_dagster_or_sandbox() -> None:
    code = r"""
import sys, importlib, pkgutil
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('dagster', 'pipedrive_sandbox', 'dagster_postgres', 'dagster_webserver'):
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import engine_core
for m in pkgutil.walk_packages(engine_core.__path__, 'engine_core.'):
    importlib.import_module(m.name)
print('ok')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_every_query_name_used_in_code_exists() -> None:
    used: set[str] = set()
    pattern = re.compile(r"""(?:execute|fetch_one|fetch_all|_run|query)\(\s*["']([a-z_0-9]+)["']""")
    for path in (ROOT / "engine_core").rglob("*.py"):
        used |= set(pattern.findall(path.read_text()))
    assert used, "found no named-query uses: the pattern is wrong"
    missing = sorted(used - set(QUERIES))
    assert not missing, f"queries used but not defined in queries.sql: {missing}"
