"""`cli.launching.DagsterAhead`: a launch's Dagster modules imported on a thread while the checks
run. An import that fails there says nothing on that thread (no traceback on the command's
stderr, whose errors are one line) and fails again, with its own error, where the launch imports
the module itself."""
from __future__ import annotations

import importlib
import sys
import threading

import pytest

from migration_pipeline.cli.launching import DagsterAhead


def test_a_failing_import_is_raised_by_the_callers_own_import(tmp_path, monkeypatch, capfd):
    (tmp_path / "ahead_broken_module.py").write_text("raise ValueError('the real error')\n")
    (tmp_path / "ahead_fine_module.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    class Ahead(DagsterAhead):
        MODULES = ("ahead_fine_module", "ahead_broken_module")

    monkeypatch.setattr("migration_pipeline.cli.launching.storage_modules", lambda: None)
    escaped: list = []  # what reached the thread's end: Python prints it to stderr as a traceback
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    try:
        ahead = Ahead()
        ahead.join()
        assert "ahead_fine_module" in sys.modules  # loaded on the thread
        assert "ahead_broken_module" not in sys.modules
        assert not escaped and capfd.readouterr().err == ""  # nothing said on the thread
        with pytest.raises(ValueError, match="the real error"):
            importlib.import_module("ahead_broken_module")
    finally:
        sys.modules.pop("ahead_fine_module", None)
        sys.modules.pop("ahead_broken_module", None)
