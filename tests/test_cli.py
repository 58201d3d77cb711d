"""The command line around Hydra: --help, did-you-mean, values with "=", one-folder run names,
the CPU-bound worker count, SLURM's tasks_per_node on CPU-only nodes and sbatch's refusal."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import CONF, QUIET, SBATCH_REFUSAL, run_cli, stand_in_slurm
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

import src.engine.schema  # noqa: F401  registers the trainer schema
from src import cli, resolvers
from src.configs import compose
from src.errors import ConfigError

GROUPS = ["attn", "backbone", "experiment", "hydra/launcher", "optim", "reading", "sched", "task"]
REFUSAL = SBATCH_REFUSAL
LONG_RUN = "outputs/runs/imagenet/vit_micro/precond/seed=0," + ",".join(
    f"backbone.model.option_{i}={i}" for i in range(20)
)


def hydra_config(overrides: list[str], tmp_path: Path):
    """The composed config with its ``hydra`` node, as the entry point gets it (run mode)."""
    cfg = compose(cli.prepare_argv([*overrides, *QUIET]), tmp_path, hydra=True)
    HydraConfig.instance().set_config(cfg)  # ${hydra:job.override_dirname} reads it
    return cfg


def run_folder_below_seed(cfg, key: str = "hydra.run.dir") -> list[str]:
    """What the run folder's name holds after ``seed=…,`` (the overrides), and any folder below it
    (none: no run folder is inside another)."""
    parts = Path(OmegaConf.select(cfg, key)).parts
    seed = next(i for i, p in enumerate(parts) if p.startswith("seed="))
    _, _, overrides = parts[seed].partition(",")
    return [overrides, *parts[seed + 1 :]] if overrides else list(parts[seed + 1 :])


# -- --help ------------------------------------------------------------------------------------


def help_sections(text: str) -> dict[str, list[str]]:
    """``--help``'s option lines by group (a group's header is ``  <group>=``)."""
    sections: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith("  ") and line.endswith("=") and not line.startswith("   "):
            group = sections.setdefault(line.strip()[:-1], [])
        elif line.startswith("   ") and sections:
            group.append(line)
    return sections


def test_help_lists_every_option_with_its_files_first_comment_line():
    text = cli.help_text()
    sections = help_sections(text)
    assert set(GROUPS) <= set(sections)
    for group in GROUPS:
        files = sorted((CONF / group).rglob("*.yaml"))
        assert len(sections[group]) == len(files)
        for file in files:
            name = file.relative_to(CONF / group).with_suffix("").as_posix()
            description = cli.describe(file)
            assert description, f"{file} needs a one-line '# …' description at its top"
            (line,) = [t for t in sections[group] if t[4:].split(" ")[0] == name]
            assert description[:40] in line, (name, line)
    assert "   *precond" in text and "Preconditioned attention (P1)" in text  # the default, marked
    assert "--cfg job" in text and "--hydra-help" in text
    assert max(len(line) for line in text.splitlines()) <= cli.WIDTH


def test_help_prints_the_listing_and_exits_0_while_hydra_help_stays_hydras(capsys):
    with pytest.raises(SystemExit) as done:
        cli.prepare_argv(["attn=standard", "--help"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == cli.help_text()
    assert cli.prepare_argv(["--hydra-help"]) == ["--hydra-help"]  # passed to Hydra untouched


# -- did you mean --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("attn=precon", "attn=precon: no such option in conf/attn; did you mean precond? (options: compose,"),
        ("attn=precond,standar", "attn=standar: no such option in conf/attn; did you mean standard?"),
        ("experiment=smoke/digts", "conf/experiment; did you mean smoke/digits or"),
        ("experiment=paper/imagnet", "did you mean paper/imagenet or"),
        ("reading=precnd", "conf/reading; did you mean precond or precond_gain?"),
        ("hydra/launcher=slrm", "conf/hydra/launcher; did you mean slurm?"),
        ("task=glob(lm_*x)", "task=glob(lm_*x): matches no option in conf/task"),
        ("backbone=resnet", "backbone=resnet: no such option in conf/backbone (options: crammed_bert,"),
    ],
)
def test_a_selection_that_names_no_file_says_which_ones_exist(override, message):
    with pytest.raises(ConfigError) as error:
        cli.prepare_argv(["-m", override, "trainer.max_steps=2"])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_valid_selections_pass_through_unchanged():
    args = ["-m", "experiment=smoke/digits", "attn=glob(*,exclude=compose)", "hydra/launcher=basic"]
    args += ["reading=null", "~logger", "attn=precond,standard", "trainer.max_steps=2", "--cfg", "job"]
    assert cli.prepare_argv(args) == args


# -- values with "=" and the run folder's name ------------------------------------------------------------


def test_a_value_with_an_equals_sign_is_quoted_unless_hydra_parses_it():
    path = "out/seed=0,trainer.max_steps=20,trainer.val_every=10/checkpoints/last.pt"
    assert cli.quote_value(f"backbone.model.pretrained={path}") == f"backbone.model.pretrained='{path}'"
    for kept in ("attn=precond,standard", "a.b='x=y'", 'a.b="x=y"', "seed=0", "a.b=[1,2]"):
        assert cli.quote_value(kept) == kept


@pytest.mark.parametrize(
    "pretrained",
    [
        "outputs/runs/digits/vit_digits/precond/seed=0,trainer.max_steps=20,trainer.val_every=10/checkpoints/last.pt",
        f"{LONG_RUN}/checkpoints/last.pt",  # the run folder's name alone is over 400 bytes
    ],
)
def test_the_readmes_pretrained_override_composes_to_the_path_in_one_run_folder(pretrained, tmp_path):
    detection = ["task=coco_shapes", "backbone=vit_micro_det"]
    cfg = hydra_config(
        [*detection, "backbone.model.pretrained=" + pretrained, "trainer.max_steps=3"], tmp_path
    )
    assert cfg.backbone.model.pretrained == pretrained
    (name,) = run_folder_below_seed(cfg)
    assert len(name.encode()) < 255 and "trainer.max_steps=3" in name and "last.pt" in name
    again = hydra_config(
        ["trainer.max_steps=3", "backbone.model.pretrained=" + pretrained, *detection], tmp_path
    )
    assert run_folder_below_seed(again) == [name]  # the same command finds the same folder


def test_a_nested_experiment_is_one_run_folder_in_runs_and_sweeps(tmp_path):
    cfg = hydra_config(["experiment=smoke/digits", "trainer.max_steps=3"], tmp_path)
    assert run_folder_below_seed(cfg) == ["experiment=smoke-digits,trainer.max_steps=3"]
    assert run_folder_below_seed(cfg, "hydra.sweep.subdir") == ["experiment=smoke-digits,trainer.max_steps=3"]
    assert Path(cfg.hydra.run.dir).name == "seed=0,experiment=smoke-digits,trainer.max_steps=3"
    assert run_folder_below_seed(hydra_config([], tmp_path)) == []  # no overrides: seed=0/ itself


def test_long_names_keep_head_and_tail_and_differ_by_a_hash():
    a, b = resolvers.run_folder(0, LONG_RUN + "a"), resolvers.run_folder(0, LONG_RUN + "b")
    assert a != b and len(a.encode()) <= 210 and a.startswith("seed=0,outputs-runs-") and a.endswith("19=19a")


# -- worker count and SLURM ----------------------------------------------------------------------


@pytest.mark.parametrize("cpus, workers", [(1, 0), (2, 1), (3, 2), (16, 4)])
def test_workers_leave_the_main_process_a_cpu(cpus, workers, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert resolvers.cpus_at_most(4) == workers


@pytest.mark.parametrize(
    "task, at_most", [("lm_tinystories", 4), ("lm_wikitext103", 4), ("imagenet", 8), ("coco", 2)]
)
def test_tasks_ask_for_workers_the_machine_has(task, at_most, tmp_path):
    cfg = hydra_config([f"task={task}"], tmp_path)
    expected = max(0, min(at_most, len(os.sched_getaffinity(0)) - 1))
    assert cfg.trainer.num_workers == expected and isinstance(cfg.trainer.num_workers, int)


@pytest.mark.parametrize("gpus, tasks", [("0", 1), ("null", 1), ("4", 4)])
def test_slurm_runs_one_task_per_gpu_and_one_without_gpus(gpus, tasks, tmp_path):
    cfg = hydra_config(["hydra/launcher=slurm", f"hydra.launcher.gpus_per_node={gpus}"], tmp_path)
    assert cfg.hydra.launcher.tasks_per_node == tasks


def test_sbatchs_refusal_is_one_line_with_what_to_change(tmp_path):
    env = stand_in_slurm(tmp_path, f"echo '{REFUSAL}' >&2; exit 1")
    args = ["-m", "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "trainer.max_steps=2"]
    result = run_cli(args, cwd=tmp_path, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(
        "error: hydra/launcher=slurm: sbatch refused the jobs; check hydra.launcher.partition"
    )
    assert line.endswith(f"): {REFUSAL}")


@pytest.mark.slow
def test_a_detection_backbone_loads_an_imagenet_runs_checkpoint_by_the_readmes_override(
    image_folder, tmp_path
):
    """README: ``backbone.model.pretrained=<imagenet run>/checkpoints/last.pt``, the path as the run
    wrote it (``seed=0``, commas), from a 1-step classification run of vit_micro_det's body (~15 s)."""
    import torch
    from mmdet.registry import MODELS

    import src.models.detection  # noqa: F401  registers SuiteViT
    from src.attention import config as attention_config

    body = ["backbone.model.patch_size=16", "backbone.model.embed_dim=64", "task.img_size=128"]
    args = ["task=imagenet", "backbone=vit_micro", f"paths.data_dir={image_folder}", *body]
    args += ["trainer.max_steps=1", "task.batch_size=4", "task.eval_batch_size=4", "trainer.precision=fp32"]
    args += ["task.repeated_aug=0"]  # 12 images: DeiT's repeated epoch rounds down to 256s
    assert run_cli(args, cwd=tmp_path).returncode == 0
    (checkpoint,) = tmp_path.glob("outputs/runs/**/checkpoints/last.pt")
    pretrained = str(checkpoint)
    assert "seed=0" in pretrained and "," in pretrained
    cfg = hydra_config(
        ["task=coco_shapes", "backbone=vit_micro_det", f"backbone.model.pretrained={pretrained}"], tmp_path
    )
    assert cfg.backbone.model.pretrained == pretrained
    model = {
        **OmegaConf.to_container(cfg.backbone.model, resolve=True),
        "attn": attention_config.as_dict(cfg.attn),
    }
    backbone = MODELS.build(model)
    saved = torch.load(checkpoint, weights_only=True)["model"]
    for name, weight in backbone.body.state_dict().items():
        torch.testing.assert_close(weight, saved[name], rtol=0, atol=0)


