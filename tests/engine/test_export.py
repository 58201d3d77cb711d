"""``python -m src.export RUN``: a run's model as a timm folder (``model.safetensors`` and timm's
``config.json``) that plain timm loads, plus one ``attention.apply`` where the variant acts in the
forward; the loaded model's logits are the run's, for every variant of ``conf/attn``. Bad input
is one line, exit 2, nothing written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import timm
import torch
from conftest import compose, main_in_process
from hydra.utils import instantiate
from omegaconf import OmegaConf
from safetensors.torch import load_file

from src import attention
from src import export as exporting
from src.engine import train
from src.engine.loop.model import build_model
from src.engine.record import checkpoint

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["trainer.max_steps=2", "trainer.val_every=2", "trainer.checkpoint_every=2"]
STEPS += ["trainer.test_after=null"]
QUICK = ["trainer.monitor_every=0", "trainer.threads=1", "trainer.eval_batches=1", "trainer.log_every=1"]
#: every conf/attn file, and spectral's svd mode (recomputed each forward: not foldable)
VARIANTS = {p.stem: [f"attn={p.stem}"] for p in sorted((ROOT / "conf" / "attn").glob("*.yaml"))}
VARIANTS["spectral_svd"] = ["attn=spectral", "attn.mode=svd"]
#: a timm model by name (backbone=timm), with cond_init: exported under that name
VARIANTS["timm_named"] = [
    "attn=cond_init",
    "backbone=timm",
    "backbone.name=vit_tiny_patch16_224",
    "+backbone.model.patch_size=2",
    "+backbone.model.depth=1",
]
#: the variants whose export is a plain timm model (weights only; spectral identity folded;
#: compose's default is cond_init then spectral identity)
PLAIN = {"standard", "cond_init", "mimetic", "spectral", "compose", "timm_named"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One trained run per variant, made when a test first asks for it."""
    root, made = tmp_path_factory.mktemp("export"), {}

    def run(name: str, *extra: str) -> Path:
        key = (name, *extra)
        if key not in made:
            folder = root / "-".join(key)
            train(compose([*VARIANTS.get(name, [name]), *STEPS, *QUICK, *extra], folder.parent), folder)
            made[key] = folder
        return made[key]

    return run


def run_model(run_dir: Path) -> tuple[torch.nn.Module, torch.Tensor]:
    """The suite's model of the run with its best.pt weights, in eval mode, and a batch of its
    validation images ``(B, 1, 8, 8)``."""
    cfg = OmegaConf.load(run_dir / "config.yaml")
    task = instantiate(cfg.task)
    model = build_model(cfg, task)
    model.load_state_dict(checkpoint.load(run_dir / "checkpoints" / "best.pt")["model"])
    images = torch.stack([task.eval_dataset(Path(cfg.paths.data_dir), "val")[i][0] for i in range(16)])
    return model.eval(), images


def export_cli(capsys, *args) -> tuple[int, str, str]:
    return main_in_process(exporting.main, capsys, *args)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_exported_model_gives_the_runs_logits(runs, capsys, variant):
    run_dir = runs(variant)
    code, out, err = export_cli(capsys, run_dir)
    assert code == 0, err
    folder = run_dir / "export"
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    config = json.loads((folder / "config.json").read_text())
    assert config[exporting.KEY]["plain"] is (variant in PLAIN)
    if config[exporting.KEY]["plain"]:  # plain timm: nothing of the suite, timm's keys
        loaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
        assert not any(type(m).__module__.startswith("src.") for m in loaded.modules())
        assert set(load_file(folder / "model.safetensors")) == set(
            timm.create_model(config["architecture"], **config["model_args"]).state_dict()
        )
    else:  # the documented three lines (docs/evaluation.md#export-a-trained-model)
        loaded = timm.create_model(f"local-dir:{folder}", pretrained=False)
        attention.apply(loaded, attention.variant_from_config(config["conditioned_attention"]["attn"]))
        loaded.load_state_dict(load_file(folder / "model.safetensors"))
        loaded.eval()
    model, images = run_model(run_dir)
    with torch.no_grad():
        expected, got = model(images), loaded(images)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert f"local-dir:{folder}" in out or "src.export.load" in out
    if variant == "timm_named":
        assert config["architecture"] == "vit_tiny_patch16_224" and config["model_args"]["patch_size"] == 2


