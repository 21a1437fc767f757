"""Test hook for a `migrate` subprocess (its directory on PYTHONPATH): with SLOW_CANCELING_SECONDS
set, DagsterInstance.report_run_canceling sleeps that long after it returns - the window between a
run going CANCELING and the caller's next line, widened so a race in it happens every time."""
import os
import sys
import importlib.abc
import importlib.machinery

TARGET = "dagster._core.instance.methods.event_methods"

if os.environ.get("SLOW_CANCELING_SECONDS"):
    class _Hook(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != TARGET:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            real = spec.loader.exec_module

            def exec_module(module):
                real(module)
                import time
                orig = module.EventMethods.report_run_canceling

                def slow(self, run, message=None):
                    orig(self, run, message)
                    time.sleep(float(os.environ["SLOW_CANCELING_SECONDS"]))
                module.EventMethods.report_run_canceling = slow
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, _Hook())
