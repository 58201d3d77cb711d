"""W&B: the same numbers as the record, offline without a key, and never a reason to stop."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest
import wandb
from conftest import compose
from wandb_file import offline_records, offline_run

from src.engine import train
from src.engine.record.files import read_metrics
from src.engine.record.tracking import WandbLogger, main_metric, run_config, run_name, run_tags
from src.errors import ConfigError

SHORT = [
    "logger=wandb",
    "trainer.max_steps=4",
    "trainer.val_every=2",
    "trainer.log_every=2",
    "trainer.monitor_every=0",
]


def run(tmp_path, *extra):
    return train(compose([*SHORT, *extra], tmp_path), tmp_path / "run")


def test_offline_mode_writes_a_local_wandb_run_with_the_records_files(tmp_path, monkeypatch):
    """The offline run holds the record's final config.yaml, metrics.jsonl and summary.json (copies,
    not links: a run synced later, from elsewhere, still has them), and the project WANDB_PROJECT names."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "from-the-environment")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    summary = run(tmp_path)
    (offline,) = (tmp_path / "run" / "wandb").glob("offline-run-*")
    assert list(offline.glob("run-*.wandb")) and summary["steps"] == 4
    for name in ("config.yaml", "metrics.jsonl", "summary.json"):
        sent = offline / "files" / "record" / name
        assert not sent.is_symlink() and sent.read_bytes() == (tmp_path / "run" / name).read_bytes(), name
    assert json.loads((offline / "files" / "record" / "summary.json").read_text())["status"] == "completed"
    (wandb_file,) = offline.glob("run-*.wandb")
    assert b"from-the-environment" in wandb_file.read_bytes()


@pytest.mark.parametrize(
    "env, overrides, expected",
    [
        ({}, [], ("conditioned-attention", None)),
        ({"WANDB_PROJECT": "mine", "WANDB_ENTITY": "lab"}, [], ("mine", "lab")),
        (
            {"WANDB_PROJECT": "mine", "WANDB_ENTITY": "lab"},
            ["logger.project=cfg", "logger.entity=me"],
            ("cfg", "me"),
        ),
    ],
)
def test_wandb_project_and_entity_from_the_environment_unless_the_config_sets_them(
    env, overrides, expected, tmp_path, monkeypatch
):
    seen = {}
    monkeypatch.setattr(wandb, "init", lambda **kwargs: seen.update(kwargs) or FakeRun())
    for key in ("WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    WandbLogger(compose(["logger=wandb", *overrides], tmp_path).logger, tmp_path, {})
    assert (seen["project"], seen["entity"]) == expected


class FakeRun:
    def __init__(self, fail_log: bool = False):
        self.logged, self.finished, self.fail_log, self.summary = [], False, fail_log, {}
        self.defined, self.saved = [], []
        self.dir = tempfile.mkdtemp(prefix="fake-wandb-")

    def save(self, path, base_path=None, policy="live"):
        self.saved.append((os.path.relpath(path, base_path), policy))

    def define_metric(self, name, summary=None):
        self.defined.append((name, summary))

    def log(self, metrics, step):
        if self.fail_log:
            raise ConnectionError("wandb.ai unreachable")
        self.logged.append((step, metrics))

    def finish(self):
        self.finished = True


def test_config_names_the_run_and_numbers_match_the_record(tmp_path, monkeypatch):
    seen = {}
    fake = FakeRun()

    def fake_init(**kwargs):
        seen.update(kwargs)
        return fake

    monkeypatch.setattr(wandb, "init", fake_init)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))
    run(tmp_path, "attn=spectral", "seed=3")
    assert seen["mode"] == "offline"  # no key configured
    assert seen["group"] == "digits/vit_digits" and seen["name"] == "spectral-seed3"
    assert seen["tags"] == ["spectral", "digits", "vit_digits"]
    assert seen["config"]["attn"]["variant"] == "spectral"
    grouped = {k: seen["config"][k] for k in ("variant", "variant_options", "variant_label", "seed")}
    assert grouped == dict(variant="spectral", variant_options="defaults", variant_label="spectral", seed=3)
    rows = read_metrics(tmp_path / "run")
    record = [(r["step"], {k: v for k, v in r.items() if k not in ("step", "split")}) for r in rows]
    assert fake.logged == record and fake.finished and fake.defined == [("val/acc", "max")]
    assert fake.saved == [
        (f"record/{n}", "end") for n in ("config.yaml", "metrics.jsonl", "summary.json", "eval-test.json")
    ]


