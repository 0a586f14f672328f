"""params.yaml is the one source of parameter values: every key is required, validated, named.

Removing any key, giving any float a non-finite value, or writing a wrong type / range / literal
makes the class that reads it raise one `ParamsError` line naming `section.key`; the root check
refuses stray, missing and repeated keys; and the real stages exit 2 on such a file before any
heavy work.
"""

from __future__ import annotations

import copy
import typing

import pytest
import yaml
from conftest import ROOT, load_stage, repo_params, section_params, write_params

from vce.core.params import (
    SECTIONS,
    BaseParams,
    ParamsError,
    PostParams,
    ScoreParams,
    Section,
    from_dict,
    load_params,
    load_section,
)
from vce.data.frame_cache import CacheParams
from vce.data.index import DataParams
from vce.data.split import SplitParams
from vce.demo.generate import DemoParams
from vce.eval.report import ReportParams
from vce.infer.ensemble import EnsembleParams
from vce.infer.predict import PredictParams
from vce.infer.temporal import TemporalParams
from vce.model.frame_model import ModelParams
from vce.model.prompts import PromptParams
from vce.post.events import EventParams
from vce.post.thresholds import ThresholdParams
from vce.train.losses import LossParams
from vce.train.trainer import TrainParams

# The class that reads each section of params.yaml.
READERS = {
    "base": BaseParams, "demo": DemoParams, "data": DataParams, "split": SplitParams, "cache": CacheParams,
    "model": ModelParams, "loss": LossParams, "prompts": PromptParams, "train": TrainParams,
    "predict": PredictParams, "ensemble": EnsembleParams, "temporal": TemporalParams, "post": PostParams,
    "thresholds": ThresholdParams, "events": EventParams, "report": ReportParams, "score": ScoreParams,
}


def key_paths(values: dict, prefix: str = "") -> list[str]:
    """Every key of a section, nested mappings walked (`augment.rotation`); free-form dicts not."""
    paths = []
    for key, value in values.items():
        paths.append(prefix + key)
        if isinstance(value, dict) and value and key != "per_label":
            paths += key_paths(value, f"{prefix}{key}.")
    return paths


ALL_KEYS = [(section, path) for section, values in repo_params().items() for path in key_paths(values)]


def edited(section: str, path: str, value=...) -> dict:
    """The repository's `section` with `path` removed (value ...) or set to `value`."""
    values = copy.deepcopy(repo_params()[section])
    *parents, last = path.split(".")
    target = values
    for parent in parents:
        target = target[parent]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return values


def one_error(section: str, values: dict) -> str:
    with pytest.raises(ParamsError) as err:
        from_dict(READERS[section], values, section)
    message = str(err.value)
    assert "\n" not in message
    return message


# ----------------------------------------------------------------------------- the file as a whole


def test_repository_params_load_completely():
    params = load_params(ROOT / "params.yaml")
    assert set(params) == set(SECTIONS) == set(READERS)
    for section, cls in READERS.items():
        model = from_dict(cls, params[section], section)
        assert model.model_dump() == params[section]  # every key read, nothing added or coerced away


def test_every_section_is_read_by_some_class():
    """No dead section: each is a Section subclass, and each field of the file is one of its fields."""
    for section, cls in READERS.items():
        assert issubclass(cls, Section)
        assert set(repo_params()[section]) == set(cls.model_fields), section


def test_no_params_class_has_a_default():
    """params.yaml is the only source: a default in the code could silently change a result."""
    def fields(cls):
        for name, field in cls.model_fields.items():
            yield f"{cls.__name__}.{name}", field
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, Section):
                yield from fields(annotation)

    with_defaults = [name for cls in READERS.values() for name, field in fields(cls) if not field.is_required()]
    assert with_defaults == []


# ----------------------------------------------------------------------------- (a) every key required


def test_every_missing_key_is_named():
    """One rule, every key of every section (nested ones too): removing it is one line naming it.
    The keys are looped in one test, not one test each: the rule is one, the cost is the check's."""
    assert ("train", "augment.rotation") in ALL_KEYS and len(ALL_KEYS) > 200
    wrong = {}
    for section, path in ALL_KEYS:
        message = one_error(section, edited(section, path))
        if message != f"missing key {section}.{path} in params":
            wrong[f"{section}.{path}"] = message
    assert wrong == {}


