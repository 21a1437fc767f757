"""Thin typed adapters from Dagster configuration to engine objects; no migration logic here.

* `MigrationDatabase`: the engine's Postgres (`DATABASE_URL` through `EnvVar`, else the embedded
  server under MIGRATE_HOME); one pool per process that uses it.
* `SourceResource` / `PipedriveSource`: which provider runs the tasks, and how it reaches the
  source (`PIPEDRIVE_BASE_URL`, `PIPEDRIVE_API_TOKEN` through `EnvVar`: Dagster shows the variable's
  name, never its value). The project's own (`source_resource`) takes the token only as `{env: VAR}`:
  a token typed into the launchpad is refused at launch, before the run (and its stored config) exists.
  Each field defaults to its variable on its own, so a launchpad config may give just one of them.
* `LaneSettings`: the engine's lane settings (MIGRATE_* variables unless overridden) and the
  drainer's turn length.
* `NewRunOptions`: what a newly started engine run is limited to (kinds, dry run, provider options);
  set it in the launchpad's `resources:` section. Joining or retrying a run ignores it. The
  project's own (`new_run_options`) types its kinds with the source's kinds, so a bad one fails the launch,
  and judges the choice as a whole there (`KindsChoiceType`: plain kinds mixed with +kind/-kind), and
  its provider options with the provider's `check_options` (`CheckedOptionsJson`: a token among them).
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import enum
import functools
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from dagster import ConfigurableResource, EnvVar, InitResourceContext
from dagster._core.definitions.definition_config_schema import DefinitionConfigSchema
from dagster._config.config_type import Noneable
from dagster._config.field import Field
from dagster._config.field_utils import FIELD_NO_DEFAULT_PROVIDED
from dagster._config.errors import PostProcessingError
from dagster._config.source import StringSourceType
from dagster._core.errors import DagsterUserCodeProcessError
from dagster._utils.error import SerializableErrorInfo
from pydantic import PrivateAttr

from engine_core import db as dbmod
from engine_core.config import Settings
from engine_core.errors import ConfigError
from engine_core.models import Run
from engine_core.plan import ALL, choose_kinds
from engine_core.source import Provider, opt_in_kinds
from engine_core.providers.registry import provider_for
from migration_pipeline.launch.checks import pickable_kinds

ProviderResolver = Callable[[Run], Provider]


class MigrationDatabase(ConfigurableResource):
    """The engine's Postgres. Empty `url` means the embedded server under MIGRATE_HOME."""

    url: str = ""
    max_size: int = 6

    _db: dbmod.Database | None = PrivateAttr(default=None)

    def database(self) -> dbmod.Database:
        """The engine Database of this resource, connected on first use (one pool per Dagster run)."""
        if self._db is None:
            self._db = dbmod.connect(self.url or None, max_size=self.max_size)
        return self._db

    @contextlib.contextmanager
    def reader(self) -> Iterator[dbmod.Database]:
        """One connection to this resource's database for a short read outside a step (the
        executor's join at launch, `lane.join`): no pool of the run's size, no schema applied."""
        with dbmod.connect(self.url or None, max_size=1, apply=False) as db:
            yield db

    def teardown_after_execution(self, context: InitResourceContext) -> None:
        """Close the pool at the run's end."""
        if self._db is not None:
            self._db.close()
            self._db = None


def database_resource() -> MigrationDatabase:
    """`DATABASE_URL` through EnvVar when the variable is set, else the embedded default."""
    if os.environ.get("DATABASE_URL", "").strip():
        return MigrationDatabase(url=EnvVar("DATABASE_URL"))
    return MigrationDatabase()


class SourceResource(ConfigurableResource):
    """The source a tenant is migrated from; providers come from the engine's registry."""

    source: str = "example"

    def provider(self, run: Run | None = None) -> Provider:
        """The provider of this source (or of `run`'s own source, for a run of another source)."""
        return provider_for(self.source if run is None else run.source, run)

    def providers(self) -> ProviderResolver:
        """A resolver run -> provider, as the engine's Worker takes it."""
        return lambda run: self.provider(run)