# -- refused before torch is imported (issue 25) -----------------------------------------------

BLOCKER = '''import sys
class Blocker:
    """The detection extra, as if not installed."""
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("mmdet", "mmcv", "mmengine"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Blocker())
'''


def refused_torch_free(args: list[str], tmp_path: Path, pythonpath: str = "") -> str:
    """Run ``python -X importtime -m src.run args``; assert exit 2, one ``error:`` line, no
    traceback and no torch among the imports; return the line."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (pythonpath, str(CONF.parent)) if p)}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "src.run", f"paths.output_dir={tmp_path}", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    imported = [
        line.rpartition("|")[2].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    ]
    assert result.returncode == 2, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert not [m for m in imported if m.split(".")[0] in ("torch", "timm")], (
        "torch imported before the refusal"
    )
    return lines[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["+trainer.max_step=5"], "did you mean trainer.max_steps?"),
        (["trainer.max_step=5"], "did you mean trainer.max_steps?"),
        (["-m", "experiment=glue_tiny", "--cfg", "job"], "drop -m"),
        (
            ["-m", "attn=precond,standard", "seed=range(3,6)", "--cfg", "job"],
            "attn=precond seed=3 --cfg job)",  # the first job, a command that runs
        ),
        (["attn=precond", "reading=spectral_qk"], "reading=spectral_qk alone, or attn=precond alone"),
        (["task=digits", "backbone=gpt_micro"], "are incompatible"),
        (["trainer.clip_grad=-1"], "trainer.clip_grad=-1.0 must be greater than 0"),
    ],
)
def test_config_refusals_import_no_torch(args, message, tmp_path):
    assert message in refused_torch_free(args, tmp_path)


@pytest.mark.parametrize("task", [["task=coco", "attn=precond"], ["task=coco_shapes"]])
def test_detection_without_the_extra_names_make_detection_before_torch(task, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    line = refused_torch_free(task, tmp_path, pythonpath=str(blocker))
    assert "`make detection`" in line and "about 30 minutes" in line and "make install DETECTION=1" in line


def test_new_keys_the_suite_reads_are_kept(tmp_path):
    """``+`` stays open where code reads new keys: a composition's per-part options."""
    from src import precheck

    precheck.precheck(["attn=compose", "attn.parts=[cond_init,spectral]", "+attn.spectral.mode=svd"])
    precheck.precheck(["++backbone.model.embed_dim=24"])


