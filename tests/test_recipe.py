"""The seed's real-data recipe as one switch, its OneCycle end, and the pretrained-lr guard."""

import subprocess
import sys

import pytest
import torch
import yaml
from conftest import ROOT

from vce.core import recipe
from vce.core.errors import ParamsError
from vce.core.params import from_dict, load_params
from vce.model.frame_model import ModelParams
from vce.train.trainer import TrainParams, check_learning_rates

SEED = {"base.exact_cpu": False,
        "model.source": "hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224",
        "model.excitation_reduction": 16, "model.diff_init": "preserving",
        "train.epochs": 5, "train.batch_size": 128, "train.lr_head": 3e-4, "train.lr_backbone": 9e-5,
        "train.samples_per_epoch": 500_000, "train.final_div_factor": 40.0, "temporal.steps": 300}


def params_with(overrides: dict) -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    for key, value in overrides.items():
        section, *path = key.split(".")
        node = params[section]
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return params


def test_seed_recipe_is_the_seeds_values_and_validates():
    assert recipe.load_recipe("seed") == SEED
    params = params_with(SEED)
    train = from_dict(TrainParams, params["train"], "train")
    model = from_dict(ModelParams, params["model"], "model")
    check_learning_rates(train, model.source)  # the recipe passes the guard


def test_dvc_flags_parse_back_to_the_recipe():
    from hydra.core.override_parser.overrides_parser import OverridesParser  # what dvc exp run -S uses

    flags = recipe.dvc_flags(SEED)
    assert flags[::2] == ["-S"] * len(SEED)
    parser = OverridesParser.create()
    parsed = {o.key_or_group: o.value() for o in map(parser.parse_override, flags[1::2])}
    assert parsed == SEED


