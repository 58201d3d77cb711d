"""A received sweep folder is data (issue 39, items 1, 2 and settle's minor cases of 7): nothing in
its files runs when ``launch.analysis.settle`` relaunches its runs, no resolver runs on a record read back
(the report, settle, eval, the sandbox's titles), and settle's refusals are one line.

The sweep folders here are written as ``python -m src.run -m`` writes them (the config the suite
composes, resolved into ``config.yaml``, its identity into ``identity.json``, the job's overrides
into ``.hydra/overrides.yaml``, the sweep's into ``multirun.yaml``) but without training, so that
each test takes seconds; ``tests/launch/test_settle.py`` settles a really trained sweep."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from test_claims import run
from test_settle import GAIN, FakeSweep

from launch.analysis import settle
from launch.analysis.claims import Claim
from launch.analysis.records import read_runs
from src.configs import compose
from src.engine.record.identity import Identity

ROOT = Path(__file__).resolve().parents[2]
SHORT = [
    "trainer.max_steps=2",
    "trainer.val_every=1",
    "trainer.monitor_every=1",
    "trainer.checkpoint_every=2",
]
SECRET = "s3cret-" + hashlib.sha256(os.urandom(16)).hexdigest()[:20]  # unique: found only where it leaked


# -- sweep folders as src.run writes them ---------------------------------------------------------------


def write_record(root: Path, job: list[str], seed: int, acc: float) -> Path:
    """The record of ``python -m src.run -m <job> seed=<seed>`` (hydra.sweep.dir=root), finished
    with validation accuracy ``acc``, as the suite writes it; nothing trained."""
    overrides = [*job, f"seed={seed}"]
    tree = OmegaConf.to_container(compose(overrides), resolve=False)
    resolved = OmegaConf.to_container(OmegaConf.create(tree), resolve=True)
    identity = Identity.of(resolved)
    named = ",".join(sorted(o for o in overrides if not o.startswith(("task=", "seed=", "paths."))))
    folder = root / resolved["task"]["name"] / resolved["attn"]["variant"] / f"seed={seed},{named}"
    (folder / ".hydra").mkdir(parents=True)
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(resolved))
    (folder / "identity.json").write_text(json.dumps({"hash": identity.hash, "config": identity.config}))
    (folder / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(tree))
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 2, "split": "val", "val/acc": acc}) + "\n")
    summary = {"status": "completed", "metric": "val/acc", "metric_mode": "max", "final": {"val/acc": acc}}
    (folder / "summary.json").write_text(json.dumps(summary | {"steps": 2}))
    return folder


def write_sweep(
    root: Path, seeds: tuple[int, ...] = (0, 1), extra: tuple[str, ...] = (), hydra: tuple[str, ...] = ()
) -> Path:
    """``python -m src.run -m task=digits reading=standard,spectral_q seed=<seeds> <extra>``."""
    for reading in ("standard", "spectral_q"):
        for seed in seeds:
            acc = 0.5 + 0.01 * seed + (0.003 if reading != "standard" else 0.0)
            write_record(root, ["task=digits", f"reading={reading}", *SHORT, *extra], seed, acc)
    given = [f"hydra.sweep.dir={root}", "hydra.mode=MULTIRUN", *hydra]
    task = ["task=digits", "reading=standard,spectral_q", f"seed={','.join(map(str, seeds))}", *SHORT]
    (root / "multirun.yaml").write_text(
        yaml.safe_dump({"hydra": {"overrides": {"hydra": given, "task": task}}})
    )
    return root


def files_of(root: Path) -> dict[str, str]:
    """Every file under ``root`` and its content's hash: what a refusal must leave as it was."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def edit_overrides(folder: Path, change) -> Path:
    path = folder / ".hydra" / "overrides.yaml"
    path.write_text(yaml.safe_dump(change(yaml.safe_load(path.read_text()))))
    return path


def spectral_runs(root: Path) -> list[Path]:
    return sorted((root / "digits" / "spectral").iterdir())


def one_error_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr[-3000:]
    return lines[0]