class PipedriveSource(SourceResource):
    """Pipedrive: the API's base URL and token; None leaves it to the provider, which reads
    PIPEDRIVE_BASE_URL / PIPEDRIVE_API_TOKEN itself. The token is only handed to the provider."""

    source: str = "pipedrive"
    base_url: str | None = None
    api_token: str | None = None

    def provider(self, run: Run | None = None) -> Provider:
        """A PipedriveProvider with the base URL and token Dagster resolved for this run (they win
        over the process environment); a run of another source gets that source's provider."""
        if run is not None and run.source != self.source:
            return provider_for(run.source, run)  # the reaper sweeps every source's runs
        # the values Dagster resolved for this run win over the process environment
        return provider_for(self.source, run, base_url=self.base_url, token=self.api_token)


class LaunchRefusal(ConfigError, DagsterUserCodeProcessError):
    """A run config refused while the code server plans a run, before the run exists: the launchpad
    (GraphQL `launchRun`'s PythonError), a sensor or a schedule shows this one line and nothing else.
    Dagster serializes an error raised on the code server with its stack trace, which the launchpad
    shows beneath the message, except a DagsterUserCodeProcessError holding one error info: that info
    is passed on as it is (`dagster._utils.error.serializable_error_info_from_exc_info`), here the
    line with an empty stack. Still a ConfigError: the CLI's in-process check ends in the same line."""

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)  # DagsterUserCodeProcessError's own takes the infos as a keyword
        self.user_code_process_error_infos = [SerializableErrorInfo(message, [], type(self).__name__)]


class LiteralSecret(LaunchRefusal):
    """A run config gives a secret itself where only the environment variable holding it is taken."""


class UnsetSecretVariable(LaunchRefusal):
    """A run config names an environment variable for a secret that is not set where the run is planned."""


class EnvOnlyStringSource(StringSourceType):
    """Dagster's StringSource (same key and snapshot, so the UI shows and checks the field as before)
    that takes only `{env: VAR}`: Dagster post-processes the run config on the code server while it
    plans a run, before the run exists, so a literal string (a token typed into the launchpad) is
    refused there and never reaches the run's stored config. LiteralSecret, not PostProcessingError:
    Dagster's message for the latter repeats the value. `path`: the field, for the one-line message."""

    def __init__(self, path: str, variable: str) -> None:
        super().__init__()
        self.path, self.variable = path, variable

    def post_process(self, value: Any) -> Any:
        """The variable's value for `{env: VAR}` (StringSource's rule); LiteralSecret, naming the
        field and never the value, for anything else; UnsetSecretVariable, one line naming the field
        and the variable, for a VAR not set here (StringSource's PostProcessingError reaches the
        launchpad as its message with a Python stack trace in it)."""
        if not isinstance(value, dict):
            raise LiteralSecret(f"{self.path}: give the environment variable that holds the token "
                                f"({{env: {self.variable}}}), not the token itself: a run's config is stored and shown")
        name = value.get("env")
        if isinstance(name, str) and os.environ.get(name) is None:
            raise UnsetSecretVariable(unset_line(self.path, name, self.variable))
        return super().post_process(value)


class EnvDefaultStringSource(StringSourceType):
    """Dagster's StringSource (same key and snapshot) for a field whose default is `{env: VAR}`:
    `VAR` unset resolves to None, so the provider applies its own rule (Pipedrive's base URL: the
    variable, else the run's `base_url` option, else one line naming the variable); another variable
    named in the launchpad and unset is one line naming the field and the variable, not a silent
    fallback. `path`: the field, for that line."""

    def __init__(self, path: str, variable: str) -> None:
        super().__init__()
        self.path, self.variable = path, variable

    def post_process(self, value: Any) -> Any:
        """The string, or the variable's value for `{env: VAR}`; None for the default variable unset;
        UnsetSecretVariable (one line) for another variable unset."""
        name = value.get("env") if isinstance(value, dict) else None
        if isinstance(name, str) and os.environ.get(name) is None:
            if name == self.variable:
                return None
            raise UnsetSecretVariable(unset_line(self.path, name, self.variable))
        return super().post_process(value)


