"""Where `magnetar standalone` takes its settings from, and `--print-config`.

Theory of operation
-------------------
Each source yields values for settings of the one table (`_settings.SETTINGS`), already
parsed and checked against the setting's type, range or choices, in the field's unit:

1. the defaults (the dataclasses' own);
2. the config file (`--config-file PATH`): Pulsar's standalone.conf format, `key=value` lines,
   `#` or `!` comment lines and blank lines; keys are the table's, an unknown key is ignored
   with one warning listing them all, an empty value means the default, the last line wins;
3. the environment: `MAGNETAR_<key>`, the key spelt exactly as in the file
   (`MAGNETAR_maxMessageSize=1048576`); other `MAGNETAR_` names are not settings and are
   ignored, a case-only misspelling of a key is warned about; empty means the default;
4. `--config NAME=VALUE` items (a key, or a field name as `--config` always took);
5. the dedicated flags (`--port`, `--data-dir`, ...).

A later source wins. `build` turns the merged values into `StandaloneOptions`; the dataclasses
check what spans several settings. Every error is a `ConfigurationError` with one line naming
the key (as written), the file and line or the variable, and what is allowed; nothing is
opened or started before all of this passed.
"""

from __future__ import annotations

import difflib
import logging
import math
import textwrap
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from magnetar.storage import StorageConfig

from .._config import REMOVED_SETTINGS, BrokerConfig
from .._errors import ConfigurationError
from ..security._tls import TlsOptions
from ._settings import (
    BROKER,
    SECTIONS,
    SETTINGS,
    STANDALONE,
    STORAGE,
    TLS,
    MiB,
    Setting,
    by_name,
    names,
)
from ._standalone import StandaloneOptions

__all__ = ["ENV_PREFIX", "Value", "Values", "build", "from_environment", "from_file",
           "from_flags", "from_overrides", "merge", "render"]

log = logging.getLogger(__name__)

ENV_PREFIX: Final = "MAGNETAR_"
DEFAULT: Final = "default"
# A journal record holds one entry and its header; the record limit follows a larger entry
# limit with this much room (the storage asks for at least 64 bytes).
_RECORD_ROOM_BYTES: Final = 64 * 1024
_KEYS: Final = {each.key: each for each in SETTINGS}


@dataclass(frozen=True)
class Value:
    """A setting's value (in the field's unit) and where it came from."""

    value: Any
    source: str


Values = dict[Setting, Value]


def from_file(path: str) -> Values:
    """The settings a config file gives (module comment, step 2).

    Raises:
        ConfigurationError: the file is missing, unreadable or not text, a line is not
            `key=value`, or a value is invalid ("PATH:LINE: ..."); nothing is read then.
    """
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read()
    except OSError as exc:
        raise ConfigurationError(f"cannot read --config-file {path}: "
                                 f"{exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigurationError(f"cannot read --config-file {path}: not UTF-8 text") from None
    values: Values = {}
    unknown: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        where = f"{path}:{number}"
        key, sep, given = line.partition("=")
        key, given = key.strip(), given.strip()
        if not sep or not key:
            raise ConfigurationError(f"{where}: expected key=value, not {line!r}")
        setting = _KEYS.get(key)
        if setting is None:
            unknown.append(key)
        elif not given:
            values.pop(setting, None)
        else:
            values[setting] = Value(_parse(setting, given, key, where), where)
    if unknown:
        log.warning("%s: ignoring %d unknown key%s: %s", path, len(unknown),
                    "" if len(unknown) == 1 else "s", ", ".join(unknown))
    return values


def from_environment(environ: Mapping[str, str]) -> Values:
    """The settings `MAGNETAR_<key>` variables give (module comment, step 3).

    Raises:
        ConfigurationError: a value is invalid (the message names the variable).
    """
    values: Values = {}
    lowered = {key.lower(): key for key in _KEYS}
    for name, given in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX):]
        setting = _KEYS.get(key)
        if setting is None:
            if key.lower() in lowered:
                log.warning("ignoring environment variable %s: keys are case-sensitive; did "
                            "you mean %s%s?", name, ENV_PREFIX, lowered[key.lower()])
            continue
        if given.strip():
            values[setting] = Value(_parse(setting, given.strip(), key,
                                           f"environment variable {name}"), name)
    return values


