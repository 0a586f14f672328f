"""Every knob is described once: by the comment on its own line in params.yaml, nowhere else.

The rules, as this file holds them:

(a) A *knob* is a key of params.yaml whose value is not a nested block of keys: a scalar, a list
    (flow `[…]` or block `- …` items) or a flow mapping (`{}`). Each knob carries exactly one
    comment, trailing on the key's own line, with some text after the `#`; the items of a block
    list need none (the key's line describes the list). A key that opens a nested block
    (`train:`, `augment:`, `engine:`) may carry a comment but need not. Comment-only lines are
    allowed only in the file's header, before the first key, so no knob's description runs on to
    a second line or floats between keys.
(b) No field of a `Section` subclass (vce.core.params.Section, directly or through another
    subclass) anywhere in vce/ carries a comment on its declaration lines: the type and range
    are the code's, the description is params.yaml's. Private attributes (`_name`) are not
    fields.
(c) A comment in params.yaml names only things that exist: a repository path (`vce/…`,
    `stages/…`, `bench/…`, `tests/…`, `docs/…`, `recipes/…`) must be a file or folder, and a
    dotted name `vce.x.y` must be a module, or a module and one name defined in it.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"

# ----------------------------------------------------------------------------- params.yaml


def _comment_after(text: str) -> str | None:
    """The comment in `text` (a line's rest after its YAML content), without the `#`, or None."""
    index = text.find("#")
    return None if index < 0 else text[index + 1:].strip()


def yaml_comments(source: str) -> tuple[dict[int, str], list[tuple[str, int, bool]]]:
    """(line → comment text, [(key path, line, is_knob)]) of a params file; lines 0-based.

    A line's YAML content ends at the last key or scalar / flow collection ending on it; what
    follows is its trailing comment. Lines with no content are comment-only (or blank).
    """
    lines = source.split("\n")
    root = yaml.compose(source, Loader=yaml.SafeLoader)
    content_end: dict[int, int] = {}
    keys: list[tuple[str, int, bool]] = []

    def mark(node) -> None:
        line, column = node.end_mark.line, node.end_mark.column
        content_end[line] = max(content_end.get(line, 0), column)

    def walk(node, path: str) -> None:
        if isinstance(node, yaml.ScalarNode) or getattr(node, "flow_style", False):
            mark(node)
            return
        if isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, f"{path}[{i}]")
            return
        for key, value in node.value:
            mark(key)
            name = f"{path}.{key.value}" if path else key.value
            is_group = isinstance(value, yaml.MappingNode) and value.value and not value.flow_style
            keys.append((name, key.start_mark.line, not is_group))
            walk(value, name)

    walk(root, "")
    comments = {}
    for number, text in enumerate(lines):
        if number in content_end:
            comment = _comment_after(text[content_end[number]:])
        else:
            comment = _comment_after(text) if text.lstrip().startswith("#") else None
        if comment is not None:
            comments[number] = comment
    return comments, keys


def knob_comment_problems(source: str) -> list[str]:
    """Rule (a): what is wrong with the knobs' comments of a params file (empty: nothing)."""
    comments, keys = yaml_comments(source)
    lines = source.split("\n")
    problems = [f"{name} (line {line + 1}): no comment on its line"
                for name, line, is_knob in keys if is_knob and not comments.get(line)]
    first_key = min(line for _, line, _ in keys)
    problems += [f"line {number + 1}: a comment-only line after the header ({lines[number].strip()!r}); "
                 "describe a knob on its own line" for number in comments
                 if number > first_key and lines[number].lstrip().startswith("#")]
    return problems


PATH = re.compile(r"(?<![\w./-])((?:vce|stages|bench|tests|docs|recipes)/[\w./-]*)")
DOTTED = re.compile(r"(?<![\w./-])(vce(?:\.\w+)+)")


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _defines(module: Path, name: str) -> bool:
    tree = ast.parse(module.read_text())
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return True
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return True
    return False


def missing_references(comment: str) -> list[str]:
    """Rule (c): the paths and dotted vce names in one comment that do not exist."""
    missing = []
    for found in PATH.findall(comment):
        path = found.rstrip(".,;:")
        if not (ROOT / path).exists():
            missing.append(path)
    for found in DOTTED.findall(comment):
        parts = found.split(".")
        if _module_file(parts):
            continue
        module = _module_file(parts[:-1])
        if module is None or not _defines(module, parts[-1]):
            missing.append(found)
    return missing


def test_every_knob_has_one_comment_on_its_line():
    assert knob_comment_problems(PARAMS.read_text()) == []


def test_the_rule_finds_a_knob_without_comment_and_a_comment_on_a_second_line():
    source = ("# header: allowed\n"
              "train:                # a group may have one\n"
              "  epochs: 8           # a knob with its comment\n"
              "  lr: 0.1\n"
              "  hue: 0.02           #\n"
              "  # a description that floats between keys\n"
              "  folds: [0]          # flow list: one line\n"
              "  templates:          # block list: the key line describes it\n"
              "    - \"a # inside quotes is no comment\"\n"
              "  augment:\n"
              "    flip: 0.5         # nested knob\n"
              "    erase: 0.25\n"
              "  per_label: {}       # an empty mapping is a knob\n"
              "  name: 'a#b'\n")
    assert knob_comment_problems(source) == [
        "train.lr (line 4): no comment on its line",
        "train.hue (line 5): no comment on its line",
        "train.augment.erase (line 12): no comment on its line",
        "train.name (line 14): no comment on its line",
        "line 6: a comment-only line after the header ('# a description that floats between "
        "keys'); describe a knob on its own line",
    ]


