"""The lane: the slots (threads) that drain engine runs under Dagster. `slot` drains one run on a
worker thread, `threads` the extra threads of a launch's phase op, `fair` each tenant's share of
the slots, `terminate` a Dagster terminate turned into the engine run's stop, `executors` where the
steps run (in the run's process or on celery worker hosts)."""