@pytest.mark.parametrize(("stage", "key"), [
    ("train", "train.lr_head"),
    ("train", "base.seed"),
    ("predict", "predict.embeddings"),
    ("temporal", "base.seed"),
    ("thresholds", "post.probs"),
    ("events", "events.median_window"),
    ("score", "score.test_gt"),
    ("split", "split.candidates"),
])
def test_stage_exits_2_naming_a_removed_key_before_any_work(tmp_path, capsys, stage, key):
    """Every input path points nowhere: only a params check can fail this early."""
    section, name = key.split(".")
    params = repo_params()
    del params[section][name]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    missing = str(tmp_path / "does-not-exist")
    flags = {
        "train": ["--frames", missing, "--prompts", missing, "--cache", missing],
        "predict": ["--model", missing, "--frames", missing, "--test", missing],
        "temporal": ["--predict-dir", missing, "--frames", missing],
        "thresholds": ["--frames", missing, "--predict-dir", missing, "--temporal-dir", missing],
        "events": ["--thresholds", missing],
        "score": ["--events", missing, "--frames", missing],
        "split": ["--index", missing],
    }[stage]
    code = load_stage(stage).main(["--params", str(tmp_path / "params.yaml"), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert f"missing key {key} in params" in err
    assert "does-not-exist" not in err


# ----------------------------------------------------------------------------- (b) finite floats


def float_keys() -> list[tuple[str, str]]:
    """Every float field of every class, nested models walked (`train.augment.rotation`)."""
    keys = []

    def walk(section, cls, prefix=""):
        for name, field in cls.model_fields.items():
            annotation = field.annotation
            if annotation is float:
                keys.append((section, prefix + name))
            elif isinstance(annotation, type) and issubclass(annotation, Section):
                walk(section, annotation, f"{prefix}{name}.")
    for section, cls in READERS.items():
        walk(section, cls)
    return keys


FLOAT_KEYS = float_keys()


def test_float_knobs_are_found():
    assert ("train", "lr_head") in FLOAT_KEYS and ("train", "augment.rotation") in FLOAT_KEYS
    assert ("temporal", "lr") in FLOAT_KEYS and ("train", "mixup_alpha") in FLOAT_KEYS
    assert len(FLOAT_KEYS) >= 40


def test_every_non_finite_float_is_refused_naming_the_key():
    """inf, -inf and nan in every float field (nested ones too), looped in one test."""
    wrong = {}
    for section, path in FLOAT_KEYS:
        for value in (float("inf"), float("-inf"), float("nan")):
            message = one_error(section, edited(section, path, value))
            if not (message.startswith(f"{section}.{path} = ") and message.endswith("must be a finite number")):
                wrong[f"{section}.{path} = {value}"] = message
    assert wrong == {}


@pytest.mark.parametrize(("section", "path"), [
    ("thresholds", "coarse_grid"), ("thresholds", "presence_thresholds"), ("demo", "region_fractions"),
])
def test_non_finite_list_item_is_refused_naming_its_index(section, path):
    values = edited(section, path, [0.5, float("nan"), 0.5, 0.5, 0.5])
    assert one_error(section, values).startswith(f"{section}.{path}[1] = nan: must be a finite number")


def test_non_finite_per_label_override_is_refused():
    values = edited("events", "per_label", {"blood": {"presence_threshold": float("inf")}})
    assert one_error("events", values) == "events.per_label.blood.presence_threshold = inf: must be a finite number"


# ----------------------------------------------------------------------------- (c) one line per mistake


@pytest.mark.parametrize(("section", "path", "value", "message"), [
    ("train", "lr_head", "1e-3", "train.lr_head = '1e-3': a string, not a number: write 1.0e-3"),
    ("train", "epochs", True, "train.epochs = True: must be an integer"),
    ("train", "epochs", 2.0, "train.epochs = 2.0: must be an integer"),
    ("train", "lr_head", False, "train.lr_head = False: must be a number"),
    ("base", "seed", "abc", "base.seed = 'abc': must be an integer"),
    ("base", "seed", -1, "base.seed = -1: must be >= 0"),
    ("train", "augment.brightness", -0.5, "train.augment.brightness = -0.5: must be >= 0"),
    ("train", "augment.rotation", float("nan"), "train.augment.rotation = nan: must be a finite number"),
    ("train", "val_batch_size", 0, "train.val_batch_size = 0: must be >= 1"),
    ("cache", "interpolation", "lanczos", "cache.interpolation = 'lanczos': must be one of 'bicubic'"),
    ("train", "device", "gpu", "train.device = 'gpu': must be one of 'auto', 'cpu' or 'cuda'"),
    ("predict", "splits", ["tset"], "predict.splits[0] = 'tset': must be one of 'train' or 'val'"),
    ("prompts", "templates", ["no placeholder"], "prompts.templates[0] = 'no placeholder': has no {label}"),
    ("prompts", "templates", [], "prompts.templates = []: must have at least 1 item"),
    ("split", "folds", [1], "split.folds = [1]: must be the fold ids 0..k-1 in order, e.g. [0] for k = 1 folds"),
    ("demo", "min_event_frames", 80, "demo.min_event_frames = 80: must be <= max_event_frames (60)"),
    ("temporal", "kernel_size", 2, "temporal.kernel_size = 2: must be an odd integer"),
    ("thresholds", "median_windows", [1, 4], "thresholds.median_windows[1] = 4: must be an odd integer"),
    ("thresholds", "coarse_grid", [0.5, 2.0], "thresholds.coarse_grid[1] = 2.0: must be in [0, off_threshold"),
    ("events", "per_label", {"blod": {}}, "events.per_label.blod = {}: unknown label"),
    ("events", "per_label", {"blood": {"gap": 1}}, "events.per_label.blood.gap = 1: unknown knob"),
    ("events", "per_label", {"blood": {"median_window": 4}},
     "events.per_label.blood.median_window = 4: must be an odd integer"),
    ("score", "test_gt", 3, "score.test_gt = 3: must be a string"),
    ("post", "probs", "video", "post.probs = 'video': must be one of 'frame', 'temporal' or 'auto'"),
    ("model", "source", "biomedclip", "model.source = 'biomedclip': must be tiny, random"),
    ("train", "augment", None, "train.augment = None: must be a mapping"),
])
def test_bad_value_is_one_line_naming_the_key(section, path, value, message):
    assert one_error(section, edited(section, path, value)).startswith(message)


def test_unknown_key_lists_the_known_ones():
    message = one_error("train", edited("train", "epoch", 1))
    assert message.startswith("unknown key train.epoch; known keys: [")
    assert ", epochs, " in message and ", lr_head, " in message
    message = one_error("train", edited("train", "augment.roation", 1.0))
    assert message.startswith("unknown key train.augment.roation; known keys: [")
    assert ", rotation, " in message and "lr_head" not in message  # the nested model's keys


def write(tmp_path, text: str):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_stray_top_level_key_is_refused_listing_the_sections(tmp_path):
    path = write(tmp_path, (ROOT / "params.yaml").read_text() + "epochs: 1\n")
    with pytest.raises(ParamsError, match=r"unknown top-level key 'epochs'; known sections: \[base, demo,"):
        load_params(path)


def test_missing_section_is_named(tmp_path):
    params = repo_params()
    del params["events"]
    path = write(tmp_path, yaml.safe_dump(params))
    with pytest.raises(ParamsError, match="missing section 'events'"):
        load_section(path, "thresholds", ThresholdParams)


def test_duplicate_key_is_refused_with_its_line(tmp_path):
    text = (ROOT / "params.yaml").read_text().replace("  epochs: 8 ", "  epochs: 8\n  epochs: 2 ", 1)
    path = write(tmp_path, text)
    line = text.splitlines().index("  epochs: 8") + 2  # 1-based, the second one
    with pytest.raises(ParamsError, match=rf"duplicate key 'epochs' at line {line} \(first at line {line - 1}\)"):
        load_params(path)


def test_yaml_string_that_looks_like_a_number_says_how_to_write_it(tmp_path):
    text = (ROOT / "params.yaml").read_text().replace("lr_head: 3.0e-3", "lr_head: 3e-3", 1)
    path = write(tmp_path, text)
    with pytest.raises(ParamsError) as err:
        load_section(path, "train", TrainParams)
    assert str(err.value) == "train.lr_head = '3e-3': a string, not a number: write 3.0e-3 (YAML reads 3e-3 as text)"


def test_empty_section_is_one_line(tmp_path):
    text = (ROOT / "params.yaml").read_text()
    start = text.index("\nthresholds:\n") + 1
    end = text.index("\nevents:\n")
    path = write(tmp_path, text[:start] + "thresholds:\n" + text[end:])
    with pytest.raises(ParamsError) as err:
        load_section(path, "thresholds", ThresholdParams)
    assert str(err.value) == "params section 'thresholds' must be a mapping of keys, not empty"


def test_not_yaml_and_not_a_mapping(tmp_path):
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(write(tmp_path, "base: [1\n"))
    with pytest.raises(ParamsError, match="expected a mapping of sections"):
        load_params(write(tmp_path, "- 1\n"))
    with pytest.raises(ParamsError, match="params file not found"):
        load_params(tmp_path / "none.yaml")


# ----------------------------------------------------------------------------- models in code


def test_models_are_frozen_and_replace_validates():
    params = section_params(EventParams, "events")
    with pytest.raises(Exception, match="frozen"):
        params.median_window = 3
    assert params.replace(median_window=15).median_window == 15
    with pytest.raises(Exception, match="odd"):
        params.replace(median_window=4)


def test_section_params_helper_merges_nested_overrides():
    train = section_params(TrainParams, "train", epochs=1, augment={"rotation": 0.0})
    assert train.epochs == 1 and train.augment.rotation == 0.0
    assert train.augment.hflip == repo_params()["train"]["augment"]["hflip"]


def test_load_section_overrides_are_validated_like_the_file():
    assert load_section(ROOT / "params.yaml", "cache", CacheParams, size=64).size == 64
    with pytest.raises(ParamsError, match=r"^cache.size = 4: must be >= 8$"):
        load_section(ROOT / "params.yaml", "cache", CacheParams, size=4)
    with pytest.raises(ParamsError, match=r"^train.lr_head = '2.5E\+3': a string, not a number: write it without"):
        load_section(ROOT / "params.yaml", "train", TrainParams, lr_head="2.5E+3")


def test_write_params_helper_keeps_every_other_key(tmp_path):
    path = write_params(tmp_path / "p.yaml", train={"epochs": 1})
    params = load_params(path)
    assert params["train"]["epochs"] == 1 and params["base"] == repo_params()["base"]


def test_literal_fields_list_their_values():
    """The allowed values in an error come from the annotation: nothing re-typed in check()."""
    allowed = typing.get_args(CacheParams.model_fields["interpolation"].annotation)
    from vce.data.frames import INTERPOLATION

    assert set(allowed) == set(INTERPOLATION)


# ----------------------------------------------------------------------------- every stage, every key


def stage_sections() -> list[tuple[str, str]]:
    """(stage, section) for every section a dvc.yaml stage lists (a `section.key` entry counts)."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    pairs = []
    for stage in stages.values():
        cmd = (stage.get("do") or stage)["cmd"]
        module = cmd.split("python -m stages.")[1].split()[0]
        for section in dict.fromkeys(entry.split(".")[0] for entry in stage.get("params", [])):
            pairs.append((module, section))
    return sorted(set(pairs))


def _ends(paths: list[str]) -> list[str]:
    return list(dict.fromkeys([paths[0], paths[-1]]))


# The first and the last key of each section a stage reads (the last one nested where the section
# nests: `train.augment.load_scale`). Every key of a section is named when missing by the section's
# class (test_every_missing_key_is_named); what a stage adds is that it validates each section it
# reads with that class before any work, which its ends show: a stage skipping a section misses
# both, and one reading a section with a narrower class refuses the repository's file (unknown
# key) in every end-to-end test. (Issue 13's acceptance looped all 620 pairs: 60 s of CI.)
STAGE_KEYS = [(stage, section, path) for stage, section in stage_sections()
              for path in _ends(key_paths(repo_params()[section]))]


def test_every_stage_section_is_covered():
    assert ("train", "train") in stage_sections() and ("thresholds", "post") in stage_sections()
    assert ("train", "train", "augment.load_scale") in STAGE_KEYS and len(STAGE_KEYS) > 100


def test_removing_a_key_of_any_section_a_stage_reads_exits_2_naming_it(tmp_path, capsys):
    """The acceptance of issue 13: every input path points nowhere, so only the params check runs."""
    wrong = {}
    path_yaml = tmp_path / "params.yaml"
    for stage, section, path in STAGE_KEYS:
        params = repo_params()
        params[section] = edited(section, path)
        path_yaml.write_text(yaml.safe_dump(params))
        code = load_stage(stage).main(["--params", str(path_yaml)])
        err = capsys.readouterr().err
        if code != 2 or f"error: missing key {section}.{path} in params" not in err:
            wrong[f"{stage}:{section}.{path}"] = (code, err[-200:])
    assert wrong == {}


# ----------------------------------------------------------------------------- YAML edge cases (issue 32)

_BASE_LINE = "base:\n  seed: 42                      # seed for every random generator in every stage\n"


def _params_text(tmp_path, text: str | bytes):
    path = tmp_path / "params.yaml"
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return path


@pytest.mark.parametrize(("edit", "message"), [
    (lambda t: t + "\n? [a, b]\n: 1\n", r"a list used as a key at line \d+: keys are names"),
    (lambda t: t.replace(_BASE_LINE, "base:\n  {x: 1}: 2\n  seed: 42\n"), r"a dict used as a key at line 7"),
    (lambda t: t.encode().replace(b"every random", b"every \xff random"),
     r"not UTF-8 text \(byte 0xff at offset \d+\)"),
    (lambda t: t.replace("seed: 42                      # seed for every", "seed: 18446744073709551616 # s", 1),
     r"^base\.seed = 18446744073709551616: must be <= 2147483647$"),
])
def test_yaml_edge_cases_are_one_line_naming_the_file_or_key(tmp_path, edit, message):
    """A list/dict key used to raise TypeError (unhashable), a non-UTF-8 byte UnicodeDecodeError,
    a 2**64 seed an OverflowError later in numpy: each a traceback. Mutations killed: dropping the
    key-type check, the decode catch, or the seed's upper bound."""
    text = (ROOT / "params.yaml").read_text()
    assert _BASE_LINE in text
    path = _params_text(tmp_path, edit(text))
    with pytest.raises(ParamsError, match=message) as err:
        from_dict(BaseParams, load_params(path)["base"], "base")
    assert "\n" not in str(err.value)


def test_yaml_merge_keys_are_accepted_and_explicit_keys_override_them(tmp_path):
    """`<<: *anchor` was rejected as invalid YAML by the duplicate-key loader."""
    text = (ROOT / "params.yaml").read_text()
    exact_line = next(line for line in text.splitlines(keepends=True) if line.startswith("  exact_cpu:"))
    text = text.replace(_BASE_LINE + exact_line, "base:\n  exact_cpu: true\n  <<: &shared {seed: 7}\n")
    text = text.replace("demo:                           # the embedded demo dataset", "demo:\n  <<: *shared  #", 1)
    text = text.replace("  seed: 42                      # generator seed: same seed, same bytes\n", "", 1)
    params = load_params(_params_text(tmp_path, text))
    assert params["base"]["seed"] == 7 and params["demo"]["seed"] == 7
    assert from_dict(DemoParams, params["demo"], "demo").seed == 7
    overridden = text.replace("  <<: *shared  #", "  <<: *shared\n  seed: 9  #", 1)
    assert load_params(_params_text(tmp_path, overridden))["demo"]["seed"] == 9
    twice = overridden.replace("  seed: 9  #", "  seed: 9\n  seed: 10  #", 1)
    with pytest.raises(ParamsError, match="duplicate key 'seed'"):
        load_params(_params_text(tmp_path, twice))


def test_a_yaml_alias_bomb_is_refused_before_it_expands(tmp_path):
    """Issue 48, WEAK: 240 bytes of nested aliases in `thresholds.coarse_grid` cost 18 s and
    1.1 GB of validation before its error. Refused while the file is parsed, in well under a
    second. Mutation killed: no size check (the time bound)."""
    import time

    levels = ["&a [1,1,1,1,1,1,1,1,1]"] + [f"&{n} [{','.join([f'*{p}'] * 9)}]" for p, n in zip("abcdef", "bcdefg")]
    lines = (ROOT / "params.yaml").read_text().split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("  coarse_grid:"))
    end = next(i for i in range(at + 1, len(lines)) if not lines[i].startswith("  - "))
    lines[at:end] = [f"  coarse_grid: [{', '.join(levels)}]"]
    path = _params_text(tmp_path, "\n".join(lines))
    began = time.perf_counter()
    with pytest.raises(ParamsError, match=r"its aliases expand to 6,053,972 values \(more than 100,000\)"):
        load_params(path)
    assert time.perf_counter() - began < 5
    load_params(ROOT / "params.yaml")  # the shipped file, merge keys and all, far below the bound


@pytest.mark.parametrize("bad", [b"\xff", b"? [a]\n: 1\n"])
def test_the_params_stage_reports_a_bad_byte_or_key_without_a_traceback(tmp_path, bad):
    import subprocess
    import sys

    path = _params_text(tmp_path, (ROOT / "params.yaml").read_bytes() + b"\n" + bad)
    result = subprocess.run([sys.executable, "-m", "stages.params", "--params", str(path), "--out",
                             str(tmp_path / "check.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("Traceback") == 0, result.stderr
    assert result.stderr.startswith(f"error: {path}: ") and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "check.json").exists()
