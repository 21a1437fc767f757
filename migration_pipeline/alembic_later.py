"""Dagster's SQL storage modules imported without importing alembic until a migration needs it.

`dagster._core.storage.sql` and `dagster_postgres.utils` import alembic at module level (its
command, config, environment, migration context and script directory) for the storages' schema
migrations and first-time stamping; a storage whose tables exist calls none of it. Importing
alembic (its `context` pulls every dialect's DDL implementation, autogenerate, and mako with its
pygments plugin) was ~0.08 s of each `migrate run`'s launch (`python -X importtime`, sampled, load 2).

`storage_modules()` imports those two modules while the alembic names they import are stand-ins
(`_Module` in sys.modules for the block only): each name they bind (`upgrade`, `Config`,
`MigrationContext`...) is a `_Deferred` that imports the real alembic object the first time it is
called or asked an attribute (`dagster instance migrate`, a new database's stamping), and forwards
to it from then on. Outside the block alembic imports as usual. Nothing else changes: the same
functions and classes are called with the same arguments."""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any

# What the two modules import from alembic (dagster 1.13.27, dagster-postgres 0.29.27): the
# packages and modules they name, as sys.modules stand-ins while they are imported.
STANDINS = ("alembic", "alembic.command", "alembic.config", "alembic.runtime", "alembic.runtime.environment",
            "alembic.runtime.migration", "alembic.script")
IMPORTED = ("dagster._core.storage.sql", "dagster_postgres.utils")


class _Deferred:
    """alembic's `module.name`, imported on first use: calling it calls the real object, an
    attribute is the real object's (`MigrationContext.configure`, `ScriptDirectory.from_config`)."""

    def __init__(self, module: str, name: str) -> None:
        self._where = (module, name)
        self._real: Any = None

    def real(self) -> Any:
        """The real alembic object (imported once)."""
        if self._real is None:
            module, name = self._where
            self._real = getattr(importlib.import_module(module), name)
        return self._real

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.real()(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        return getattr(self.real(), attr)

    def __repr__(self) -> str:
        return f"<alembic {'.'.join(self._where)}, imported on first use>"


class _Module(types.ModuleType):
    """A stand-in for an alembic module while Dagster's storage modules are imported: its
    submodules are the other stand-ins, any other name a `_Deferred`."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") and attr.endswith("__"):
            raise AttributeError(attr)
        sub = f"{self.__name__}.{attr}"
        if sub in STANDINS:
            return sys.modules.get(sub) or importlib.import_module(sub)
        return _Deferred(self.__name__, attr)


def storage_modules() -> None:
    """Import Dagster's SQL storage modules (IMPORTED) with alembic deferred (see the module
    docstring). Nothing to do when they are imported already, or alembic is."""
    if all(name in sys.modules for name in IMPORTED) or "alembic" in sys.modules:
        return
    standins = {name: _Module(name) for name in STANDINS}
    sys.modules.update(standins)
    try:
        for name in IMPORTED:
            importlib.import_module(name)
    finally:
        for name, standin in standins.items():
            if sys.modules.get(name) is standin:
                del sys.modules[name]