def unset_line(path: str, name: str, variable: str) -> str:
    """The one line for a field `path` naming an environment variable `name` that is not set here;
    `variable`: the field's default variable, offered when `name` is another one."""
    other = "" if name == variable else f", or give {{env: {variable}}}"
    return (f"{path}: the environment variable {name} is not set where the code server runs "
            f"(`migrate ui`'s environment); set it there{other}")


class CheckedOptionsJson(StringSourceType):
    """Dagster's StringSource for `new_run`'s `options_json` (same key and snapshot) that judges the
    provider options when the code server plans a run, before the run exists (as
    `EnvOnlyStringSource`), with the provider's `check_options` (what the CLI runs before launching):
    `runs.start_run` refuses the same options, but only after Dagster stored the run's config, a
    `{"api_token": ...}` or a base URL with credentials in it. Its messages never show a secret."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def post_process(self, value: Any) -> Any:
        """`value` unchanged; LaunchRefusal (one line, naming the field and the option, not as
        PostProcessingError: Dagster's message for it repeats the value) when the provider refuses
        the options (malformed JSON is left to `NewRunOptions.options`)."""
        value = super().post_process(value)
        try:
            options = json.loads(value or "{}")
        except ValueError:
            return value
        check_options = getattr(provider_for(self.source), "check_options", None) if options else None
        if isinstance(options, dict) and callable(check_options):  # no options: nothing to store or judge
            try:
                check_options(options)
            except ConfigError as e:
                raise LaunchRefusal(f"resources.new_run.config.options_json: {e}") from None
        return value


def retyped(resource: ConfigurableResource, name: str, config_type: StringSourceType,
            default: Any = FIELD_NO_DEFAULT_PROVIDED) -> ConfigurableResource:
    """`resource` with its field `name` typed `config_type` (a StringSourceType; inside Noneable when
    Dagster typed the field so) in this instance's config schema only: Dagster shares the field, its
    type and its Shape (memoized by key) with every resource of the same fields (tests build a
    PipedriveSource with a literal token), so this instance gets copies; the field's type keeps its
    key, so the UI shows and checks it as before. `default` (e.g. `{"env": VAR}`) becomes the
    field's own default: Dagster's defaults for a resource built with values sit on the resource's
    whole `config`, so a launchpad giving any one field would otherwise have to give every field.
    Raises TypeError when Dagster typed the field otherwise (a Dagster upgrade changed the inference)."""
    state = resource._state__internal__  # noqa: SLF001
    outer = state.config_schema.as_field()
    shape = object.__new__(type(outer.config_type))  # Shape() would return the shared one (memoized by key)
    shape.__dict__.update({k: v for k, v in outer.config_type.__dict__.items()
                           if k not in ("snapshot", "schema_snapshot")})  # cached under the old key
    field = copy.copy(shape.fields[name])
    was = field.config_type
    if type(was) is Noneable and type(was.inner_type) is StringSourceType:  # a str field with a default
        field.config_type = Noneable(config_type)
    elif type(was) is StringSourceType:
        field.config_type = config_type
    else:
        raise TypeError(f"{name}: Dagster typed the field {type(was).__name__}, not StringSource")
    if default is not FIELD_NO_DEFAULT_PROVIDED:
        field = Field(field.config_type, default_value=default, is_required=False,
                      description=field.description, is_secret=field.is_secret)
    shape.fields = {**shape.fields, name: field}
    # its own key: Dagster memoizes the Shapes around it by their fields' keys, and would otherwise
    # hand this resource's jobs the unchecked Shape of another resource with the same defaults
    shape.key = "Shape." + hashlib.sha1(f"{shape.key}:{type(config_type).__name__}:{name}:{default!r}".encode()).hexdigest()
    checked = copy.copy(outer)
    checked.config_type = shape
    resource._state__internal__ = state._replace(config_schema=DefinitionConfigSchema(checked))  # noqa: SLF001
    return resource


def source_resource(source: str) -> SourceResource:
    """The `source` resource for a source name; any other source than Pipedrive needs no settings.
    Pipedrive's reads its URL and token through EnvVar, each field on its own: a launchpad config
    giving only one of them takes the other from its variable. The token is taken only as
    `{env: VAR}` (`EnvOnlyStringSource`), and its variable unset fails the launch in one line; the
    URL's variable unset leaves the URL to the provider (`EnvDefaultStringSource`)."""
    if source == "pipedrive":
        url, token = "PIPEDRIVE_BASE_URL", "PIPEDRIVE_API_TOKEN"
        resource = PipedriveSource(base_url=EnvVar(url), api_token=EnvVar(token))
        resource = retyped(resource, "base_url", EnvDefaultStringSource("resources.source.config.base_url", url),
                           default={"env": url})
        return retyped(resource, "api_token", EnvOnlyStringSource("resources.source.config.api_token", token),
                       default={"env": token})
    return SourceResource(source=source)


class LaneSettings(ConfigurableResource):
    """The lane: engine settings from MIGRATE_* variables, with optional overrides."""

    lane_width: int | None = None
    stale_lock_seconds: float | None = None
    heartbeat_seconds: float | None = None
    # a drainer run gives its lane slot back after this long (at a task boundary), so a tenant
    # waiting in the run queue gets the next slot
    drainer_turn_seconds: float = 120.0
    # how long a terminated run waits for its running task to reach a stop point
    stop_grace_seconds: float = 20.0

    def engine_settings(self) -> Settings:
        """The engine's Settings from MIGRATE_* variables, with this resource's overrides applied."""
        settings = Settings.from_env()
        overrides: dict[str, Any] = {
            k: v
            for k, v in (
                ("lane_width", self.lane_width),
                ("stale_lock_seconds", self.stale_lock_seconds),
                ("heartbeat_seconds", self.heartbeat_seconds),
            )
            if v is not None
        }
        return dataclasses.replace(settings, **overrides) if overrides else settings


class NewRunOptions(ConfigurableResource):
    """What a newly started run is limited to; ignored when the tenant's run already exists.

    `kinds`: the kinds choice (`engine_core.plan.choose_kinds`), e.g. ["+deal_history", "+participants"]
    (the defaults with those opt-in kinds added), ["persons", "deals"] (exactly those), ["all"];
    empty: the default kinds. Typed with the source's kinds in the project's Definitions
    (`new_run_options`): an unknown one fails the launch; here, the run's start.
    `start_new`: start a new engine run even when the tenant's latest run succeeded (a migration
    from scratch; the same as the run tag `migration/new_run=true`). Without it such a launch is
    refused (`engine_core.runs.AlreadyMigrated`) and points to the sync job.
    """

    kinds: list[str] = []
    dry_run: bool = False
    options_json: str = "{}"
    start_new: bool = False

    def options(self) -> dict[str, Any]:
        """The provider options of a new run (`options_json` parsed). Raises ValueError unless it is a
        JSON object."""
        value = json.loads(self.options_json or "{}")
        if not isinstance(value, dict):
            raise ValueError("new_run.options_json must be a JSON object")
        return value

    def start_kwargs(self) -> dict[str, Any]:
        """The keyword arguments `runs.start_run` takes for a new run: kinds (None: the defaults), dry_run, options."""
        return {"kinds": [str(k) for k in self.kinds] or None, "dry_run": self.dry_run, "options": self.options()}


@functools.cache
def kind_choices(source: str) -> type[enum.StrEnum]:
    """The entries a kinds choice of `source` may hold, as a Python enum Dagster turns into a config
    Enum: each pickable kind (`pickable_kinds`) and `all`, each also as `+name` and `-name`. The enum's
    name lists the kinds, so Dagster's one-line refusal of a value names them beside it."""
    names = [k for group in pickable_kinds(provider_for(source)) for k in group] + [ALL]
    values = [*names, *("+" + n for n in names), *("-" + n for n in names)]
    title = f"{source} kind ({', '.join(names)}; each also as +kind or -kind)"
    return enum.StrEnum(title, [(v, v) for v in values])


@functools.cache
def new_run_options(source: str) -> type[NewRunOptions]:
    """`NewRunOptions` with `kinds` typed by `kind_choices(source)`: Dagster checks the run config
    against it when a run is launched (launchpad, CLI, sensor), so an unknown kind is refused there
    in one line naming it and the kinds there are, not when phase 1 starts the engine run."""
    return type("NewRunOptions", (NewRunOptions,), {
        "__module__": __name__, "__doc__": NewRunOptions.__doc__, "__qualname__": "NewRunOptions",
        "__annotations__": {"kinds": list[kind_choices(source)]}, "kinds": []})


class KindsChoiceType(Noneable):
    """The config type of `new_run`'s `kinds` (Dagster's own, Noneable(Array(kind enum))), judging
    the choice as a whole when a run is launched: Dagster post-processes the run config on the code
    server while it plans the run, before the run exists (as it reads an EnvVar), so a choice that
    mixes plain kinds with `+kind`/`-kind`, or leaves no kind, is refused at launch with
    `choose_kinds`'s one-line message naming the entries, not when phase 1 starts the engine run.
    The enum cannot say it: each entry alone is good. The snapshot the UI validates is unchanged."""

    source = ""

    def post_process(self, value: Any) -> Any:
        """`value` (the processed list, or None) unchanged; PostProcessingError (one line) when
        `engine_core.plan.choose_kinds` refuses it for `source`'s pickable kinds."""
        if value:
            provider = provider_for(self.source)
            try:
                choose_kinds(pickable_kinds(provider), [str(v) for v in value], opt_in_kinds(provider))
            except ConfigError as e:
                raise PostProcessingError(f"new_run kinds: {e}") from None
        return value


@functools.cache
def kinds_choice_type(source: str) -> type[KindsChoiceType]:
    """`KindsChoiceType` bound to `source` (one class per source)."""
    return type(f"KindsChoiceType_{source}", (KindsChoiceType,), {"source": source, "__doc__": KindsChoiceType.__doc__})


def checked_new_run_options(source: str) -> NewRunOptions:
    """A `new_run_options(source)` resource whose `kinds` field is judged as a whole at launch
    (`KindsChoiceType`): the Noneable type Dagster inferred for the field (one object, shared by the
    resource's schema and its config schema) takes that class; its key, kind and snapshot stay. Its
    `options_json` is judged at launch too (`CheckedOptionsJson`). Raises TypeError when Dagster
    inferred another type (a Dagster upgrade changed the inference)."""
    resource = new_run_options(source)()
    field_type = resource._config_schema.config_type.fields["kinds"].config_type  # noqa: SLF001
    checked = kinds_choice_type(source)
    if type(field_type) not in (Noneable, checked):  # Dagster reuses a type it made for the same annotation
        raise TypeError(f"new_run kinds: Dagster typed the field {type(field_type).__name__}, not Noneable")
    field_type.__class__ = checked
    return retyped(resource, "options_json", CheckedOptionsJson(source))


def default_resources(source: str) -> dict[str, Any]:
    """The resources every job and asset of the project uses: database, source, lane, new_run."""
    return {
        "database": database_resource(),
        "source": source_resource(source),
        "lane": LaneSettings(),
        "new_run": checked_new_run_options(source),
    }
