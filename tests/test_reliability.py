"""Nothing lost under kills, failures, bad input and outages.

Longer than 300 lines: every way a run can be interrupted or fed bad input, in one catalogue.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import (
    QUIET,
    ROOT,
    compose,
    main_in_process,
    make_image_folder,
    one_error_line,
    run_cli,
    src_run_here,
)
from smoke.lm import HUB

from launch.analysis import report
from launch.analysis.records import read_runs
from src.engine import train
from src.engine.loop.trainer import NonFiniteLoss
from src.engine.record import checkpoint
from src.engine.record.checkpoint import CheckpointError
from src.engine.record.files import read_metrics

DIGITS_RUN = Path("runs/digits/vit_digits/precond/seed=0")


def only_run(root: Path) -> Path:
    (config,) = root.glob("**/.hydra/config.yaml")
    return config.parent.parent


def rows(run: Path) -> list[dict]:
    return read_metrics(run)


def comparable(run: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "throughput"} for r in rows(run)]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return checkpoint.load(run / "checkpoints" / "last.pt")["model"]


# -- 1. kill and resume ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.minutes(2)
def test_killed_at_ten_random_steps_a_run_ends_bit_identical(tmp_path):
    args = [
        "trainer.max_steps=120",
        "trainer.checkpoint_every=5",
        "trainer.log_every=5",
        "trainer.val_every=30",
        "trainer.monitor_every=30",
        "attn=cond_tokens",
    ]
    for folder in ("whole", "killed"):
        (tmp_path / folder).mkdir()
    assert run_cli(args, cwd=tmp_path / "whole").returncode == 0

    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"}
    kill_steps = sorted(random.Random(0).sample(range(8, 115), 10))
    for target in kill_steps:
        process = subprocess.Popen(
            [sys.executable, "-m", "src.run", *args, *QUIET],
            cwd=tmp_path / "killed",
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            metrics = list((tmp_path / "killed").glob("outputs/**/metrics.jsonl"))
            if metrics and any(r["step"] >= target for r in read_metrics(metrics[0].parent, warn=False)):
                break
            time.sleep(0.02)
        assert process.poll() is None, f"the run ended before step {target}"
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert run_cli(args, cwd=tmp_path / "killed").returncode == 0

    whole, killed = only_run(tmp_path / "whole"), only_run(tmp_path / "killed")
    ended, resumed = (json.loads((r / "summary.json").read_text()) for r in (whole, killed))
    assert ended["final"] == resumed["final"] and ended["best"] == resumed["best"] and resumed["steps"] == 120
    assert comparable(whole) == comparable(killed)
    a, b = weights(whole), weights(killed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def short_run(tmp_path: Path, name: str, *extra: str) -> dict:
    cfg = compose(
        [
            "trainer.max_steps=20",
            "trainer.checkpoint_every=5",
            "trainer.val_every=5",
            "trainer.log_every=5",
            "trainer.monitor_every=0",
            *extra,
        ],
        tmp_path,
    )
    return train(cfg, tmp_path / name)


def test_a_corrupt_last_checkpoint_falls_back_to_the_previous_one_and_is_set_aside(tmp_path):
    whole = short_run(tmp_path, "whole")
    run = tmp_path / "damaged"
    short_run(tmp_path, "damaged")  # the same run: last.pt at step 20, previous.pt at step 15
    (run / "summary.json").unlink()  # as if killed after its last checkpoint
    last = run / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # truncated, as a full disk leaves it
    damaged = last.read_bytes()
    with pytest.warns(
        UserWarning,
        match=r"unreadable checkpoint .*last\.pt \(RuntimeError: PytorchStreamReader failed reading zip "
        r"archive: failed finding central directory\), moved to last\.pt\.corrupt; resuming from "
        r".*previous\.pt \(step 15\)",
    ):
        resumed = short_run(tmp_path, "damaged")  # steps 16-20 again
    assert resumed["final"] == whole["final"] and resumed["best"] == whole["best"]
    assert comparable(run) == comparable(tmp_path / "whole")
    a, b = weights(tmp_path / "whole"), weights(run)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the damaged file is kept aside, never rotated: previous.pt is still the good step-15 one
    assert (run / "checkpoints" / "last.pt.corrupt").read_bytes() == damaged
    assert checkpoint.load(run / "checkpoints" / "previous.pt")["loop"]["step"] == 15


def test_two_unreadable_checkpoints_are_one_clear_error_and_stay_where_they_are(tmp_path):
    short_run(tmp_path, "run", "trainer.max_steps=10")
    (tmp_path / "run" / "summary.json").unlink()  # as if killed after its last checkpoint
    for name in ("last.pt", "previous.pt"):
        (tmp_path / "run" / "checkpoints" / name).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError) as error:
        short_run(tmp_path, "run", "trainer.max_steps=10")
    message = str(error.value)
    assert "no readable checkpoint in" in message and "trainer.resume=restart" in message
    # each file's reason whole: torch's paragraph reduced to its point, never cut mid-sentence
    assert message.count("refused by torch's safe loader: Unsupported operand") == 2
    assert "Weights only load failed" not in message and "\n" not in message
    left = {p.name for p in (tmp_path / "run" / "checkpoints").iterdir()}
    assert left == {"last.pt", "previous.pt", "best.pt"}  # nothing set aside, nothing removed


# -- 2. sweeps keep what finished -------------------------------------------------------------


@pytest.mark.slow
def test_a_sweep_keeps_what_finished_and_the_report_lists_the_failures(tmp_path):
    # the last two make no batch (under the 4-epoch bound, which has its own refusal): planted failures
    sizes = "16,17,18,19,20,21,22,23,24,25,2000,3000"
    result = run_cli(
        [
            "-m",
            f"task.batch_size={sizes}",
            "trainer.max_steps=4",
            "trainer.val_every=4",
            "trainer.monitor_every=0",
            "sweep_name=planted",
        ],
        cwd=tmp_path,
    )
    assert result.returncode != 0  # Hydra reports the failed jobs once all have run
    sweep = tmp_path / "outputs" / "multirun" / "planted"
    runs = read_runs([sweep])
    assert len(runs) == 10 and all(r.status == "completed" for r in runs)
    # refused before their first step (bad input): Hydra's end of the sweep names them, and they
    # leave no record for a report to list as runs that did not complete (nothing ran)
    assert (result.stdout + result.stderr).count("1078 training samples make no batch") >= 2
    assert "(10 completed, 2 failed) in " in result.stdout  # the sweep's end line counts them
    assert report.main([str(sweep), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "## Runs that did not complete (0)" in text


# -- 3. non-finite loss ------------------------------------------------------------------------


def test_a_nan_loss_stops_naming_the_step_the_last_finite_loss_and_the_checkpoint(tmp_path):
    with pytest.raises(NonFiniteLoss) as error:
        short_run(
            tmp_path,
            "run",
            "optim.lr=1e30",
            "sched.warmup_steps=0",
            "trainer.clip_grad=null",
            "trainer.checkpoint_every=1",
        )
    message = str(error.value)
    step = int(message.split(" at step ")[1].split(";")[0])
    assert "last finite loss " in message and f"at step {step - 1};" in message
    assert f"checkpoints/last.pt (step {step - 1})" in message and "trainer.nonfinite=skip" in message
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("NonFiniteLoss: loss is nan")


def test_nonfinite_skip_skips_the_batch_and_trains_on(tmp_path, monkeypatch):
    from tasks.classification import ImageClassification

    original, calls = ImageClassification.train_loss, []

    def planted(self, model, batch):
        calls.append(1)
        loss = original(self, model, batch)
        return loss * float("nan") if len(calls) == 3 else loss

    monkeypatch.setattr(ImageClassification, "train_loss", planted)
    summary = short_run(tmp_path, "run", "trainer.nonfinite=skip")
    assert summary["status"] == "completed" and summary["skipped_batches"] == 1
    assert {"step": 3, "split": "train", "train/skipped_batches": 1.0} in rows(tmp_path / "run")
    assert all(torch.isfinite(v).all() for v in weights(tmp_path / "run").values())


# -- 4. the bad-input catalogue ----------------------------------------------------------------


def broken_jpeg(root: Path) -> None:
    make_image_folder(root)
    (next((root / "imagenet" / "train").glob("*/*.JPEG"))).write_bytes(b"\xff\xd8\xff\xe0 not a JPEG")


def empty_classes(root: Path) -> None:
    for split in ("train", "val"):
        (root / "imagenet" / split / "n00000").mkdir(parents=True)


def broken_config(root: Path) -> None:
    (root / "conf" / "experiment").mkdir(parents=True)
    (root / "conf" / "experiment" / "broken.yaml").write_text("trainer:\n  max_steps: [1,\n")


def corrupt_checkpoints(root: Path) -> None:
    folder = root / "outputs" / DIGITS_RUN.with_name("seed=0,trainer.max_steps=2") / "checkpoints"
    folder.mkdir(parents=True)
    for name in ("last.pt", "previous.pt"):
        (folder / name).write_bytes(b"garbage")


def listops_missing_column(root: Path) -> None:
    folder = root / "listops-1000"
    folder.mkdir()
    for split in ("train", "val", "test"):
        (folder / f"basic_{split}.tsv").write_text("Source\tTarget\n( [MAX 2 9 ] )\t9\n( [MIN 4 1 ] )\n")


def truncated_token_cache(root: Path) -> None:
    """TinyStories in its real layout, tokenised once; then half of its token array is lost."""
    from hydra.utils import instantiate
    from smoke.lm import prepare

    prepare(root)
    instantiate(compose(["task=lm_tinystories", *HUB], root).task).datasets(root)
    (array,) = root.glob("cache/**/train.bin")
    array.write_bytes(array.read_bytes()[: array.stat().st_size // 2])


def glue_row_added(task: str, row: str):
    """GLUE's official files of ``task`` (tests/glue_fixtures.py), ``row`` added to train.tsv."""

    def setup(root: Path) -> None:
        from glue_fixtures import TASKS, write_lines, write_official

        write_official(root, tasks=(task,))
        train = root / "glue_data" / TASKS[task][0] / "train.tsv"
        lines = train.read_text(encoding="utf-8-sig").splitlines()
        write_lines(train, [*lines[:2], row, *lines[2:]])

    return setup