@pytest.mark.parametrize("failure", ["init", "log"])
def test_a_wandb_failure_never_stops_training(tmp_path, monkeypatch, failure):
    def broken_init(**kwargs):
        raise ConnectionError("wandb.ai unreachable")

    monkeypatch.setattr(
        wandb, "init", broken_init if failure == "init" else lambda **kw: FakeRun(fail_log=True)
    )
    with pytest.warns(UserWarning, match="training goes on"):
        summary = run(tmp_path)
    assert summary["steps"] == 4 and (tmp_path / "run" / "summary.json").exists()


def test_finish_runs_when_training_fails(tmp_path, monkeypatch):
    fake = FakeRun()
    monkeypatch.setattr(wandb, "init", lambda **kw: fake)
    with pytest.raises(Exception, match="nonfinite|NaN|nan"):
        run(tmp_path, "optim.lr=1e30", "sched.warmup_steps=0", "trainer.clip_grad=null")
    assert fake.finished


# -- a W&B run belongs to one record -------------------------------------------------------------


def recording_init(monkeypatch) -> list[dict]:
    """Replace wandb.init by one that records each init's arguments and its run's logs."""
    runs: list[dict] = []

    def init(**kwargs):
        fake = FakeRun()
        runs.append({"id": kwargs["id"], "resume": kwargs["resume"], "run": fake})
        return fake

    monkeypatch.setattr(wandb, "init", init)
    return runs


def test_a_new_record_gets_a_new_wandb_run(tmp_path, monkeypatch):
    runs = recording_init(monkeypatch)
    run(tmp_path)
    shutil.rmtree(tmp_path / "run")  # deleted, then run again: a new record
    run(tmp_path)
    run(tmp_path, "trainer.resume=restart")  # the record moved aside: a new record again
    ids = [r["id"] for r in runs]
    assert len(ids) == 3 and len(set(ids)) == 3
    saved = json.loads((tmp_path / "run" / "identity.json").read_text())["wandb_id"]
    assert saved == ids[-1]


def test_a_resumed_record_continues_its_wandb_run_without_sending_a_step_twice(tmp_path, monkeypatch):
    from src.engine.loop.trainer import Trainer

    runs = recording_init(monkeypatch)
    original = Trainer._optimizer_step

    def killed_at_step_4(self, batches):  # after step 3 was logged; the checkpoint is step 2's
        if self.state.step + 1 == 4:
            raise KeyboardInterrupt
        return original(self, batches)

    args = ["trainer.log_every=1", "trainer.checkpoint_every=2", "trainer.max_steps=6"]
    monkeypatch.setattr(Trainer, "_optimizer_step", killed_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, *args)
    monkeypatch.setattr(Trainer, "_optimizer_step", original)
    run(tmp_path, *args)  # resumes from step 2: step 3 is trained and recorded again

    first, second = runs
    assert first["id"] == second["id"] and second["resume"] == "allow"
    sent = [(step, metrics) for r in runs for step, metrics in r["run"].logged]
    record = [
        (r["step"], {k: v for k, v in r.items() if k not in ("step", "split")})
        for r in read_metrics(tmp_path / "run")
    ]
    strip = lambda rows: [(s, {k: v for k, v in m.items() if k != "throughput"}) for s, m in rows]  # noqa: E731
    assert strip(sent) == strip(record)  # each row once: step 3, trained again, was not sent again
    assert [s for s, _ in runs[1]["run"].logged][0] == 4


# -- names, tags and summary a dashboard can group by -------------------------------------------


