"""Read `params.yaml` sections into typed dataclasses, with errors that name the key.

Each stage reads its section once: ``cfg = load_section("params.yaml", "train", TrainParams)``.
Unknown keys, missing keys and wrong types fail before any heavy work, naming
``section.key`` and what is allowed.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path

import yaml

from vce.core.errors import ParamsError

__all__ = ["ParamsError", "from_dict", "load_params", "load_section", "require"]




def load_params(path: str | Path = "params.yaml") -> dict:
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file not found: {path}")
    try:
        params = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(params, dict):
        raise ParamsError(f"{path}: expected a mapping of sections at the top level")
    return params


def _coerce(value, annotation, key: str):
    """Check `value` against a simple annotation (int, float, str, bool, list, Optional, Literal)."""
    if dataclasses.is_dataclass(annotation):
        return from_dict(annotation, value, key)
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        allowed = typing.get_args(annotation)
        if value not in allowed:
            raise ParamsError(f"{key} = {value!r}: must be one of {list(allowed)}")
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ParamsError(f"{key} = {value!r}: must be a list")
        (item_type, *_) = typing.get_args(annotation) or (typing.Any,)
        return [_coerce(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ParamsError(f"{key} = {value!r}: must be a mapping")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{key} = {value!r}: must be true or false")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"{key} = {value!r}: must be an integer")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ParamsError(f"{key} = {value!r}: must be a number")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ParamsError(f"{key} = {value!r}: must be a string")
        return value
    return value


def from_dict(cls, values: dict, section: str):
    """Build dataclass `cls` from `values`, validating names and types; then run `cls.check()`."""
    if not isinstance(values, dict):
        raise ParamsError(f"params section '{section}' must be a mapping")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ParamsError(
            f"unknown key(s) in '{section}': {unknown}; known keys: {sorted(fields)}"
        )
    kwargs = {}
    for name, field in fields.items():
        key = f"{section}.{name}"
        if name in values:
            kwargs[name] = _coerce(values[name], hints[name], key)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ParamsError(f"missing key {key} in params")
    obj = cls(**kwargs)
    check = getattr(obj, "check", None)
    if check is not None:
        check(section)
    return obj


def load_section(path, section: str, cls):
    params = load_params(path)
    if section not in params:
        raise ParamsError(f"{path}: no '{section}' section")
    return from_dict(cls, params[section], section)


def require(condition: bool, key: str, message: str) -> None:
    """Raise ParamsError('key = ...: message') unless `condition` holds."""
    if not condition:
        raise ParamsError(f"{key}: {message}")
