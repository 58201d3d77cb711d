"""``python -m launch.cluster.prepare``: a sweep's data built on the CPU before its jobs, each artefact once,
found ready by the runs (which then build nothing); and the SLURM sweep's check, which refuses a
sweep whose data is not prepared before anything is submitted and builds nothing itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import QUIET, SBATCH_REFUSAL, main_in_process, run_cli, stand_in_slurm
from hydra.utils import instantiate

from launch.cluster import prepare as prep
from launch.cluster.callbacks import DataPrepared
from src.configs import compose
from src.engine.generated import preparing

REFUSAL = SBATCH_REFUSAL
#: the glue_tiny pipeline narrowed to one variant and seed: mlm_tiny, glue_tiny_sst2, glue_tiny_rte
GLUE_TINY = ["experiment=glue_tiny", "attn=standard", "seed=0"]


def files(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``folder`` (lock files aside: taking a lock touches nothing) with its
    modification time and size."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in folder.rglob("*")
        if p.is_file() and p.suffix != ".lock"
    }


# -- the command, and the run after it ------------------------------------------------------------


def test_each_artefact_is_built_once_and_the_runs_then_build_nothing(tmp_path, capsys, monkeypatch):
    """Four jobs (2 tasks x 2 variants) read four artefacts: each is built once, listed once with
    its size; the runs that follow (another process) find all of them ready and write no data
    file; a second prepare builds nothing."""
    data = tmp_path / "data"
    sweep = ["task=mlm_tiny,glue_tiny_sst2", "attn=standard,spectral", f"paths.data_dir={data}"]
    monkeypatch.chdir(tmp_path)  # where the command would run
    code, out, err = main_in_process(prep.main, capsys, "-m", *sweep)
    assert code == 0, err
    closing = [line for line in out.splitlines() if line.startswith("built")]
    assert len(closing) == 4 and out.rstrip().endswith(closing[-1])  # one line each, last
    for line in closing:  # "built  <path>  (<size>): <what>, in <s> s": the size is the path's
        path, size = tmp_path / line.split()[1], line.partition("(")[2].partition(")")[0]
        below = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
        assert size == prep.size_text(sum(f.stat().st_size for f in below))
    names = " ".join(closing)
    wanted = ("glue_tiny (SST-2", "cache train.bin", "cache validation.bin", "WordPiece vocabulary of 256")
    for what in wanted:
        assert names.count(what) == 1, what
    before = files(data)

    steps = ["trainer.max_steps=2", "trainer.val_every=2", "trainer.eval_batches=1", "trainer.num_workers=0"]
    run = run_cli(
        ["-m", "task=mlm_tiny,glue_tiny_sst2", "attn=standard", f"paths.data_dir={data}", *steps], tmp_path
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "generated" not in run.stdout + run.stderr  # the line a run says when it builds data
    assert len(list(tmp_path.glob("outputs/multirun/**/summary.json"))) == 2
    assert files(data) == before  # nothing rewritten, nothing added

    assert prep.main(["-m", *sweep]) == 0  # again: everything already there
    out = capsys.readouterr().out
    states = [line.split("  ")[0] for line in out.splitlines() if not line.startswith(("[", " "))]
    assert states == ["already there"] * 4
    assert files(data) == before


#: one task of each family that builds data, narrowed to a few seconds, and what its run reads
FAMILIES = {
    "lm_tinystories": ["task=lm_tinystories", "task.tokenizer=bpe", "task.bpe_vocab_size=300"],
    "lm_wikitext103": ["task=lm_wikitext103"],  # GPT-2's files (stood in for); the test split too
    "mlm_tiny": ["task=mlm_tiny"],
    "glue_tiny_rte": ["task=glue_tiny_rte"],  # no checkpoint: a WordPiece trained on its sentences
    "lra_listops_small": [
        "task=lra_listops_small",
        *(f"task.generate.{k}={v}" for k, v in {"num_train": 60, "num_val": 10, "num_test": 10}.items()),
    ],
    "coco_shapes": ["task=coco_shapes", "task.generate.num_train=4", "task.generate.num_val=2"],
}


@pytest.fixture(scope="module")
def lm_data(tmp_path_factory) -> Path:
    from smoke import lm

    folder = tmp_path_factory.mktemp("lm")
    lm.prepare(folder)
    return folder


def read_as_a_run(family: str, task, data_dir: Path) -> None:
    """What a run reads: its data sets, and the test split where evaluation reads one; detection's
    run (mmengine's loop) starts from ``prepare_data``, which finds its data and checks it."""
    if family == "coco_shapes":
        task.prepare_data(data_dir)
        return
    task.datasets(data_dir)
    if "test" in task.eval_splits:
        task.eval_dataset(data_dir, "test")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_prepares_exactly_what_its_run_then_reads_ready(family, lm_data, tmp_path):
    data = lm_data if family.startswith("lm_") else tmp_path / "data"
    overrides = [*FAMILIES[family], f"paths.data_dir={data}"]
    outcome = prep.prepare(overrides, say=lambda line: None)
    assert not outcome.errors and not outcome.gaps and not outcome.nothing
    assert {a.state for a in outcome.artefacts.values()} == {"built"}
    before = files(data)
    with prep.pretrained_placeholder():
        task = instantiate(compose(overrides).task)
    with preparing() as run:
        read_as_a_run(family, task, data)
    assert set(run.artefacts) == set(outcome.artefacts)  # the run reads what was prepared, no more
    assert {a.state for a in run.artefacts.values()} == {"ready"}
    assert files(data) == before


def test_tasks_with_nothing_to_build_say_so(tmp_path, capsys):
    code = prep.main(["-m", "task=digits,modadd", f"paths.data_dir={tmp_path}"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert [line for line in out if line.startswith("nothing to prepare")] == [
        "nothing to prepare: digits (its data is read as it is when a run starts)",
        "nothing to prepare: modadd (its data is read as it is when a run starts)",
    ]
    assert list(tmp_path.iterdir()) == []


def test_a_missing_data_set_is_an_error_naming_it_and_nothing_is_built(tmp_path, capsys):
    code = prep.main(["task=lm_tinystories", f"paths.data_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: lm_tinystories: missing TinyStories split 'train'")
    assert list(tmp_path.iterdir()) == []


def test_check_lists_what_is_missing_and_builds_nothing(tmp_path, capsys):
    code = prep.main([*GLUE_TINY, f"paths.data_dir={tmp_path / 'data'}", "--check"])
    out = capsys.readouterr().out
    assert code == 2 and not (tmp_path / "data").exists()
    (gap,) = [line for line in out.splitlines() if line.startswith("not prepared")]
    assert "glue_tiny (SST-2 and RTE" in gap and gap.endswith(
        ": not built yet (for mlm_tiny, glue_tiny_sst2, glue_tiny_rte)"
    )


# -- the SLURM sweep's check ----------------------------------------------------------------------


def sweep_config(overrides: list[str], tmp_path: Path):
    """The config a multirun's callbacks get, its ``hydra`` node included (``hydra.overrides.task``:
    the command line's overrides)."""
    return compose([*overrides, *QUIET], tmp_path, hydra=True)


def test_the_check_refuses_an_unprepared_slurm_sweep_in_one_line_and_passes_a_prepared_one(tmp_path, capsys):
    data = tmp_path / "data"
    overrides = [*GLUE_TINY, f"paths.data_dir={data}"]
    cfg = sweep_config(["hydra/launcher=slurm", *overrides], tmp_path)
    with pytest.raises(SystemExit) as stop:
        DataPrepared().on_multirun_start(cfg)
    (line,) = capsys.readouterr().err.splitlines()
    assert stop.value.code == 2 and line.startswith("error: this sweep's data is not prepared (glue_tiny")
    assert f"; run python -m launch.cluster.prepare {' '.join(overrides)} " in line
    assert not data.exists()  # the check built nothing
    assert (
        prep.main(line.partition("launch.cluster.prepare ")[2].split()) == 0
    )  # the command it names prepares
    capsys.readouterr()
    DataPrepared().on_multirun_start(cfg)  # prepared: no refusal
    assert capsys.readouterr().err == ""


def test_local_multiruns_are_not_checked(tmp_path):
    cfg = sweep_config([*GLUE_TINY, f"paths.data_dir={tmp_path / 'data'}"], tmp_path)
    DataPrepared().on_multirun_start(cfg)  # the basic launcher: the runs prepare their own data
    cfg = sweep_config(["hydra/launcher=local", *GLUE_TINY, f"paths.data_dir={tmp_path / 'data'}"], tmp_path)
    DataPrepared().on_multirun_start(cfg)
    assert not (tmp_path / "data").exists()


@pytest.mark.slow  # three entry points (~8 s of CPU); the check's logic is tested above, without them
def test_an_unprepared_slurm_sweep_submits_nothing(tmp_path):
    """The real entry point with stand-ins for SLURM's commands: refused before sbatch runs; once
    prepared, the same command goes on to submit (and meets the stand-in sbatch's refusal)."""
    env = stand_in_slurm(tmp_path, f"touch {tmp_path}/sbatch-ran; echo '{REFUSAL}' >&2; exit 1")
    args = ["-m", *GLUE_TINY, f"paths.data_dir={tmp_path / 'data'}", "hydra/launcher=slurm"]
    args += ["hydra.launcher.gpus_per_node=0"]
    refused = run_cli(args, cwd=tmp_path, env=env)
    assert refused.returncode == 2 and not (tmp_path / "sbatch-ran").exists()
    (line,) = refused.stderr.strip().splitlines()
    assert (
        "data is not prepared" in line and "run python -m launch.cluster.prepare experiment=glue_tiny" in line
    )
    assert prep.main([*GLUE_TINY, f"paths.data_dir={tmp_path / 'data'}"]) == 0
    submitted = run_cli(args, cwd=tmp_path, env=env)
    assert submitted.returncode == 2 and (tmp_path / "sbatch-ran").exists()
    assert submitted.stderr.strip().splitlines()[-1].endswith(REFUSAL)