class Payload:
    """A pickle that, once loaded, creates ``marker``: what the attacker's ``torch.load`` runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def torch_load_chain(marker: Path) -> str:
    """The issue's payload as an override value: ``torch.load(weights_only=False)`` of
    ``io.BytesIO(base64.b64decode(…))``, which Hydra's blocklist lets through."""
    data = base64.b64encode(pickle.dumps(Payload(marker))).decode()
    source = f"{{_target_:base64.b64decode,s:'{data}'}}"
    return f"{{_target_:torch.load,weights_only:false,f:{{_target_:io.BytesIO,initial_bytes:{source}}}}}"


class Launches:
    """``subprocess.run`` for settle's launches: records each, and writes the records the launched
    command would leave (the config it composes, trained to nothing); other calls run for real."""

    def __init__(self, root: Path) -> None:
        self.root, self.calls, self.real = root, [], subprocess.run

    def __call__(self, argv, *args, **kwargs):
        if list(argv[1:3]) != ["-m", "src.run"]:
            return self.real(argv, *args, **kwargs)
        given = list(argv[4:])
        self.calls.append(given)
        seeds = next(o for o in given if o.startswith("seed=")).removeprefix("seed=").split(",")
        job = [o for o in given if not o.lstrip("~+").startswith(("seed=", "hydra"))]
        for seed in map(int, seeds):
            write_record(self.root, job, seed, 0.5 + 0.01 * seed)
        return subprocess.CompletedProcess(argv, 0)


# -- item 1: the folder's files never run ---------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [["--first", "3", "--cap", "3"], ["--confirm", "spectral_q", "--seeds", "1"]],
    ids=["settle", "confirm"],
)
def test_a_torch_load_chain_in_a_runs_overrides_yaml_never_runs(tmp_path, capsys, options):
    """settle runs code from a received sweep folder: an override whose ``_target_`` chains
    ``torch.load(weights_only=False)`` over ``io.BytesIO(base64.b64decode(…))`` in the runs'
    ``.hydra/overrides.yaml`` is refused in one line naming the file, before anything is launched
    or written, by settle (a first look at 3 seeds launches seed 2) and by ``--confirm``; the
    marker file never appears."""
    root, marker = write_sweep(tmp_path / "sweep"), tmp_path / "pwned"
    for folder in spectral_runs(root):
        edit_overrides(folder, lambda o: [*o, f"+task.pwn={torch_load_chain(marker)}"])
    before = files_of(root)
    code = settle.main([str(root), *options])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and not marker.exists()
    assert f"{spectral_runs(root)[0] / '.hydra' / 'overrides.yaml'}: '+task.pwn=" in line
    assert "special key _target_" in line and files_of(root) == before  # no settle.json, no run


def test_a_hydra_callback_in_multirun_yaml_never_runs(tmp_path, capsys):
    """settle runs code from a received sweep folder: the same payload as ``+hydra.callbacks.pwn=…``
    among ``multirun.yaml``'s Hydra overrides (every seed would also train, and settle exit 0) is
    refused in one line naming the file; the marker file never appears and nothing is written."""
    marker = tmp_path / "pwned"
    root = write_sweep(tmp_path / "sweep", hydra=(f"+hydra.callbacks.pwn={torch_load_chain(marker)}",))
    before = files_of(root)
    code = settle.main([str(root), "--first", "3", "--cap", "3"])
    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and not marker.exists() and files_of(root) == before
    assert line.startswith(f"error: {root / 'multirun.yaml'}: '+hydra.callbacks.pwn=")