def test_the_knobs_are_the_leaves_of_params_yaml():
    """The rule's notion of a knob matches the file: every leaf value, and nothing else."""
    params = yaml.safe_load(PARAMS.read_text())

    def leaves(mapping, prefix=""):
        for key, value in mapping.items():
            name = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                yield from leaves(value, name + ".")
            else:
                yield name

    _, keys = yaml_comments(PARAMS.read_text())
    assert sorted(name for name, _, is_knob in keys if is_knob) == sorted(leaves(params))


def test_params_comments_name_only_existing_paths_and_modules():
    comments, _ = yaml_comments(PARAMS.read_text())
    missing = {number + 1: found for number, text in comments.items()
               if (found := missing_references(text))}
    assert missing == {}


@pytest.mark.parametrize("comment, missing", [
    ("sequence model (stage temporal; vce/temporal.py)", ["vce/temporal.py"]),
    ("sequence model (stage temporal; vce/infer/temporal.py)", []),
    ("the score engine (vce.post.nowhere)", ["vce.post.nowhere"]),
    ("the resize filter, vce.data.frames.resize_frame, bench/predict.py.", []),
    ("vce.data.frames.no_such_name", ["vce.data.frames.no_such_name"]),
    ("+16.7 % block params (docs/training.md); see docs/nowhere.md", ["docs/nowhere.md"]),
])
def test_references_are_checked(comment, missing):
    assert missing_references(comment) == missing


# ----------------------------------------------------------------------------- Section fields


def _base_names(node: ast.ClassDef) -> set[str]:
    return {b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
            if isinstance(b, (ast.Name, ast.Attribute))}


def section_field_comments(files: dict[str, str]) -> tuple[set[str], list[str]]:
    """({Section subclass names}, ["file:line: Class.field: # comment"]) over {path: source}."""
    trees = {path: ast.parse(source) for path, source in files.items()}
    classes = [(path, node) for path, tree in trees.items() for node in ast.walk(tree)
               if isinstance(node, ast.ClassDef)]
    sections, grew = {"Section"}, True
    while grew:  # subclasses of subclasses, across modules
        grew = False
        for _, node in classes:
            if node.name not in sections and _base_names(node) & sections:
                sections.add(node.name)
                grew = True
    found = []
    for path, node in classes:
        if node.name not in sections or node.name == "Section":
            continue
        comments = {tok.start[0]: tok.string
                    for tok in tokenize.generate_tokens(io.StringIO(files[path]).readline)
                    if tok.type == tokenize.COMMENT}
        for statement in node.body:
            if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
                continue
            name = statement.target.id
            if name.startswith("_") or "ClassVar" in ast.unparse(statement.annotation):
                continue
            found += [f"{path}:{line}: {node.name}.{name}: {comments[line]}"
                      for line in range(statement.lineno, statement.end_lineno + 1) if line in comments]
    return sections - {"Section"}, found


def _vce_sources() -> dict[str, str]:
    return {path.relative_to(ROOT).as_posix(): path.read_text()
            for path in sorted((ROOT / "vce").rglob("*.py"))}


def test_no_section_field_carries_a_description():
    files = _vce_sources()
    sections, found = section_field_comments(files)
    assert {"TrainParams", "DataParams", "EventParams", "ThresholdParams", "AugmentParams"} <= sections
    assert found == []


def test_the_field_rule_finds_a_comment_through_a_subclass_and_a_continuation_line():
    files = {
        "vce/a.py": ("from vce.core.params import Section\n"
                     "class Base(Section):\n"
                     "    seed: int  # described here\n"
                     "    _cache: dict = {}  # private: not a field\n"),
        "vce/b.py": ("from vce import a\n"
                     "class Child(a.Base):\n"
                     "    rate: float = Field(\n"
                     "        ge=0)  # a continuation line\n"
                     "    # a comment above a field is the code's own\n"
                     "    size: int\n"
                     "class Other:\n"
                     "    x: int  # not a Section\n"),
    }
    sections, found = section_field_comments(files)
    assert sections == {"Base", "Child"}
    assert found == ["vce/a.py:3: Base.seed: # described here",
                     "vce/b.py:4: Child.rate: # a continuation line"]


# --- params.yaml in the form DVC writes --------------------------------------------------------------

def test_params_yaml_is_already_in_the_form_dvc_exp_run_writes(tmp_path):
    # `dvc exp run -S` rewrites the whole file through ruamel (dvc.utils.hydra.apply_overrides):
    # kept in that form, a workspace experiment changes only the values it sets.
    from dvc.utils.hydra import apply_overrides

    copy = tmp_path / "params.yaml"
    copy.write_text((ROOT / "params.yaml").read_text())
    apply_overrides(str(copy), ["base.seed=42"])
    assert copy.read_text() == (ROOT / "params.yaml").read_text()


@pytest.mark.parametrize("override, line", [("events.median_window=5", "  median_window: 5 "),
                                            ("data.test_root=null", "  test_root: ")])
def test_an_override_changes_exactly_the_line_of_its_key(tmp_path, override, line):
    from dvc.utils.hydra import apply_overrides

    before = (ROOT / "params.yaml").read_text().splitlines()
    copy = tmp_path / "params.yaml"
    copy.write_text("\n".join(before) + "\n")
    apply_overrides(str(copy), [override])
    after = copy.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith(line), changed
