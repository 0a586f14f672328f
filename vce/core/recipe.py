"""Named recipes: a set of params.yaml overrides kept in `recipes/<name>.yaml`, as one switch.

    dvc exp run $(python -m vce.core.recipe seed)        # prints: -S train.epochs=5 -S …
    python -m vce.core.recipe seed --apply params.yaml   # writes the values into params.yaml

The first is DVC's own way to vary params (an experiment; `dvc exp apply` keeps it); the second
edits the file in place, value by value, keeping its comments and layout. Every key of a recipe
must already exist in params.yaml (an unknown key is a ParamsError naming it), so a recipe can only
change values, never invent knobs; the stages validate the values as they validate the file.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

from vce.core import runner
from vce.core.errors import ParamsError
from vce.core.io import write_text

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def load_recipe(name: str, folder: Path = RECIPES) -> dict[str, object]:
    """{"section.key": value} of recipes/<name>.yaml (nested mappings flattened)."""
    path = folder / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ParamsError(f"recipe {name!r}: no {path}; known recipes: {known}")
    return flatten(yaml.safe_load(path.read_text()) or {})


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_keys(overrides: dict[str, object], params: dict) -> None:
    """Every override names a key params.yaml already has."""
    known = flatten(params)
    unknown = [key for key in overrides if key not in known]
    if unknown:
        raise ParamsError(f"recipe key {unknown[0]} is not in params.yaml (a recipe only changes existing values)")


def scalar(value) -> str:
    """The YAML (and DVC/Hydra override) spelling of a value, one line."""
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def dvc_flags(overrides: dict[str, object]) -> list[str]:
    """`-S section.key=value` arguments for `dvc exp run` (no spaces: safe in $(…))."""
    flags = []
    for key, value in overrides.items():
        text = scalar(value)
        if any(c.isspace() for c in text):
            raise ParamsError(f"recipe key {key}: value {text!r} has spaces; not expressible as one -S flag")
        flags += ["-S", f"{key}={text}"]
    return flags


_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?P<gap> *)(?P<value>[^#\n]*?)(?P<tail> *#.*)?$")


def apply(text: str, overrides: dict[str, object]) -> str:
    """params.yaml text with each override's value replaced on its own line (comments kept)."""
    lines, path, done = text.split("\n"), [], set()
    for i, line in enumerate(lines):
        match = _LINE.match(line)
        if not match:
            continue
        depth = len(match["indent"]) // 2
        path = path[:depth] + [match["key"]]
        key = ".".join(path)
        if key in overrides and match["value"].strip():
            value = scalar(overrides[key])
            width = len(match["gap"]) + len(match["value"])
            lines[i] = f"{match['indent']}{match['key']}:{match['gap'] or ' '}{value.ljust(width - len(match['gap']))}" \
                       f"{match['tail'] or ''}".rstrip()
            done.add(key)
    missing = [key for key in overrides if key not in done]
    if missing:
        raise ParamsError(f"recipe key {missing[0]}: no one-line value to replace in params.yaml")
    return "\n".join(lines)


@runner.stage
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__.splitlines()[0])
    parser.add_argument("name", help="recipe: recipes/<name>.yaml")
    parser.add_argument("--params", default="params.yaml", help="the params file the keys must exist in")
    parser.add_argument("--apply", metavar="PATH", help="write the values into this params file instead of printing flags")
    args = parser.parse_args(argv)
    overrides = load_recipe(args.name)
    check_keys(overrides, yaml.safe_load(Path(args.params).read_text()))
    if not args.apply:
        print(" ".join(dvc_flags(overrides)))
        return 0
    target = Path(args.apply)
    changed = apply(target.read_text(), overrides)
    write_text(target, changed)  # atomically: a full disk never leaves half a params file
    print(f"{target}: {len(overrides)} values of recipe {args.name!r} written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