def test_run_names_tell_option_sets_apart_and_tags_have_no_equals(tmp_path):
    svd = compose(["logger=wandb", "attn=spectral", "attn.mode=svd"], tmp_path)
    lam = compose(["logger=wandb", "attn=spectral", "attn.lam=1", "seed=2"], tmp_path)
    parts = ["attn=compose", "attn.parts=[cond_init,spectral]", "+attn.spectral.lam=2"]
    both = compose(["logger=wandb", *parts], tmp_path)
    assert (run_name(svd), run_name(lam)) == ("spectral(mode=svd)-seed0", "spectral(lam=1)-seed2")
    assert run_name(both) == "cond_init+spectral(spectral.lam=2)-seed0"
    assert run_config(svd, {})["variant_options"] == "mode=svd"
    assert run_config(lam, {})["variant"] == "spectral"
    assert run_tags(both) == ["cond_init", "spectral", "cond_init+spectral", "digits", "vit_digits"]
    named = compose(["logger=wandb", "logger.run_name=mine", "logger.tags=['a=b']"], tmp_path)
    assert run_name(named) == "mine"
    with pytest.raises(ConfigError, match="'a=b' has '='"):
        run_tags(named)


def test_the_main_metric_and_its_direction_come_from_the_task(tmp_path):
    assert main_metric(compose([], tmp_path).task) == ("val/acc", "max")
    assert main_metric(compose(["task=lm_char"], tmp_path).task) == ("val/loss", "min")


