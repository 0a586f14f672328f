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
        "train.samples_per_epoch": 500_000, "train.final_div_factor": 40.0}


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
