"""Loading a config: profile defaults, then a YAML file, then overrides, merged once (`load_config`);
`${VAR}` expanded from the environment; every problem reported with its field path and fix
(`ConfigValidationError`)."""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import ValidationError

from spogw_dagster.pipeline.profiles import get_profile, profile_names
from spogw_dagster.pipeline.settings.config import SpogwConfig
from spogw_dagster.pipeline.settings.sections import ComparisonSection


class ConfigValidationError(ValueError):
    """The configuration is invalid; the message lists every problem with its field path."""


_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_env(obj: Any, where: str = "") -> Any:
    """Replace ${VAR} in strings by the environment variable; a missing one is a clear error."""
    if isinstance(obj, dict):
        return {k: _expand_env(v, f"{where}.{k}" if where else str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_expand_env(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, str):
        def sub(m: re.Match) -> str:
            name = m.group(1)
            if name not in os.environ:
                raise ConfigValidationError(f"{where}: environment variable {name} is not set; fix: export {name}=...")
            return os.environ[name]

        return _ENV.sub(sub, obj)
    return obj


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _fields_at(loc: tuple) -> list[str]:
    """The field names of the section at `loc` (a path of section names from the top)."""
    model: Any = SpogwConfig
    for part in loc:
        model = model.model_fields[part].annotation
    return sorted(model.model_fields)


def _format_errors(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(config)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown field; valid fields here: {', '.join(_fields_at(err['loc'][:-1]))}"
        got = err.get("input")
        extra = f" (got {got!r})" if err["type"] not in ("value_error",) and not isinstance(got, dict) else ""
        lines.append(f"  {loc}: {msg}{extra}")
    return "invalid configuration:\n" + "\n".join(lines)


def parse_config(data: Mapping[str, Any]) -> SpogwConfig:
    """Validate a full mapping (after profile merging); raise ConfigValidationError with every problem."""
    try:
        return SpogwConfig.model_validate(_expand_env(dict(data)))
    except ValidationError as e:
        raise ConfigValidationError(_format_errors(e)) from None


def load_config(
    profile: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SpogwConfig:
    """Profile defaults, then the YAML file (which may name its own `profile:` to start from), then overrides.

    With neither a profile nor a file, the `tiny` profile is used."""
    file_data: dict[str, Any] = {}
    if config_file is not None:
        p = Path(config_file).expanduser()
        if not p.is_file():
            raise ConfigValidationError(f"config file {p} does not exist")
        try:
            loaded = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigValidationError(f"config file {p} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigValidationError(f"config file {p} must hold a mapping at the top level, got {type(loaded).__name__}")
        file_data = loaded
    name = profile or file_data.get("profile") or ("custom" if config_file and not file_data.get("profile") else "tiny")
    if profile and file_data.get("profile") and file_data["profile"] != profile:
        raise ConfigValidationError(
            f"--profile {profile!r} conflicts with `profile: {file_data['profile']}` in {config_file}; give one")
    base = get_profile(name) if name != "custom" else {}
    if base is None:
        raise ConfigValidationError(f"unknown profile {name!r}; choose one of {', '.join(profile_names())}, "
                                    "or pass a YAML file with --config")
    # each layer's old names first, so a file's `objectives` and an override's `methods` merge as one key
    data = deep_merge(base, _renamed(file_data))
    data = deep_merge(data, _renamed(dict(overrides or {})))
    data["profile"] = name
    return parse_config(data)


def _renamed(layer: dict[str, Any]) -> dict[str, Any]:
    """`layer` with `comparison.objectives` (the old name) read as `comparison.methods`."""
    comp = layer.get("comparison")
    if not isinstance(comp, dict) or "objectives" not in comp:
        return layer
    try:
        return {**layer, "comparison": ComparisonSection._old_name(comp)}
    except ValueError as e:
        raise ConfigValidationError(str(e)) from None