def test_the_offline_summary_holds_the_best_not_the_last(tmp_path, monkeypatch):
    from src.engine.loop.trainer import Trainer

    accs = iter([0.25, 0.75, 0.5])  # validations at steps 2, 4, 6: the best is not the last
    monkeypatch.setattr(Trainer, "evaluate", lambda self, model, prefix="val": {f"{prefix}/acc": next(accs)})
    monkeypatch.setenv("WANDB_MODE", "offline")
    run(tmp_path, "trainer.max_steps=6", "trainer.val_at_start=false")
    (wandb_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    history, summary = offline_run(wandb_file)
    assert "val/acc" in history and summary["val/acc"] == {"max": 0.75}  # define_metric(summary="max")
    assert summary["final/val/acc"] == 0.5 and summary["best"] == {"val/acc": 0.75, "step": 4}
    assert (summary["steps"], summary["status"]) == (6, "completed") and summary["wall_s"] > 0


# -- job type, group, checkpoints as artifacts, evaluation on the run it measures ----------------


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """One offline run of 4 steps with ``logger.log_checkpoints`` (validation and checkpoint at
    steps 2 and 4), then ``python -m src.eval`` on it: the run folder and its W&B run id."""
    from src.eval import main as eval_main

    tmp = tmp_path_factory.mktemp("logged")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        accs = iter([0.5, 0.25])  # the best is step 2's: best.pt is written once, last.pt twice
        from src.engine.loop.trainer import Trainer

        mp.setattr(Trainer, "evaluate", lambda self, model, prefix="val": {f"{prefix}/acc": next(accs)})
        run(tmp, "logger.log_checkpoints=true", "trainer.checkpoint_every=2", "trainer.val_at_start=false")
        mp.undo()
        mp.setenv("WANDB_MODE", "offline")
        eval_main([str(tmp / "run"), "split=val", "trainer.device=cpu"])
    wandb_id = json.loads((tmp / "run" / "identity.json").read_text())["wandb_id"]
    return tmp / "run", wandb_id


def offline_files(run_dir, wandb_id):
    """The offline W&B files of run ``wandb_id`` under ``run_dir``, oldest first."""
    return sorted((run_dir / "wandb").glob(f"offline-run-*-{wandb_id}/run-{wandb_id}.wandb"))


def test_a_training_run_is_job_type_train_in_its_task_group_and_in_no_sweep(logged):
    run_dir, wandb_id = logged
    trained = offline_records(offline_files(run_dir, wandb_id)[0])["run"]
    assert (trained["id"], trained["job_type"], trained["group"]) == (wandb_id, "train", "digits/vit_digits")
    assert trained["config"]["sweep_name"] is None  # a single run; the config's default 'sweep' is a folder


def test_a_sweep_job_keeps_its_sweep_name(tmp_path):
    cfg = compose(["logger=wandb", "sweep_name=paper_lm"], tmp_path)
    assert run_config(cfg, {"sweep_name": "paper_lm"}, sweep=True)["sweep_name"] == "paper_lm"
    assert run_config(cfg, {"sweep_name": "paper_lm"}, sweep=False)["sweep_name"] is None


def test_checkpoints_are_logged_as_model_artifacts_with_step_metric_and_identity(logged):
    run_dir, wandb_id = logged
    artifacts = offline_records(offline_files(run_dir, wandb_id)[0])["artifacts"]
    identity = json.loads((run_dir / "identity.json").read_text())["hash"]
    assert {(a["name"], a["type"]) for a in artifacts} == {(f"model-{wandb_id}", "model")}
    logged_as = [(a["metadata"]["file"], a["metadata"]["step"], set(a["aliases"])) for a in artifacts]
    assert logged_as == [  # in this order: W&B gives "latest" to each, the last keeps it
        ("best.pt", 2, {"best", "best-step-2", "latest"}),
        ("last.pt", 2, {"latest", "step-2"}),
        ("last.pt", 4, {"latest", "step-4"}),
    ]
    best = next(a["metadata"] for a in artifacts if a["metadata"]["file"] == "best.pt")
    assert (best["metric"], best["metric_mode"], best["value"]) == ("val/acc", "max", 0.5)
    assert best["identity"] == identity
    last = [a["metadata"] for a in artifacts if a["metadata"]["step"] == 4][0]
    assert (last["best"], last["best_step"]) == (0.5, 2)


def test_without_log_checkpoints_no_artifact_is_logged(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run(tmp_path, "trainer.checkpoint_every=2")
    (wandb_file,) = (tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb")
    assert offline_records(wandb_file)["artifacts"] == []


def test_eval_adds_its_results_to_the_summary_of_the_run_it_evaluates(logged):
    run_dir, wandb_id = logged
    trained, evaluated = offline_files(run_dir, wandb_id)  # the eval resumed the same run id
    result = json.loads((run_dir / "eval-val.json").read_text())
    _, summary = offline_run(evaluated)
    run_record = offline_records(evaluated)["run"]
    assert run_record["id"] == wandb_id and run_record["job_type"] == ""  # the run stays "train"
    assert summary["eval/val/acc"] == result["metrics"]["val/acc"]
    assert (summary["eval/val/checkpoint"], summary["eval/val/checkpoint_step"]) == ("best", 2)


def test_eval_with_logger_none_sends_nothing(logged, monkeypatch):
    from src.eval import main as eval_main

    run_dir, wandb_id = logged
    before = offline_files(run_dir, wandb_id)
    monkeypatch.setenv("WANDB_MODE", "offline")
    eval_main([str(run_dir), "split=val", "trainer.device=cpu", "logger=none"])
    assert offline_files(run_dir, wandb_id) == before


def test_under_a_wandb_sweep_agent_the_run_takes_the_agents_id_and_is_in_a_sweep(monkeypatch):
    from src.engine.record.tracking import in_sweep, new_run_id

    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    assert new_run_id() != new_run_id() and not in_sweep()
    monkeypatch.setenv("WANDB_SWEEP_ID", "abc123")
    monkeypatch.setenv("WANDB_RUN_ID", "agentchosen1")
    assert new_run_id() == "agentchosen1" and in_sweep()


def test_eval_with_logger_wandb_sends_a_record_trained_without_wandb_to_its_id(tmp_path, monkeypatch):
    from src.eval import main as eval_main

    train(compose([*SHORT[1:], "logger=none"], tmp_path), tmp_path / "run")
    assert not (tmp_path / "run" / "wandb").exists()
    monkeypatch.setenv("WANDB_MODE", "offline")
    eval_main([str(tmp_path / "run"), "split=val", "trainer.device=cpu", "logger=wandb"])
    wandb_id = json.loads((tmp_path / "run" / "identity.json").read_text())["wandb_id"]
    (evaluated,) = offline_files(tmp_path / "run", wandb_id)
    result = json.loads((tmp_path / "run" / "eval-val.json").read_text())
    assert offline_run(evaluated)[1]["eval/val/acc"] == result["metrics"]["val/acc"]


def test_eval_refuses_an_unknown_logger_in_one_line(logged, capsys):
    from src.eval import main as eval_main

    status = eval_main([str(logged[0]), "logger=tensorboard"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: logger=tensorboard") and err.count("\n") == 1