def mnli_without_mismatched(root: Path) -> None:
    from glue_fixtures import write_official

    write_official(root, tasks=("mnli",))
    (root / "glue_data" / "MNLI" / "dev_mismatched.tsv").unlink()


def corpus_without_text(root: Path) -> None:
    """The mlm corpus in the hub's parquet layout, its column named ``content``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = root / "wikipedia" / "20231101.en"
    folder.mkdir(parents=True)
    table = pa.table({"content": ["a document .", "another ."]})
    pq.write_table(table, folder / "train-00000-of-00001.parquet")


def split_options(args: list[str]) -> tuple[list[str], list[str]]:
    """Hydra's own options (``--config-dir DIR``), which go before the overrides, and the rest."""
    cut = args.index("--config-dir") + 2 if "--config-dir" in args else 0
    return args[:cut], args[cut:]


def earlier_session(root: Path, *args: str) -> None:
    """The same command once before, to completion (``trainer.max_steps=2``, as every case runs), in
    this process: the record it leaves is what the case's command meets."""
    options, overrides = split_options(list(args))
    with src_run_here([*options, "trainer.max_steps=2", *overrides, *QUIET], root) as cli:
        cli()  # a refusal or failure ends it with SystemExit


def edited_experiment(root: Path) -> None:
    """A run of ``--config-dir conf experiment=mine``, then the file edited (another lr)."""
    (root / "conf" / "experiment").mkdir(parents=True)
    mine = root / "conf" / "experiment" / "mine.yaml"
    mine.write_text("# @package _global_\noptim:\n  lr: 0.005\n")
    earlier_session(root, "--config-dir", "conf", "experiment=mine")
    mine.write_text("# @package _global_\noptim:\n  lr: 0.01\n")


