"""The supervisor configuration (``supervisor.toml``): model, loading, editing, reporting.

Entry points: :func:`load_config` (find, read, validate; raises
:class:`ConfigError` listing every problem), :func:`get_value` and
:func:`set_value`, :func:`add_element`, :func:`remove_key` (``herdsman config
get/set/add/remove``), and :func:`environment_warnings`.
"""

from herdsman.config.durations import format_duration, parse_duration
from herdsman.config.edit import EditResult, add_element, remove_key, set_value
from herdsman.config.environment import environment_warnings
from herdsman.config.keypath import KeyPath, format_key_path, parse_key_path
from herdsman.config.load import LoadedConfig, load_config, load_config_text
from herdsman.config.locate import find_config_file
from herdsman.config.model import (
    Account,
    ApiSettings,
    Config,
    Provider,
    Repo,
    RetentionSettings,
    SchedulingSettings,
    StoreSettings,
    SupervisorSettings,
    TraceSettings,
)
from herdsman.config.problems import ConfigError, ConfigProblem, ConfigUsageError, Location, Origin
from herdsman.config.query import GetResult, get_value

__all__ = [
    "Account",
    "ApiSettings",
    "Config",
    "ConfigError",
    "ConfigProblem",
    "ConfigUsageError",
    "EditResult",
    "GetResult",
    "KeyPath",
    "LoadedConfig",
    "Location",
    "Origin",
    "Provider",
    "Repo",
    "RetentionSettings",
    "SchedulingSettings",
    "StoreSettings",
    "SupervisorSettings",
    "TraceSettings",
    "add_element",
    "environment_warnings",
    "find_config_file",
    "format_duration",
    "format_key_path",
    "get_value",
    "load_config",
    "load_config_text",
    "parse_duration",
    "parse_key_path",
    "remove_key",
    "set_value",
]
