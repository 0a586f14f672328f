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
import copy
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


_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_]+):(?P<rest>( .*)?)$")


def _split_value(rest: str) -> tuple[str, str, str] | None:
    """(gap, value, tail) of what follows `key:` on a line: the value ends where a comment
    starts (a `#` after whitespace, outside quotes), so `"local-dir:/m/bc#1"  # c` keeps its `#1`.
    None where the value is not one scalar on this line (an unclosed quote)."""
    body = rest.lstrip(" ")
    gap = rest[: len(rest) - len(body)]
    if body[:1] in ("'", '"'):
        quote, i = body[0], 1
        while i < len(body):
            if quote == '"' and body[i] == "\\":
                i += 2
                continue
            if body[i] == quote:
                if quote == "'" and body[i + 1: i + 2] == "'":  # '' is a quote inside single quotes
                    i += 2
                    continue
                break
            i += 1
        else:
            return None
        end = i + 1
    else:
        found = re.search(r"\s#", body)
        end = found.start() if found else len(body)
    value = body[:end].rstrip()
    return gap, value, body[len(value):]


def _expected(tree: dict, overrides: dict[str, object]) -> dict:
    """`tree` (a deep copy) with each dotted override set."""
    tree = copy.deepcopy(tree)
    for key, value in overrides.items():
        node, *parts = [tree, *key.split(".")]
        for part in parts[:-1]:
            node = node[part]
        node[parts[-1]] = value
    return tree


def apply(text: str, overrides: dict[str, object], where: str = "params.yaml") -> str:
    """params.yaml text with each override's value replaced on its own line (comments, layout and
    any indentation width kept). The result is parsed back and must equal the file with exactly
    those values changed, else one line refuses it: an edit never corrupts a value."""
    lines, stack, done = text.split("\n"), [], set()
    for i, line in enumerate(lines):
        match = _LINE.match(line)
        if not match:
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        key = ".".join(k for _, k in stack)
        parts = _split_value(match["rest"]) if key in overrides else None
        if parts is None or not parts[1] or parts[1][0] in "|>&*!":
            continue
        gap, old, tail = parts
        value = scalar(overrides[key])
        spaces = len(tail) - len(tail.lstrip(" "))
        if tail and len(value) > len(old):  # keep the comment's column while a space is left
            tail = tail[min(len(value) - len(old), spaces - 1):]
        lines[i] = f"{match['indent']}{match['key']}:{gap or ' '}{value.ljust(len(old))}{tail}".rstrip()
        done.add(key)
    missing = [key for key in overrides if key not in done]
    if missing:
        raise ParamsError(f"recipe key {missing[0]}: no one-line value to replace in {where}")
    changed = "\n".join(lines)
    try:
        ok = yaml.safe_load(changed) == _expected(yaml.safe_load(text), overrides)
    except yaml.YAMLError:
        ok = False
    if not ok:
        raise ParamsError(f"{where}: writing the recipe's values line by line would change more than those values "
                          "(an unusual layout); set them by hand")
    return changed


def read_params_text(path: Path) -> str:
    """The text of a params file; a non-UTF-8 byte is one line naming the file and its offset."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ParamsError(f"{path}: not UTF-8 (byte {data[err.start]:#04x} at offset {err.start})") from None


@runner.stage
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=runner.module_prog(__spec__), description=__doc__.splitlines()[0])
    parser.add_argument("name", help="recipe: recipes/<name>.yaml")
    parser.add_argument("--params", default="params.yaml", help="the params file the keys must exist in")
    parser.add_argument("--apply", metavar="PATH", help="write the values into this params file instead of printing flags")
    args = parser.parse_args(argv)
    overrides = load_recipe(args.name)
    check_keys(overrides, yaml.safe_load(read_params_text(Path(args.params))))
    if not args.apply:
        print(" ".join(dvc_flags(overrides)))
        return 0
    target = Path(args.apply)
    changed = apply(read_params_text(target), overrides, str(target))
    write_text(target, changed)  # atomically (a full disk never leaves half a params file); a symlink stays one
    print(f"{target}: {len(overrides)} values of recipe {args.name!r} written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