def finished_run(root: Path) -> None:
    earlier_session(root)


def killed_with_a_long_record(root: Path) -> None:
    """A run killed after its step-1 checkpoint whose metrics.jsonl is larger than the disk allows
    (:func:`limit_file_size`): the resumed session's first write to it fails."""
    earlier_session(root, "trainer.checkpoint_every=1", "trainer.log_every=1")
    (folder,) = root.glob("outputs/**/checkpoints")
    (folder / "previous.pt").replace(folder / "last.pt")  # the step-1 checkpoint
    (folder.parent / "summary.json").unlink()
    row = json.dumps({"step": 1, "split": "train", "train/loss": 2.0, "padding": "x" * 200})
    with open(folder.parent / "metrics.jsonl", "a") as f:
        f.write((row + "\n") * 2000)  # about 450 KB of rows up to step 1: all kept at resume


def broken_jpeg_read_by_a_worker(root: Path) -> None:
    broken_jpeg(root)


def crafted_cifar(root: Path) -> None:
    """CIFAR-10's python release, one batch replaced by a pickle that would run a command."""
    import pickle

    from smoke.lra import write_cifar

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {root / 'pwned'}",))

    write_cifar(root / "cifar-10-batches-py", 4)
    with open(root / "cifar-10-batches-py" / "data_batch_1", "wb") as f:
        pickle.dump({b"data": Payload(), b"labels": [0]}, f, protocol=2)


