"""Launching a tenant through Dagster from the command line, on the instance the UI uses.

Modules: `checks` (inputs, before anything is launched), `place` (the run created and queued or
started here), `in_process` (executed in the command's process), `daemon` (liveness and the daemon
for the duration), `signals` (SIGINT/SIGTERM/SIGHUP as `Interrupted`), `stop` (a launched run stopped), `results`,
`statuses`.

`migrate run` checks its inputs (settings, `--kinds` against the provider's plan, the source's
variables) before anything is launched, adds the tenant's partition and creates the tenant job's
run in this process (`place_tenant_run`: the same tags, partition, config and code location origin
as a launch from the UI, so the UI shows it, its events and materialisations like any other). Then
one of two paths:

* No daemon alive for the instance (`daemon_liveness`; the command would otherwise start one for
  its duration) and MIGRATE_RUN_IN_PROCESS not 0: when the lane has room (`start_if_room`: the run
  queue's limits in dagster.yaml, counted under a lock shared by every `migrate run`; the race it
  leaves is in its docstring), the run goes STARTING and executes in the command's own process
  (`InProcessRun`, as Dagster's run worker executes it): no daemon, code server or run worker
  process, each of which imported Dagster anew (~8 s of every small `migrate run`).
  Stopping it from anywhere ends it CANCELED with the engine run stopped and resumable: a signal
  to the command, `migrate stop` (the phase op), the UI's Terminate (a watcher thread sees it
  CANCELING and interrupts the execution as a run worker is interrupted).
* A daemon alive (the UI's), the lane full, or MIGRATE_RUN_IN_PROCESS=0: the run is submitted to
  the instance's run coordinator (queued, it counts in the lane like any other), a daemon dequeues
  it (the UI's, or one started for the duration), and the command waits for the run, saying why
  while it is queued and giving up after MIGRATE_QUEUE_TIMEOUT_SECONDS. A daemon is never started
  while one serves the instance (a second daemon beside a `dagster dev` UI stole and then
  interrupted the UI's runs).

Liveness of the daemon. Dagster's own `DaemonStatus.healthy` tolerates a heartbeat up to 30 min
old (DEFAULT_DAEMON_HEARTBEAT_TOLERANCE_SECONDS), so a daemon that stopped a minute ago still
counts, and a run queued then waits for nobody. Here a daemon is alive when
* the instance's daemon lock is held: `DAGSTER_HOME/daemon-<storage>.lock`, an flock taken by the
  `migrate` process that starts a daemon (`migrate ui`'s `dagster dev`, `migrate run`'s
  `dagster-daemon`) and inherited by that child, so it is released exactly when both are gone; or
* the lock is free and the run coordinator's heartbeat is newer than FRESH_HEARTBEAT_SECONDS (three
  of Dagster's 30 s heartbeat intervals), from a daemon other than the one the lock file says has
  exited: that is a daemon started by hand (`dagster dev` after `migrate dagster env`).
"""
