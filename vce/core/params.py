"""Read `params.yaml` sections into validated, frozen pydantic models; errors name the key.

`params.yaml` is the ONE source of parameter values: the `Section` classes declare types,
ranges (`Field(ge=…)`), literals and cross-field rules, but no defaults. A key missing from
the file is an error, so no value in the code can silently change a result (issue 13 offered
"defaults generated from the file" as the alternative; one source is simpler to hold). To add a
knob: a field without default in its section's class, and the key with a one-line comment in
`params.yaml` (tests/test_params.py fails on either alone). Validation is pydantic's, not
hand-written `check()` methods: types, `Field(ge=…)` ranges and `Literal` choices are declared
once, where the field is; only cross-field rules are model validators (`Section.require`).

Each stage reads its sections once, before any heavy work:
``cfg = load_section("params.yaml", "train", TrainParams)`` or
``params = load_params(path); cfg = from_dict(TrainParams, params["train"], "train")``.
Every problem is one `ParamsError` line naming the full key path and what is allowed::

    train.lr_head = inf: must be a finite number
    missing key train.lr_head in params
    unknown key train.epoch; known keys: [augment, batch_size, …]
    train.augment.rotation = '1e-3': a string, not a number: write 1.0e-3 (YAML reads 1e-3 as text)
    params.yaml: unknown top-level key 'epochs'; known sections: [base, demo, data, …]

`load_params` also rejects duplicate keys (YAML would keep the last silently), unknown and
missing sections. Models are frozen; derive a changed copy with `Section.replace(**changes)`,
which validates like the file does.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Annotated

import pydantic
import yaml
from pydantic import AfterValidator, ConfigDict, Field

from vce.core.errors import ParamsError

__all__ = [
    "BaseParams", "FieldError", "MAX_SEED", "OddInt", "ParamsError", "PostParams", "SECTIONS", "ScoreParams", "Seed", "Section",
    "explain",
    "from_dict", "load_params", "load_section", "require",
]


class FieldError(ValueError):
    """Raised inside a model validator: `key` is relative to the model (``"fold"``)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key
        self.message = message


class Section(pydantic.BaseModel):
    """One section (or nested mapping) of params.yaml: no unknown keys, no coercion, finite floats."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    @staticmethod
    def require(condition: bool, key: str, message: str) -> None:
        """In a model validator: fail naming `key` (relative to this model) unless `condition`."""
        if not condition:
            raise FieldError(key, message)

    def replace(self, **changes):
        """A validated copy with `changes` applied (ValidationError → caller's bug, not the user's)."""
        return type(self).model_validate({**self.model_dump(), **changes})


def _odd(value: int) -> int:
    if value % 2 == 0:
        raise ValueError("must be an odd integer")
    return value


# An odd integer >= 1 (median windows, convolution kernels: centred on the frame).
OddInt = Annotated[int, Field(ge=1), AfterValidator(_odd)]


# A seed every generator takes: numpy's legacy / scikit-learn `random_state` stop at 2**32 - 1 and
# torch at 2**64 - 1; 2**31 - 1 leaves room for the offsets derived seeds add (`seed + 1 + fold`).
MAX_SEED = 2**31 - 1
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]


class BaseParams(Section):
    """`base`: what every stage shares."""

    seed: Seed
    exact_cpu: bool


class PostParams(Section):
    """`post`: which probabilities feed thresholds, events and report (auto: per label, `vce.infer.route`)."""

    probs: typing.Literal["frame", "temporal", "auto"]
    route_min_gain: Annotated[float, Field(ge=0, le=1)]
    route_confidence: Annotated[float, Field(ge=0.5, lt=1)]
    route_block_frames: Annotated[int, Field(ge=1)]
    route_replicates: Annotated[int, Field(ge=0)]
    route_regions_together: bool
    route_min_positive_blocks: Annotated[int, Field(ge=1)]


class ScoreParams(Section):
    """`score`: what is scored besides the validation events (stages score and report)."""

    test_gt: str | None


# Every top-level section of params.yaml; `load_params` rejects any other and any missing.
SECTIONS = (
    "base", "demo", "data", "split", "cache", "model", "loss", "prompts", "train", "predict",
    "ensemble", "temporal", "post", "thresholds", "events", "report", "score",
)


# ----------------------------------------------------------------------------- the YAML file


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated in one mapping (plain YAML keeps the last)."""