def test_the_sweeps_launcher_is_kept_and_its_shell_lines_come_only_from_the_command_line(tmp_path):
    """A received ``multirun.yaml`` keeps its launcher, the launcher's plain sizes and queues, and
    removed suite callbacks; ``hydra.launcher.setup`` (shell lines in every SLURM job) is refused
    naming the file, and the user gives it, trusted, on settle's own command line, which takes
    nothing but Hydra overrides."""
    from launch.analysis import relaunch

    kept = ("hydra/launcher=slurm", "hydra.launcher.partition=gpu", "~hydra.callbacks.data_prepared")
    root = write_sweep(tmp_path / "sweep", hydra=kept)
    assert relaunch.sweep_hydra(root) == list(kept)
    shell = "hydra.launcher.setup=[touch /tmp/pwned]"
    for given, culprit in (
        (shell, shell),
        ("hydra.launcher.partition='gpu; touch /tmp/pwned'", "hydra.launcher.partition="),
        ("hydra.job.env_set.LD_PRELOAD=/tmp/x.so", "hydra.job.env_set"),
        ("hydra/launcher=../../../tmp/evil", "hydra/launcher="),
    ):
        (root / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"hydra": [given]}}}))
        with pytest.raises(relaunch.Refused, match="multirun.yaml: ") as refused:
            relaunch.sweep_hydra(root)
        assert culprit in str(refused.value) and "settle's command line" in str(refused.value)
    assert settle.own_hydra([shell]) == [shell]
    with pytest.raises(settle.SuiteError, match="only Hydra overrides"):
        settle.own_hydra(["trainer.max_steps=9"])


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda o: [x.replace("max_steps=2", "max_steps=3") for x in o], "disagrees with the run's record"),
        (lambda o: [*o, "+task.extra=1"], "disagrees with the run's record"),
        (lambda o: [x.replace("seed=0", "seed=5") for x in o], "disagrees with the run's record"),
        (lambda o: [x.replace("spectral_q", "spectral_svd") for x in o], "composes to another configuration"),
        (lambda o: [x.replace("spectral_q", "../../../tmp/evil") for x in o], "selects no file of the suite"),
        (lambda o: [*o, "trainer.val_every=${oc.env:HOME}"], "an interpolation"),
        (lambda o: [*o, "hydra.job.env_set.X=1"], "a Hydra setting"),
        (lambda o: "not a list", "is not a list of overrides"),
    ],
    ids=["value", "added-key", "seed", "group", "group-path", "interpolation", "hydra", "not-a-list"],
)
def test_an_overrides_file_that_disagrees_with_its_record_is_refused_naming_it(
    tmp_path, monkeypatch, capsys, change, said
):
    """A sweep folder whose overrides files disagree with its records (a value, an added key, the
    seed, the reading, a group choice outside conf/, an interpolation, a Hydra setting, a file that
    is not a list) is refused in one line naming the file: exit 2, nothing launched or written."""
    root = write_sweep(tmp_path / "sweep")
    edited = edit_overrides(spectral_runs(root)[0], change)
    before = files_of(root)
    launches = Launches(root)
    monkeypatch.setattr(settle.subprocess, "run", launches)
    assert settle.main([str(root), "--first", "3", "--cap", "3"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"error: {edited}") and said in line
    assert launches.calls == [] and files_of(root) == before


def test_settle_launches_each_experiment_with_the_command_rebuilt_from_its_record(tmp_path, monkeypatch):
    """The command settle launches is the suite's: each experiment's own checked overrides in
    Hydra's spelling (the run folder's name, so an unfinished seed resumes there) and the data
    folder its identity names; the new seeds join their experiment."""
    root = write_sweep(tmp_path / "sweep", hydra=("~hydra.callbacks.data_prepared",))
    data_dir = json.loads(next(root.rglob("identity.json")).read_text())["config"]["paths"]["data_dir"]
    launches = Launches(root)
    monkeypatch.setattr(settle.subprocess, "run", launches)
    assert settle.main([str(root), "--first", "3", "--cap", "3", "hydra.verbose=true"]) == 0
    tail = [
        "seed=2",
        "~hydra.callbacks.data_prepared",
        f"hydra.sweep.dir={root.resolve()}",
        "hydra.verbose=true",
    ]
    assert sorted(launches.calls) == sorted(
        ["task=digits", f"reading={reading}", *SHORT, f"paths.data_dir='{data_dir}'", *tail]
        for reading in ("standard", "spectral_q")
    )
    runs = read_runs([root])
    assert sorted((r.attn, r.seed) for r in runs) == [
        (a, s) for a in ("spectral", "standard") for s in range(3)
    ]
    assert len({r.experiment for r in runs}) == 2  # seed 2 of each is its experiment's


# -- item 2: no resolver runs on a record read back -------------------------------------------------------


def hydra_only_record(root: Path) -> Path:
    """A record that holds only ``.hydra/config.yaml``, its task named by ``${oc.env:MYSECRET}``
    (and its backbone copying that name): the issue's case."""
    folder = root / "r1"
    (folder / ".hydra").mkdir(parents=True)
    config = {
        "task": {"name": "${oc.env:MYSECRET}", "metric": "val/acc"},
        "backbone": {"name": "${task.name}"},
        "attn": {"variant": "standard"},
        "seed": 0,
    }
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 2, "split": "val", "val/acc": 0.5}) + "\n")
    summary = {"status": "completed", "metric": "val/acc", "metric_mode": "max", "final": {"val/acc": 0.5}}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def leaked(where: Path, *texts: str) -> list[str]:
    """The files under ``where`` and the ``texts`` that hold the secret."""
    found = [str(p) for p in where.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    return found + [f"output {i}" for i, t in enumerate(texts) if SECRET in t]


def test_a_records_oc_env_secret_never_reaches_the_report(tmp_path):
    """The report prints a secret: a record that holds only ``.hydra/config.yaml`` with
    ``task.name: ${oc.env:MYSECRET}`` put the variable's value into report.md, results.csv and
    results.json; now the value is in no file written, nor on stdout or stderr, and the name is
    shown as written."""
    hydra_only_record(tmp_path / "runs")
    env = {**os.environ, "MYSECRET": SECRET}
    command = [
        sys.executable,
        "-m",
        "launch.analysis.report",
        str(tmp_path / "runs"),
        "--out",
        str(tmp_path / "out"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert {p.name for p in (tmp_path / "out").iterdir()} >= {"report.md", "results.csv", "results.json"}
    assert leaked(tmp_path, done.stdout, done.stderr) == []
    assert "${oc.env:MYSECRET}" in (tmp_path / "out" / "report.md").read_text()


def test_no_resolver_runs_for_settle_eval_or_the_sandbox_on_a_record(tmp_path, monkeypatch, capsys):
    """No resolver runs on data read from disk: the records settle reads, the ``config.yaml`` eval
    reads and the sandbox's titles show ``${oc.env:…}`` as written (eval refuses it), and a custom
    resolver the process has registered is never called on a record; the secret is in no output."""
    from src import eval as evaluate
    from src.sandbox.record import run_title

    called = tmp_path / "resolver-called"
    OmegaConf.register_new_resolver("touch_marker", lambda: called.touch() or "x", replace=True)
    monkeypatch.setenv("MYSECRET", SECRET)
    runs = hydra_only_record(tmp_path / "runs").parent
    (runs / "multirun.yaml").write_text(yaml.safe_dump({"hydra": {"overrides": {"hydra": []}}}))
    hydra_config = runs / "r1" / ".hydra" / "config.yaml"
    hydra_config.write_text(hydra_config.read_text() + "extra: ${touch_marker:}\n")
    (record,) = read_runs([runs])
    assert (record.task, record.backbone) == ("${oc.env:MYSECRET}", "${oc.env:MYSECRET}")
    assert record.identity.config["extra"] == "${touch_marker:}" and not called.exists()
    settle.main([str(runs), "--cap", "3"])
    folder = write_record(tmp_path / "sweep", ["task=digits", *SHORT], 0, 0.5)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["task"]["name"] = "${oc.env:MYSECRET}"
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    assert evaluate.main([str(folder), "trainer.device=cpu"]) == 2
    assert run_title(folder).startswith("${oc.env:MYSECRET} · ")
    out = capsys.readouterr()
    assert "holds an interpolation at task.name ('${oc.env:MYSECRET}')" in out.err
    assert leaked(tmp_path, out.out, out.err) == [] and not called.exists()
    OmegaConf.clear_resolver("touch_marker")


def test_values_read_as_data_follow_node_interpolations_and_keep_every_resolver_call_as_text():
    """:func:`as_data`: ``${seed}``, ``${.parts}`` and ``x${task.name}`` are followed; ``${oc.env:…}``,
    a suite resolver, a nested call and a copy of any of them stay text; a missing key stays text."""
    from src.engine.record.safe_config import as_data

    tree = {
        "seed": 3,
        "task": {"name": "${oc.env:MYSECRET}", "label": "x${task.name}", "data_seed": "${seed}"},
        "attn": {"parts": ["a", "b"], "variant": "${attn_parts:${.parts}}", "copy": "${.parts}"},
        "paths": {"data_dir": "${oc.env:DATA_DIR,./data}", "nested": "${oc.decode:${seed}}"},
        "gone": "${no.such.key}",
    }
    assert as_data(tree) == {
        "seed": 3,
        "task": {"name": "${oc.env:MYSECRET}", "label": "x${oc.env:MYSECRET}", "data_seed": 3},
        "attn": {"parts": ["a", "b"], "variant": "${attn_parts:${.parts}}", "copy": ["a", "b"]},
        "paths": {"data_dir": "${oc.env:DATA_DIR,./data}", "nested": "${oc.decode:${seed}}"},
        "gone": "${no.such.key}",
    }


# -- item 7: settle's minor cases ---------------------------------------------------------------------------


def test_settle_readings_naming_no_reading_of_the_folder_is_one_line(tmp_path, monkeypatch, capsys):
    """``settle --readings nosuch`` settled 0 of 0 rows with rc 0: now one line naming the
    readings the folder has, exit 2, nothing launched or written."""
    root = write_sweep(tmp_path / "sweep")
    before = files_of(root)
    launches = Launches(root)
    monkeypatch.setattr(settle.subprocess, "run", launches)
    assert settle.main([str(root), "--readings", "nosuch", "--cap", "3"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == f"error: --readings nosuch: no such reading in {root} (readings: spectral_q, standard)"
    assert launches.calls == [] and files_of(root) == before


def test_settle_on_a_folder_mixing_two_sweeps_launches_nothing_of_the_wrong_one(
    tmp_path, monkeypatch, capsys
):
    """settle on a folder mixing two sweeps launched seeds of the wrong experiment at the first
    look (each sweep's seeds for the other's experiments): now refused in one line, nothing
    launched or written. One sweep whose run never started (a seed missing) still gets it."""
    root = write_sweep(tmp_path / "sweep")
    write_sweep(root, seeds=(5, 6), extra=("optim.lr=0.001",))
    before = files_of(root)
    launches = Launches(root)
    monkeypatch.setattr(settle.subprocess, "run", launches)
    assert settle.main([str(root), "--cap", "6"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "mixes sweeps" in line and "seeds 0-1" in line and "seeds 5-6" in line, line
    assert launches.calls == [] and files_of(root) == before

    one = write_sweep(tmp_path / "one", seeds=(0, 1, 2))
    for folder in spectral_runs(one)[2:]:  # seed 2 of spectral_q never started
        for path in sorted(folder.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        folder.rmdir()
    launches = Launches(one)
    monkeypatch.setattr(settle.subprocess, "run", launches)
    assert settle.main([str(one), "--cap", "3"]) == 0
    (call,) = launches.calls
    assert "reading=spectral_q" in call and "seed=2" in call


def test_two_open_claims_on_one_experiment_move_it_one_look(tmp_path):
    """Two open claims on one experiment skipped a look (``--batch 1`` launched 2 seeds): now each
    look adds what ``--batch`` says, once per experiment, however many rows are open on it."""
    other = Claim(
        "T-gain-2", "T", "the variant trains better too", "spectral", "final", "metric", ("digits",)
    )
    sweep = FakeSweep(0.0, 0.02, rng_seed=4)
    calls = []

    def launch(members, seeds):
        calls.append((members[0].attn, list(seeds)))
        sweep.launch(members, seeds)

    plan = settle.Plan(first=3, batch=1, cap=6)
    found = settle.settle(tmp_path, plan, sweep.read, launch, claims=[GAIN, other], say=lambda _: None)
    assert {v.claim.key for v in found} == {"T-gain", "T-gain-2"} and all(v.n == 6 for v in found)
    assert all(len(seeds) == 1 for _, seeds in calls)
    assert sorted(calls) == sorted((a, [s]) for a in ("spectral", "standard") for s in (3, 4, 5))
    looks = json.loads((tmp_path / "settle.json").read_text())["looks"]
    assert [look["rows"][0]["n"] for look in looks] == [3, 4, 5, 6]  # a look at every seed count


def test_mixed_sweeps_are_refused_by_the_loop_itself(tmp_path):
    """settle on a folder mixing two sweeps, called as a function: two experiments of a task with
    seeds 0-1 and 5-6 (their ``lr`` tells them apart) are refused before any launch or state."""
    runs = [
        run(a, s, 0.8, lr=lr)
        for a in ("standard", "spectral")
        for lr, seeds in ((1, (0, 1)), (2, (5, 6)))
        for s in seeds
    ]
    calls = []
    with pytest.raises(settle.SuiteError, match="mixes sweeps"):
        settle.settle(tmp_path, settle.Plan(4, 1, 6), lambda: runs, lambda m, s: calls.append(s))
    assert calls == [] and list(tmp_path.iterdir()) == []