def test_a_config_dir_keeps_the_checks_before_the_run(tmp_path):
    """``--config-dir DIR`` goes where Hydra's main puts it, before the schema source: the config
    composes and its values are checked (a loader that put it after the schema made Hydra fail
    its own assertion, and the checks were skipped without a word)."""
    from src import precheck
    from src.errors import ConfigError

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("# @package _global_\noptim:\n  lr: 0.01\n")
    precheck.precheck(["--config-dir", str(tmp_path), "experiment=mine"])
    with pytest.raises(ConfigError, match="trainer.clip_grad=-1.0 must be greater than 0"):
        precheck.precheck(["--config-dir", str(tmp_path), "experiment=mine", "trainer.clip_grad=-1"])


def test_a_key_of_an_experiment_file_points_at_it():
    """P5's ``optim.mlp_lr_discount`` is added by the experiment that names its hook: asked for
    without it, the one line names the experiment and a command that works."""
    from src import precheck
    from src.errors import ConfigError

    command = "experiment=paper/p5_mlp_lr optim.mlp_lr_discount=4"
    with pytest.raises(ConfigError, match=command):
        precheck.precheck(["task=modadd", "backbone=sandbox", "optim.mlp_lr_discount=4"])
    precheck.precheck(command.split())


@pytest.mark.parametrize(
    "arg, pointer",
    [
        (
            "trainer=gpu",
            "trainer=gpu: no such option in conf/trainer; the device is an option, not a trainer "
            "config: trainer.device=cuda",
        ),
        ("ckpt_path=outputs/x/last.ckpt", "resuming is automatic: rerun the same command"),
        ("lr=0.1", "lr=0.1: no config has this key; the learning rate is optim.lr=…"),
        ("epochs=3", "epochs=3: no config has this key; the run's length is trainer.max_epochs=…"),
        (
            "trainer.amp=true",
            "trainer.amp=true: no config has this key; mixed precision is trainer.precision=bf16",
        ),
    ],
)
def test_other_tools_words_point_to_the_suites_way(arg, pointer, tmp_path):
    """Lightning's and timm's words get the suite's way in one line (exit 2, before torch), not a
    generic refusal or a wrong near spelling (``trainer.amp``: ``trainer.ema``)."""
    line = refused_torch_free([arg], tmp_path)
    assert pointer in line and "did you mean" not in line, line