def test_command_prints_flags_and_applies_in_place_keeping_comments(tmp_path):
    out = subprocess.run([sys.executable, "-m", "vce.core.recipe", "seed"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == recipe.dvc_flags(SEED)
    target = tmp_path / "params.yaml"
    original = (ROOT / "params.yaml").read_text()
    target.write_text(original)
    assert recipe.main(["seed", "--apply", str(target)]) == 0
    changed = target.read_text()
    assert yaml.safe_load(changed) == params_with(SEED)
    load_params(target)  # still a valid params file
    before, after = original.split("\n"), changed.split("\n")
    assert len(before) == len(after)
    differing = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(differing) == sum(params_with({}) != params_with({k: v}) for k, v in SEED.items())
    for old, new in differing:  # only the value changed: the key and its comment stay
        assert old.split(":")[0] == new.split(":")[0]
        assert old.split("#", 1)[1] == new.split("#", 1)[1]


def test_unknown_recipe_or_key_is_an_error_naming_it(tmp_path, capsys):
    assert recipe.main(["nonesuch"]) == 2
    assert "recipe 'nonesuch'" in capsys.readouterr().err
    with pytest.raises(ParamsError, match="train.epoch "):
        recipe.check_keys({"train.epoch": 5}, yaml.safe_load((ROOT / "params.yaml").read_text()))


@pytest.mark.parametrize("source", ["hf-hub:microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224",
                                    "local-dir:/models/biomedclip"])
def test_pretrained_source_with_demo_learning_rates_is_refused(source):
    demo = from_dict(TrainParams, params_with({})["train"], "train")
    assert demo.lr_backbone > 1e-3  # the demo's from-scratch rate
    with pytest.raises(ParamsError, match=r"train\.lr_backbone.*model\.source.*train\.allow_high_lr"):
        check_learning_rates(demo, source)
    check_learning_rates(demo.replace(allow_high_lr=True), source)  # asked for explicitly
    check_learning_rates(demo, "tiny")  # from scratch: fine
    check_learning_rates(demo, "random")


def test_train_stage_refuses_before_any_work(tmp_path, capsys):
    from conftest import load_stage

    params = params_with({"model.source": f"local-dir:{tmp_path / 'absent'}"})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    argv = ["--params", str(tmp_path / "params.yaml"), "--frames", str(tmp_path / "absent.parquet"),
            "--cache", str(tmp_path), "--prompts", str(tmp_path / "absent.pt"), "--model-out", str(tmp_path / "m.pt"),
            "--state-dir", str(tmp_path / "state"), "--metrics", str(tmp_path / "m.json"),
            "--live-dir", str(tmp_path / "live")]
    assert load_stage("train").main(argv) == 2
    err = capsys.readouterr().err
    assert "train.lr_backbone" in err and "model.source" in err and "absent.parquet" not in err


def onecycle_rates(train: TrainParams, steps_per_epoch: int) -> list[float]:
    """Backbone lr at the last step of each epoch, from the Trainer's own schedule."""
    from vce.train.trainer import Trainer

    class Stub:  # what Trainer._new_schedule reads
        params = train
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=train.lr_backbone)

    stub = Stub()
    stub.steps_per_epoch = steps_per_epoch
    schedule = Trainer._new_schedule(stub, 0, train.epochs)
    lrs = [stub.optimizer.param_groups[0]["lr"]]
    for _ in range(train.epochs * steps_per_epoch - 1):
        stub.optimizer.step()
        schedule.step()
        lrs.append(stub.optimizer.param_groups[0]["lr"])
    return [lrs[(epoch + 1) * steps_per_epoch - 1] for epoch in range(train.epochs)]


def test_seed_schedule_ends_at_the_logged_rate():
    train = from_dict(TrainParams, params_with(SEED)["train"], "train")
    rates = onecycle_rates(train, 500_000 // 128)
    assert rates[-1] == pytest.approx(9.0e-8, rel=1e-3)  # 9e-5 / 25 / 40; torch's default 1e4 gave 3.6e-10
    assert max(rates) < 9e-5 and rates == sorted(rates, reverse=True)  # warm-up (15 %) ends inside epoch 1


# ----------------------------------------------------------------------------- issue 48, BUG 6

def test_a_value_holding_a_hash_is_replaced_whole_and_comments_stay():
    """`source: "local-dir:/models/bc#1"  # c` became `hf-hub:…_224#1"`. Mutation killed: the
    value ending at the first `#` (the old regex)."""
    text = ('model:\n  source: "local-dir:/models/bc#1"  # c\n  note: \'it\'\'s # mine\'   # d\n'
            'train:\n  epochs: 8  # e\n  lr_head: 1.0e-3\n')
    changed = recipe.apply(text, {"model.source": SEED["model.source"], "model.note": "a # b", "train.epochs": 5})
    assert yaml.safe_load(changed) == {"model": {"source": SEED["model.source"], "note": "a # b"},
                                       "train": {"epochs": 5, "lr_head": 1.0e-3}}
    assert changed.splitlines()[1:5] == [f"  source: {SEED['model.source']} # c",  # the comment as close as it was
                                         "  note: 'a # b'          # d",  # its column kept
                                         "train:", "  epochs: 5  # e"]


def test_any_indentation_width_is_edited_and_an_uneditable_layout_is_refused():
    """A valid 4-space params.yaml got "no one-line value to replace". A value the line editor
    would cut (a plain scalar continued on the next line) is refused, never half-written.
    Mutations killed: depth = indent // 2; no parse-back check."""
    four = "base:\n    seed: 1\n    exact_cpu: true   # pinned\ntrain:\n    epochs: 8\n"
    changed = recipe.apply(four, {"base.exact_cpu": False, "train.epochs": 5})
    assert changed == "base:\n    seed: 1\n    exact_cpu: false  # pinned\ntrain:\n    epochs: 5\n"
    continued = "model:\n  source: local-dir:/models\n    biomedclip\n"
    with pytest.raises(ParamsError, match=r"^p.yaml: writing the recipe's values line by line would change more"):
        recipe.apply(continued, {"model.source": "hf-hub:x"}, "p.yaml")


def test_a_non_utf8_or_symlinked_params_file(tmp_path, capsys):
    """A non-UTF-8 params.yaml was a traceback; a symlinked one became a plain file. Mutations
    killed: reading with read_text(); writing over the link."""
    import os

    target = tmp_path / "params.yaml"
    target.write_bytes((ROOT / "params.yaml").read_bytes().replace(b"# every knob", b"# \xff every knob", 1)
                       if b"# every knob" in (ROOT / "params.yaml").read_bytes() else b"base:\n  seed: 1 # \xff\n")
    assert recipe.main(["seed", "--params", str(target), "--apply", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {target}: not UTF-8 (byte 0xff at offset") and err.count("\n") == 1, err
    real = tmp_path / "shared" / "params.yaml"
    real.parent.mkdir()
    real.write_text((ROOT / "params.yaml").read_text())
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    assert recipe.main(["seed", "--apply", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert yaml.safe_load(real.read_text()) == params_with(SEED)


def test_the_readmes_apply_command_runs_as_typed(tmp_path):
    """Issue 48: the README's `python -m vce.core.recipe seed --apply params.yaml`, in a shell,
    in a folder holding the shipped params.yaml."""
    import os

    (tmp_path / "params.yaml").write_text((ROOT / "params.yaml").read_text())
    readme = (ROOT / "README.md").read_text()
    command = "python -m vce.core.recipe seed --apply params.yaml"
    assert command in readme
    run = subprocess.run(command, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    assert yaml.safe_load((tmp_path / "params.yaml").read_text()) == params_with(SEED)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_lite0_probe_recipe_validates_and_builds_the_real_backbone_frozen(packaged_efficientnet):
    """recipes/lite0_probe.yaml: every value passes its section, and with the converted real weights
    it builds a timm CNN without differential attention whose features the probe reads (1280-d)."""
    from vce.model.frame_model import create_model

    values = recipe.load_recipe("lite0_probe")
    assert values["train.freeze_backbone"] is True and values["model.diff_attention"] is False
    # The final epoch, not the best validation epoch: measured on 9 deals (docs/real_pixels.md)
    assert values["train.keep"] == "last" and values["train.epochs"] == 30
    params = params_with({**values, "model.source": f"timm:local-dir:{packaged_efficientnet}"})
    train = from_dict(TrainParams, params["train"], "train")
    model_params = from_dict(ModelParams, params["model"], "model")
    check_learning_rates(train, model_params.source)
    model = create_model(model_params)
    assert model.arch_config["embed_dim"] == 1280 and not model.has_prompts
    with torch.no_grad():
        features = model.eval().visual(torch.zeros(1, 3, 224, 224))
    assert features.shape == (1, 1280) and torch.isfinite(features).all()