def shapes_as_coco(root: Path) -> None:
    """COCO's layout whose categories (square, circle, triangle) are none of COCO's 80."""
    from smoke.detection import TINY_SPEC

    from tasks.detection.shapes import write_coco_shapes

    write_coco_shapes(root / "coco", TINY_SPEC)


def limit_file_size() -> None:
    """A full disk, as a process sees it: writes past 256 KB fail (Python ignores SIGXFSZ)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))


def limit_memory() -> None:
    """A machine with 2 GB for the process's data: enough to import torch and build the model, not
    for a 1024-wide ViT's activations on a batch of 1024."""
    resource.setrlimit(resource.RLIMIT_DATA, (2 * 2**30, 2 * 2**30))


TINY_IMAGENET = [
    "task=imagenet",
    "task.img_size=32",
    "task.batch_size=4",
    "task.eval_batch_size=4",
    "task.num_classes=3",
    "task.repeated_aug=0",  # 12 images: DeiT's repeated epoch rounds down to 256s
    "backbone=vit_micro",
    "trainer.num_workers=0",
]

# (id, command-line arguments, what the one message says, exit status, setup of the folder, env)
CATALOGUE = [
    ("unknown-task", ["task=nope"], "task=nope: no such option in conf/task (options: coco,", 2, None, {}),
    ("unknown-backbone", ["backbone=vit_digit"], "did you mean vit_digits?", 2, None, {}),
    (
        "unknown-attn",
        ["attn=precon"],
        "attn=precon: no such option in conf/attn; did you mean precond?",
        2,
        None,
        {},
    ),
    (
        "unknown-debug",
        ["debug=fdx"],
        "debug=fdx: no such option in conf/debug; did you mean fdr?",
        2,
        None,
        {},
    ),
    (
        "unknown-experiment",
        ["experiment=nope"],
        "experiment=nope: no such option in conf/experiment",
        2,
        None,
        {},
    ),
    ("unknown-variant-option", ["attn=spectral", "+attn.lamda=3"], "unknown option(s) lamda", 2, None, {}),
    (
        "wrong-type-variant-option",
        ["attn=spectral", "attn.lam=ten"],
        "option lam='ten' must be float",
        2,
        None,
        {},
    ),
    (
        "wrong-type-trainer-option",
        ["trainer.max_steps=abc"],
        "Value 'abc' of type 'str' could not be converted",
        1,
        None,
        {},
    ),
    ("unknown-trainer-option", ["trainer.max_step=3"], "did you mean trainer.max_steps?", 2, None, {}),
    (
        "bad-choice",
        ["trainer.precision=fp16"],
        "trainer.precision='fp16' is not one of fp32, bf16",
        2,
        None,
        {},
    ),
    ("no-length", ["trainer.max_steps=0"], "a run needs a length", 2, None, {}),
    ("bad-seed", ["seed=abc"], "seed='abc' must be an integer", 2, None, {}),
    ("bad-accumulate", ["trainer.accumulate=0"], "trainer.accumulate=0 must be at least 1", 2, None, {}),
    (
        "incompatible",
        ["backbone=vit_base"],
        "task=digits and backbone=vit_base are incompatible",
        2,
        None,
        {},
    ),
    (
        "missing-data-folder",
        ["task=imagenet", "paths.data_dir=nowhere"],
        "missing data folder nowhere/imagenet/train",
        2,
        None,
        {},
    ),
    (
        "empty-data-folder",
        [*TINY_IMAGENET, "paths.data_dir=."],
        "no images in class folders",
        2,
        empty_classes,
        {},
    ),
    ("broken-jpeg", [*TINY_IMAGENET, "paths.data_dir=."], "cannot read image", 2, broken_jpeg, {}),
    (
        "label-out-of-range",
        [*TINY_IMAGENET, "task.num_classes=2", "paths.data_dir=."],
        "3 class folders but task.num_classes=2",
        2,
        make_image_folder,
        {},
    ),
    (
        "tsv-wrong-column-count",
        ["task=lra_listops", "paths.data_dir=.", "trainer.threads=1"],
        "every row must be '<expression><TAB><digit>'",
        2,
        listops_missing_column,
        {},
    ),
    (
        "truncated-token-cache",  # the tiny decoder and 2 validation batches: the cache is the point
        ["task=lm_tinystories", *HUB, "backbone=gpt_micro", "trainer.eval_batches=2", "paths.data_dir=."],
        "is damaged",
        0,
        truncated_token_cache,
        {},
    ),
    (
        "config-syntax-error",
        ["--config-dir", "conf", "experiment=broken"],
        "experiment/broken",
        1,
        broken_config,
        {},
    ),
    (
        "unwritable-output",
        ["paths.output_dir=/etc/hostname/out"],
        "cannot write the run folder /etc/hostname/out/runs/digits/vit_digits/precond/seed=0,"
        "trainer.max_steps=2 (Not a directory)",
        2,
        None,
        {},
    ),
    (
        "unwritable-run-folder",
        ["hydra.run.dir=/proc/nope"],
        "cannot write the run folder /proc/nope (No such file or directory)",
        2,
        None,
        {},
    ),
    ("full-disk", [], "cannot write checkpoint", 2, None, {"preexec": limit_file_size}),
    (
        "full-disk-at-resume",
        ["trainer.checkpoint_every=1", "trainer.log_every=1"],
        "metrics.jsonl (File too large;",
        2,
        killed_with_a_long_record,
        {"preexec": limit_file_size},
    ),
    ("corrupt-checkpoints", [], "no readable checkpoint", 2, corrupt_checkpoints, {}),
    (
        "changed-config",
        ["--config-dir", "conf", "experiment=mine"],
        "holds a record of another configuration (record → now: optim.lr: 0.005 → 0.01)",
        2,
        edited_experiment,
        {},
    ),
    ("resume-never", ["trainer.resume=never"], "already holds a record", 2, finished_run, {}),
    (
        "broken-file-in-a-worker",
        [*TINY_IMAGENET[:-1], "trainer.num_workers=1", "paths.data_dir=."],
        "error: cannot read image imagenet/train/",
        2,
        broken_jpeg_read_by_a_worker,
        {},
    ),
    (
        "crafted-cifar-batch",
        ["task=lra_image", "paths.data_dir=."],
        "is not a CIFAR-10 batch: it refers to posix.system",
        2,
        crafted_cifar,
        {"absent": "pwned"},
    ),
    (
        "coco-categories-match-no-class",
        ["task=coco", "paths.data_dir=.", "trainer.num_workers=0", "trainer.max_steps=1"],
        "none of its 3 categories (square, circle, triangle) is one of the task's 80 classes",
        2,
        shapes_as_coco,
        {"needs": "mmdet"},
    ),
    (
        "glue-tsv-wrong-column-count",
        ["task=glue_rte", "paths.data_dir=."],
        "RTE/train.tsv:3: expected 4 columns (index sentence1 sentence2 label), got 2",
        2,
        glue_row_added("rte", "7\tonly two"),
        {},
    ),
    (
        "glue-label-outside-the-set",
        ["task=glue_rte", "paths.data_dir=."],
        "RTE/train.tsv:3: label 'maybe' is not one of entailment, not_entailment",
        2,
        glue_row_added("rte", "7\ta\tb\tmaybe"),
        {},
    ),
    (
        "mnli-without-its-mismatched-dev-set",
        ["task=glue_mnli", "paths.data_dir=."],
        "MNLI needs both dev sets, dev_matched.tsv and dev_mismatched.tsv",
        2,
        mnli_without_mismatched,
        {},
    ),
    (
        "corpus-without-text",
        ["task=mlm", "paths.data_dir=."],
        "has no column 'text'",
        2,
        corpus_without_text,
        {},
    ),
    (
        "pretrained-checkpoint-missing",
        ["task=glue_tiny_rte", "backbone.model.pretrained=nowhere/last.pt", "paths.data_dir=."],
        "backbone.model.pretrained=nowhere/last.pt: no such checkpoint",
        2,
        None,
        {},
    ),
    ("negative-seed", ["seed=-1"], "seed=-1 must be an integer from 0 to 4294967295", 2, None, {}),
    ("batch-of-zero", ["task.batch_size=0"], "task.batch_size=0 must be at least 1", 2, None, {}),
    (
        "eval-batch-of-zero",
        ["task.eval_batch_size=0"],
        "task.eval_batch_size=0 must be at least 1",
        2,
        None,
        {},
    ),
    (
        "negative-threads",
        ["trainer.threads=-1"],
        "trainer.threads=-1 must be at least 1 (or null)",
        2,
        None,
        {},
    ),
    ("no-validation-data", ["task.val_fraction=0"], "task.val_fraction=0 must be in (0, 1)", 2, None, {}),
    ("nan-learning-rate", ["optim.lr=nan"], "optim.lr=nan must be greater than 0", 2, None, {}),
    (  # would flip the gradient and train wrong, saying "completed"
        "negative-clipping",
        ["trainer.clip_grad=-1"],
        "trainer.clip_grad=-1.0 must be greater than 0 (or null)",
        2,
        None,
        {},
    ),
    (  # would never validate and end with final: {}
        "negative-eval-batches",
        ["trainer.eval_batches=-1"],
        "trainer.eval_batches=-1 must be at least 1 (or null)",
        2,
        None,
        {},
    ),
    ("ema-over-one", ["trainer.ema=1.5"], "trainer.ema=1.5 must be in (0, 1) (or null)", 2, None, {}),
    (
        "out-of-memory",
        ["task.batch_size=1024", "backbone.model.embed_dim=1024", "trainer.threads=1"],
        "out of memory at step 0 on the CPU (it asked for",
        2,
        None,
        {"preexec": limit_memory},
    ),
    ("no-gpu", ["trainer.device=cuda"], "no usable CUDA GPU", 2, None, {}),
    (
        "slurm-unavailable",
        ["-m", "hydra/launcher=slurm"],
        "hydra/launcher=slurm",
        2,
        None,
        {"env": {"SLURM_CONF": "/nonexistent/slurm.conf"}},
    ),
    (
        "wandb-unreachable",
        ["logger=wandb", "logger.init_timeout=5"],
        "training goes on",
        0,
        None,
        {"env": {"WANDB_MODE": "online", "WANDB_API_KEY": "x" * 40, "WANDB_BASE_URL": "http://127.0.0.1:9"}},
    ),
    # issue 25: refused from the config alone, before torch is imported (tests/test_cli.py: torch-free)
    ("new-trainer-key", ["+trainer.max_step=5"], "nothing reads a new key; did you mean trainer.max_step", 2),
    ("new-top-level-key", ["+sed=1"], "did you mean seed?", 2),
    ("sweep-cfg-job", ["-m", "experiment=glue_tiny", "--cfg", "job"], "drop -m and name one value", 2),
    ("sweep-cfg-hydra", ["-m", "hydra/launcher=slurm", "--cfg", "hydra"], "--cfg prints one job's config", 2),
    ("attn-and-reading", ["attn=precond", "reading=spectral_qk"], "is a reading of attn=spectral", 2),
    (
        "cfg-resolve-pretrained-by",
        ["experiment=glue_tiny", "task=glue_tiny_rte", "--cfg", "job", "--resolve"],
        "exists only once the run starts",
        2,
    ),
]
CATALOGUE = [c if len(c) == 6 else (*c, None, {}) for c in CATALOGUE]  # (id, args, message, status)