def test_options_that_change_nothing_trained_keep_the_run_folder_and_the_identity(tmp_path):
    """Turning on checkpoint logging (or another progress display, thread count, W&B project) resumes
    the run instead of forking it: the same folder and the same identity, from one list of keys."""
    from src.engine.record.identity import EXCLUDED, Identity

    plain = hydra_config(["trainer.max_steps=20"], tmp_path)
    quiet = [
        "trainer.progress=none",
        "trainer.threads=1",
        "trainer.compile=true",
        "trainer.checkpoint_every=5",
    ]
    logged = ["logger=wandb", "logger.log_checkpoints=true", "logger.project=mine", *quiet]
    other = hydra_config(["trainer.max_steps=20", *logged], tmp_path)
    assert OmegaConf.select(other, "hydra.run.dir") == OmegaConf.select(plain, "hydra.run.dir")
    assert OmegaConf.select(plain, "hydra.run.dir").endswith("/seed=0,trainer.max_steps=20")
    strip = lambda cfg: OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])  # noqa: E731
    assert Identity.of(strip(other)).hash == Identity.of(strip(plain)).hash
    excluded = set(plain.hydra.job.config.override_dirname.exclude_keys)
    assert set(EXCLUDED) <= excluded and "logger.log_checkpoints" in excluded
    assert not {"attn.lam", "trainer.max_steps", "optim.lr"} & excluded  # what is trained stays in the name