def test_a_plain_export_loads_by_its_name_with_the_file_overlaid(runs, capsys):
    """timm's other route: the registered name, its model_args, and the weights file overlaid."""
    run_dir = runs("cond_init")
    folder = exporting.export(run_dir, run_dir / "named")
    config = json.loads((folder / "config.json").read_text())
    overlay = dict(file=str(folder / "model.safetensors"), num_classes=config["num_classes"])
    loaded = timm.create_model(
        config["architecture"], pretrained=True, pretrained_cfg_overlay=overlay, **config["model_args"]
    ).eval()
    model, images = run_model(run_dir)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), model(images), atol=1e-5, rtol=1e-5)


def test_a_run_without_a_checkpoint_is_one_line_and_writes_nothing(runs, capsys, tmp_path):
    run_dir = runs("standard", "trainer.checkpoints=false")
    code, out, err = export_cli(capsys, run_dir, "--out", tmp_path / "out")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "no checkpoint" in err and not (tmp_path / "out").exists()


def test_a_backbone_timm_cannot_build_is_refused_in_one_line(runs, capsys, tmp_path):
    run_dir = runs("task=lm_char", "backbone=gpt_micro", "attn=standard")
    code, out, err = export_cli(capsys, run_dir, "--out", tmp_path / "out")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "backbone gpt_micro builds src.models.gpt.GPT" in err and "timm" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["task=lra_listops_small", "backbone=lra_transformer"], "src.models.lra.LRAClassifier"),
        (["task=modadd"], "src.models.sandbox"),
        (["task=coco_shapes", "backbone=vit_micro_det"], "detection backbone"),
    ],
)
def test_the_suites_own_models_are_not_exported(tmp_path, overrides, named):
    with pytest.raises(exporting.ExportError, match=named):
        exporting.architecture(compose(overrides, tmp_path))


def test_ema_weights_that_were_not_kept_and_a_foreign_out_folder_are_refused(runs, capsys, tmp_path):
    run_dir = runs("standard")
    code, _, err = export_cli(capsys, run_dir, "--ema", "--out", tmp_path / "ema")
    assert code == 2 and "holds no EMA weights" in err and not (tmp_path / "ema").exists()
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    code, _, err = export_cli(capsys, run_dir, "--out", taken)
    assert code == 2 and "is not an earlier export" in err
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]


def test_the_command_answers_help_without_loading_torch():
    """``--help`` reads the module alone: torch, timm and the models load when an export runs."""
    import subprocess
    import sys

    code = "import sys, src.export; print(sorted({'torch', 'timm', 'hydra'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def doc_snippets() -> list[str]:
    """The Python blocks of docs/evaluation.md's section "Export a trained model", in order."""
    text = (ROOT / "docs" / "evaluation.md").read_text()
    section = text.split("### Export a trained model", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_docs_load_snippets_run_as_shown(runs):
    """The plain snippet on a plain export, the three lines on one that needs ``attention.apply``:
    each gives the run's logits, with only the folder's path put in."""
    snippets = doc_snippets()
    assert len(snippets) == 2
    for snippet, variant in zip(snippets, ["cond_init", "precond"], strict=True):
        run_dir = runs(variant)
        folder = exporting.export(run_dir, run_dir / "documented")
        scope: dict = {}
        exec(snippet.replace("RUN/export", str(folder)), scope)  # noqa: S102  the docs' own code
        model, images = run_model(run_dir)
        with torch.no_grad():
            torch.testing.assert_close(scope["model"](images), model(images), atol=1e-5, rtol=1e-5)


def test_ema_exports_the_averaged_weights(runs, capsys):
    run_dir = runs("standard", "trainer.ema=0.5")
    folder = exporting.export(run_dir, run_dir / "ema", ema=True)
    saved = checkpoint.load(run_dir / "checkpoints" / "best.pt")
    weights = load_file(folder / "model.safetensors")
    averaged = {k.removeprefix("module."): v for k, v in saved["ema"].items()}
    assert all(torch.equal(weights[k], averaged[k]) for k in weights)
    assert not all(torch.equal(weights[k], saved["model"][k]) for k in weights)
    assert json.loads((folder / "config.json").read_text())["conditioned_attention"]["weights"] == "ema"