def from_overrides(items: Iterable[str]) -> Values:
    """The settings of `--config NAME=VALUE` items (NAME: a key or a field name).

    Raises:
        ConfigurationError: an unknown or removed name, a malformed item or an invalid value.
    """
    values: Values = {}
    for item in items:
        name, sep, given = item.partition("=")
        name = name.strip()
        if sep and name.replace("-", "_") in REMOVED_SETTINGS:
            name = name.replace("-", "_")
            raise ConfigurationError(f"{name} is no longer a setting: {REMOVED_SETTINGS[name]}")
        setting = by_name(name) or by_name(name.replace("-", "_"))
        if not sep or setting is None:
            raise ConfigurationError(_unknown(item, name))
        values[setting] = Value(setting.parse(given.strip(), name), "--config")
    return values


def _unknown(item: str, name: str) -> str:
    if "=" not in item:
        return f"not a broker setting: {item!r} (expected name=value)"
    close = difflib.get_close_matches(name, names(), n=1)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"not a broker setting: {item!r}{hint}"


def from_flags(flags: Iterable[tuple[str, Any, str]]) -> Values:
    """The settings of dedicated flags: (key, value in the field's unit, the flag)."""
    return {_KEYS[key]: Value(value, flag) for key, value, flag in flags}


def _parse(setting: Setting, text: str, name: str, where: str) -> Any:
    try:
        return setting.parse(text, name)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{where}: {exc}") from None


def merge(*layers: Values) -> Values:
    """Every setting's value: the defaults, overridden by each layer in turn."""
    merged = {each: Value(each.default, DEFAULT) for each in SETTINGS}
    for layer in layers:
        merged.update(layer)
    return merged


def build(values: Values, data_dir_needed: bool = True) -> StandaloneOptions:
    """The options `values` (from `merge`) describe.

    Raises:
        ConfigurationError: no data directory (when needed), half of the TLS files, a write
            cache too small for two entries, or what the dataclasses check across settings.
    """
    fields: dict[str, dict[str, Any]] = {BROKER: {}, STANDALONE: {}, TLS: {}, STORAGE: {}}
    for setting, each in values.items():
        fields[setting.target][setting.field] = each.value
    standalone = fields[STANDALONE]
    if standalone["data_dir"] is None:
        if data_dir_needed:
            raise ConfigurationError("no data directory: give --data-dir, dataDir in the "
                                     f"--config-file or {ENV_PREFIX}dataDir")
        standalone["data_dir"] = ""
    return StandaloneOptions(config=BrokerConfig(**fields[BROKER]), tls=_tls(fields[TLS]),
                             storage=_storage(fields[STORAGE]), **standalone)


def _tls(fields: dict[str, Any]) -> TlsOptions | None:
    cert, key = fields["cert_file"], fields["key_file"]
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigurationError("TLS needs both --tls-cert-file and --tls-key-file "
                                 "(tlsCertificateFilePath, tlsKeyFilePath)")
    return TlsOptions(**fields)


def _storage(fields: dict[str, Any]) -> StorageConfig:
    entry, cache = fields["entry_size_bytes_max"], fields["write_cache_bytes_max"]
    if cache < 2 * entry:
        raise ConfigurationError(
            f"dbStorage_writeCacheMaxSizeMb must hold two entries of entrySizeBytesMax "
            f"({entry} bytes): at least {math.ceil(2 * entry / MiB)}, not {cache / MiB:g}")
    record = max(StorageConfig.journal_record_bytes_max, entry + _RECORD_ROOM_BYTES)
    return StorageConfig(**fields, journal_record_bytes_max=record)


def render(values: Values) -> str:
    """`--print-config`: every setting as a config file line, after comment lines saying
    what it means, its unit, what is allowed, its default and where its value came from."""
    lines = ["# magnetar standalone settings, in --config-file format. Precedence: default <",
             f"# --config-file < environment ({ENV_PREFIX}<key>) < --config < flags."]
    for title, group in SECTIONS:
        lines += ["", f"### {title}"]
        for setting in group:
            lines += ["", *_describe(setting, values[setting]),
                      f"{setting.key}={setting.show(values[setting].value)}"]
    return "\n".join(lines)


def _describe(setting: Setting, value: Value) -> list[str]:
    """Comment lines: the meaning (wrapped), then one line of unit, allowed values, default,
    source and whose key it is."""
    meaning = setting.meaning[0].upper() + setting.meaning[1:] + "."
    facts = [f"Unit: {setting.unit}."] if setting.unit else []
    facts += [f"Allowed: {setting.allowed()}.",
              f"Default: {setting.show(setting.default) or '(empty)'}."]
    if value.source != DEFAULT:
        facts.append(f"Set by {value.source}.")
    if not setting.pulsar:
        facts.append("(Magnetar's own key.)")
    return [*textwrap.wrap(meaning, width=96, initial_indent="# ", subsequent_indent="# ",
                           break_on_hyphens=False), "# " + " ".join(facts)]