#: Cases src/cli.py or src/precheck.py refuses from the config alone, before Hydra's main and before
#: torch is imported: in process, the test fails if one reaches Hydra's main.
CONFIG_ALONE = {
    *("unknown-task", "unknown-backbone", "unknown-attn", "unknown-debug", "unknown-experiment"),
    *("unknown-trainer-option", "bad-choice", "no-length", "bad-seed", "bad-accumulate", "incompatible"),
    *("negative-seed", "batch-of-zero", "eval-batch-of-zero", "negative-threads", "no-validation-data"),
    *("nan-learning-rate", "negative-clipping", "negative-eval-batches", "ema-over-one"),
    *("new-trainer-key", "new-top-level-key", "sweep-cfg-job", "sweep-cfg-hydra", "attn-and-reading"),
    "cfg-resolve-pretrained-by",
}
#: Cases run as a real ``python -m src.run`` process, proving the process boundary (exit status, the
#: one line on stderr, nothing written) for each kind of refusal: one of each config-alone kind (a
#: group selection, a key, a value, a task/backbone fit, -m with --cfg), a data folder and a record
#: refused by the run, a data loader's worker process, a crafted pickle (kept out of the test's own
#: process), the detection stack and a warning (pytest records warnings: only a process of its own
#: shows one on stderr); cases with rlimits or their own environment are processes too.
#: The others call the entry point's own ``cli()`` in this process: the same argv, cwd and code path.
PROCESS_KEPT = {
    *("unknown-backbone", "unknown-trainer-option", "negative-seed", "incompatible", "sweep-cfg-job"),
    *("missing-data-folder", "resume-never", "broken-file-in-a-worker", "crafted-cifar-batch"),
    *("coco-categories-match-no-class", "truncated-token-cache"),
}


