"""The project's packaging: a non-editable install ships the schema migrations and the named queries
(`db.migration_files` reads them through importlib.resources), and setuptools builds it without
warnings about the SQL folders ("Package would be ignored": data folders that are not named as
packages). Built with `setup.py build_py` into a temporary folder, what a wheel is made of."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_build_ships_every_sql_file_without_warnings(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "-d", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    said = out.stdout + out.stderr
    assert "would be ignored" not in said and "absent from the `packages` configuration" not in said, said
    shipped = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.sql"))
    here = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "engine_core" / "sql").rglob("*.sql"))
    assert here and shipped == here, (shipped, here)