def _construct_mapping(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: keys merged in, which explicit keys override
            continue
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, (str, int, float, bool)) and key is not None:
            raise ParamsError(f"a {type(key).__name__} used as a key at line {key_node.start_mark.line + 1}: "
                              "keys are names")
        if key in seen:
            raise ParamsError(
                f"duplicate key {key!r} at line {key_node.start_mark.line + 1} "
                f"(first at line {seen[key] + 1}): each key may appear once")
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

# Values the YAML may expand to through aliases (params.yaml: ~700). An alias bomb (1 KB of
# nested `*a` lists expanding to millions) cost 18 s and 1.1 GB in validation before its error.
MAX_YAML_VALUES = 100_000


def _expanded_size(node, sizes: dict) -> int:
    """How many values `node` expands to, each alias counted as often as it is used (memoised:
    the cost is the file's size, not the expansion's)."""
    if id(node) not in sizes:
        sizes[id(node)] = 1  # a cycle (an alias inside its own anchor) counts once
        children = node.value if isinstance(node, yaml.SequenceNode) else \
            [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else []
        sizes[id(node)] = 1 + sum(_expanded_size(child, sizes) for child in children)
    return sizes[id(node)]


def _load_yaml(text: str):
    """The document of `text` (unique keys), refused before construction when its aliases
    expand to more than MAX_YAML_VALUES values."""
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node, {})
        if size > MAX_YAML_VALUES:
            raise ParamsError(f"its aliases expand to {size:,} values (more than {MAX_YAML_VALUES:,}): "
                              "an alias used inside another alias's list, many times over?")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_params(path: str | Path = "params.yaml", sections=SECTIONS) -> dict:
    """The whole file as a dict, after the root check (known sections, all present, no repeats)
    and the `base` section's, which every stage shares."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"params file not found: {path}")
    try:
        params = _load_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ParamsError(f"{path}: not UTF-8 text (byte {err.object[err.start]:#04x} at offset {err.start})") from None
    except ParamsError as err:
        raise ParamsError(f"{path}: {err}") from None
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(params, dict):
        raise ParamsError(f"{path}: expected a mapping of sections at the top level")
    unknown = [key for key in params if key not in sections]
    if unknown:
        raise ParamsError(f"{path}: unknown top-level key {unknown[0]!r}; known sections: "
                          f"[{', '.join(sections)}]")
    missing = [key for key in sections if key not in params]
    if missing:
        raise ParamsError(f"{path}: missing section '{missing[0]}'")
    if "base" in sections:  # what every stage shares (the seed, the numerics every stage runs under)
        from_dict(BaseParams, params["base"], "base")
    return params


# ----------------------------------------------------------------------------- validation


def _is_model(annotation) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel)


def _key_path(cls, loc) -> tuple[str, type | None]:
    """`loc` as a key path (``augment.rotation``, ``templates[0]``) and the model it ends in."""
    path, annotation = "", cls
    for part in loc:
        origin = typing.get_origin(annotation)
        if _is_model(annotation):
            field = annotation.model_fields.get(part)
            if field is None:  # an extra key, or a validator's key relative to the model
                path += f".{part}"
                annotation = None
                continue
            path += f".{part}"
            annotation = field.annotation
        elif origin in (list, tuple):
            path += f"[{part}]"
            annotation = (typing.get_args(annotation) or (None,))[0]
        elif origin is dict:
            path += f".{part}"
            annotation = (typing.get_args(annotation) or (None, None))[1]
        elif origin in (typing.Union, types.UnionType):
            continue  # pydantic's union member tag, not a key
        else:
            path += f".{part}"
    return path, annotation


def _owner(cls, loc):
    """The model holding the last key of `loc` (for the list of known keys)."""
    annotation = cls
    for part in loc[:-1]:
        annotation = _key_path(annotation, (part,))[1] if _is_model(annotation) else None
        while typing.get_origin(annotation) in (list, tuple, dict, typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[-1] if args else None
    return annotation if _is_model(annotation) else None


def _looks_numeric(value) -> bool:
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def explain(error: dict) -> str:
    """What the value must be, in words, for one pydantic error."""
    kind, ctx, value = error["type"], error.get("ctx", {}), error.get("input")
    if _looks_numeric(value) and kind in ("float_type", "int_type"):
        mantissa, _, exponent = value.lower().partition("e")
        if exponent and "." not in mantissa:  # YAML 1.1 reads 1e-3 as text, 1.0e-3 as a number
            return f"a string, not a number: write {float(mantissa):.1f}e{exponent} (YAML reads {value} as text)"
        return "a string, not a number: write it without quotes"
    bounds = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"must be {bounds[kind]} {limit}"
    words = {
        "finite_number": "must be a finite number",
        "float_type": "must be a number",
        "int_type": "must be an integer",
        "bool_type": "must be true or false",
        "string_type": "must be a string",
        "list_type": "must be a list",
        "dict_type": "must be a mapping",
        "model_type": "must be a mapping",
        "model_attributes_type": "must be a mapping",
        "none_required": "must be null",
        "too_short": f"must have at least {ctx.get('min_length')} item(s)",
        "too_long": f"must have at most {ctx.get('max_length')} item(s)",
        "string_too_short": "must not be empty",
    }
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}"
    if kind == "value_error" and isinstance(ctx.get("error"), FieldError):
        return ctx["error"].message
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return words.get(kind, error["msg"])


def _message(cls, section: str, error: dict, values) -> str:
    loc = tuple(error["loc"])
    if error["type"] == "value_error" and isinstance(error.get("ctx", {}).get("error"), FieldError):
        relative = error["ctx"]["error"].key.split(".")
        loc = loc + tuple(int(part) if part.isdigit() else part for part in relative)
    path, _ = _key_path(cls, loc)
    key = f"{section}{path}"
    if error["type"] == "missing":
        return f"missing key {key} in params"
    if error["type"] == "extra_forbidden":
        owner = _owner(cls, loc)
        known = f"; known keys: [{', '.join(sorted(owner.model_fields))}]" if owner else ""
        return f"unknown key {key}{known}"
    value = error.get("input")
    if error["type"] == "value_error" and isinstance(error.get("ctx", {}).get("error"), FieldError):
        value = _lookup(values, loc)
    shown = "" if value is _MISSING or _is_model(type(value)) else f" = {_short(value)}"
    return f"{key}{shown}: {explain(error)}"


_MISSING = object()


def _lookup(values, loc):
    for part in loc:
        try:
            values = values[part]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return values


def _short(value) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def from_dict(cls, values: dict, section: str):
    """Validate `values` as model `cls`; any problem → one ParamsError line naming `section.key`."""
    if not isinstance(values, dict):
        shown = "empty" if values is None else f"a {type(values).__name__}"
        raise ParamsError(f"params section '{section}' must be a mapping of keys, not {shown}")
    try:
        return cls.model_validate(values)
    except pydantic.ValidationError as err:
        errors = err.errors(include_url=False)
        first = next((e for e in errors if e["type"] != "missing"), errors[0])
        if errors[0]["type"] == "missing":  # a missing key first: it explains what follows
            first = errors[0]
        raise ParamsError(_message(cls, section, first, values)) from None


def load_section(path, section: str, cls, **overrides):
    """Validate the whole file's root, then one section as `cls` (with `overrides` of its keys).

    A nested mapping in `overrides` is merged one level down (``augment={"rotation": 0.0}``
    keeps the file's other augment keys): benchmarks and tests change a knob, never a default.
    """
    values = load_params(path)[section]
    if not isinstance(values, dict):
        return from_dict(cls, values, section)  # its one-line error
    values = dict(values)
    for key, value in overrides.items():
        nested = isinstance(value, dict) and isinstance(values.get(key), dict)
        values[key] = {**values[key], **value} if nested else value
    return from_dict(cls, values, section)


def require(condition: bool, key: str, message: str) -> None:
    """Raise ParamsError('key: message') unless `condition` holds (checks outside a model)."""
    if not condition:
        raise ParamsError(f"{key}: {message}")