@pytest.mark.parametrize(
    "args, message, status, setup, extra", [c[1:] for c in CATALOGUE], ids=[c[0] for c in CATALOGUE]
)
def test_bad_input_ends_in_one_clear_message(args, message, status, setup, extra, tmp_path, request):
    if extra.get("needs"):
        pytest.importorskip(extra["needs"])
    if setup is not None:
        setup(tmp_path)
    before = {  # the record a setup left, Hydra's copy of its command (.hydra/) included: a process
        p: p.read_bytes()  # refused the folder leaves it as it was (Hydra's log describes each invocation)
        for p in tmp_path.glob("outputs/**/*")
        if p.is_file() and p.suffix != ".log"
    }
    options, overrides = split_options(args)
    argv = [*options, "trainer.max_steps=2", *overrides, *QUIET]
    case = request.node.callspec.id
    if case not in PROCESS_KEPT and not extra.get("preexec") and not extra.get("env"):
        with src_run_here(argv, tmp_path, config_alone=case in CONFIG_ALONE) as cli:
            returncode, _, stderr = main_in_process(lambda _: cli(), request.getfixturevalue("capsys"))
        if case in CONFIG_ALONE:
            one_error_line(stderr)  # exactly one line, the error's
    else:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled", **extra.get("env", {})}
        result = subprocess.run(
            [sys.executable, "-m", "src.run", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            preexec_fn=extra.get("preexec"),
        )
        returncode, stderr = result.returncode, result.stderr
    assert returncode == status, stderr[-2000:]
    assert message in stderr, stderr[-2000:]
    if status == 2:  # the suite's own errors: the message alone, no traceback
        assert "Traceback" not in stderr and "error: " in stderr
    if status:  # nothing half-written, nothing lost: no new checkpoint, no temporary file
        assert not [p for p in tmp_path.glob("**/checkpoints/*") if p not in before]
        assert not list(tmp_path.glob("outputs/**/*.tmp"))
        kept = {p: p.read_bytes() for p in before if p.exists()}
        assert kept.keys() == before.keys(), "a file the setup wrote is gone"
        changed = [p for p in before if kept[p] != before[p]]
        assert {p.name for p in changed} <= {"failures.jsonl", "summary.json"}, changed  # the failure
        assert not [p for p in changed if b'"completed"' in before[p]]  # a finished record, untouched
    if extra.get("absent"):
        assert not (tmp_path / extra["absent"]).exists()
