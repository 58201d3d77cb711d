"""The report on run folders that are damaged, planted or evaluated with other settings, and on
outputs it cannot write: one ``unreadable`` row, one left-out evaluation or one ``error:`` line
each, never a traceback, never a half-written file (hand-made folders: ``write_run``)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pickle
import re
import resource
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml
from test_report import write_run

from launch.analysis import exports, report
from launch.analysis.records import read_runs
from src.engine.record.identity import MOVED_TARGETS, Identity

ROOT = Path(__file__).resolve().parents[2]


def one_run(root: Path):
    (run,) = read_runs([root])
    return run


# -- finding 9: one bad folder is one row, and the report goes on -----------------------------------


def test_a_summary_that_is_a_list_and_a_config_that_is_not_yaml_are_two_rows_beside_a_good_run(
    tmp_path, capsys
):
    good = write_run(tmp_path, "standard", 0, [0.8] * 10)
    listed = write_run(tmp_path, "standard", 1, [0.8] * 10)
    (listed / "summary.json").write_text("[]")
    not_yaml = write_run(tmp_path, "standard", 2, [0.8] * 10)
    (not_yaml / "config.yaml").write_text(": : :\n")
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = {r["run_dir"]: r for r in rows if r["kind"] == "run"}
    assert [runs[str(f)]["status"] for f in (good, listed, not_yaml)] == [
        "completed",
        "unreadable",
        "unreadable",
    ]
    assert runs[str(listed)]["error"] == f"{listed / 'summary.json'} is not a JSON object (it holds [])"
    assert runs[str(not_yaml)]["error"].startswith(f"{not_yaml / 'config.yaml'} is not a YAML mapping (")
    (group,) = [r for r in rows if r["kind"] == "group"]
    assert (group["n"], group["mean"]) == (1, pytest.approx(0.8))  # the good run alone, counted
    text = (tmp_path / "out" / "report.md").read_text()
    assert "## Runs that did not complete (2)" in text
    lines = [line for line in text.splitlines() if "| unreadable |" in line]
    assert len(lines) == 2 and any("is not a YAML mapping" in line for line in lines)
    assert exports.read_exports_csv(tmp_path / "out" / "results.csv") == rows  # the error column too


def write_text(name: str, text: str):
    return lambda folder: (folder / name).write_text(text)


def edit_json(name: str, change):
    def edit(folder: Path) -> None:
        path = folder / name
        path.write_text(json.dumps(change(json.loads(path.read_text()))))

    return edit


def edit_rows(change):
    def edit(folder: Path) -> None:
        path = folder / "metrics.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps(r) + "\n" for r in change(rows)))

    return edit


DAMAGES = {  # what is done to a good record, and what its one line says
    "summary-a-number": (write_text("summary.json", "42"), "summary.json is not a JSON object (it holds 42)"),
    "summary-final-a-word": (
        edit_json("summary.json", lambda s: {**s, "final": {"val/acc": "high"}}),
        'final.val/acc is "high", not a number',
    ),
    "summary-status-a-list": (
        edit_json("summary.json", lambda s: {**s, "status": ["completed"]}),
        "its 'status' is [\"completed\"], not a string",
    ),
    "summary-steps-a-float": (
        edit_json("summary.json", lambda s: {**s, "steps": 1.5}),
        "its 'steps' is 1.5, not an integer",
    ),
    "config-a-list": (
        write_text("config.yaml", "- a\n- b\n"),
        "config.yaml is not a YAML mapping (it holds a list)",
    ),
    "config-a-number": (write_text("config.yaml", "42\n"), "config.yaml is not a YAML mapping ("),
    "config-seed-a-word": (
        lambda f: (f / "config.yaml").write_text(
            (f / "config.yaml").read_text().replace("seed: 0", "seed: abc")
        ),
        "its config's seed 'abc' is not an integer",
    ),
    "row-step-a-word": (
        edit_rows(lambda rows: [{**rows[0], "step": "ten"}, *rows[1:]]),
        "metrics.jsonl: row 1 (step 'ten') has a step that is not an integer",
    ),
    "row-value-a-word": (
        edit_rows(lambda rows: [*rows[:2], {**rows[2], "val/acc": "0.8x"}, *rows[3:]]),
        "metrics.jsonl: row 3 (step 300) has val/acc = '0.8x', not a number",
    ),
    "row-split-a-number": (
        edit_rows(lambda rows: [{**rows[0], "split": 3}, *rows[1:]]),
        "row 1 (step 100) has a split that is not a name",
    ),
    "identity-not-json": (write_text("identity.json", "{"), "identity.json is damaged (not JSON"),
    "identity-no-config": (
        write_text("identity.json", '{"hash": "x"}'),
        "identity.json is damaged (no 'config' object)",
    ),
    "identity-a-list": (write_text("identity.json", "[]"), "identity.json is damaged (no 'config' object)"),
}


@pytest.mark.parametrize("damage", DAMAGES, ids=list(DAMAGES))
def test_a_record_that_cannot_be_read_is_one_unreadable_row_with_its_reason(tmp_path, damage):
    change, reason = DAMAGES[damage]
    folder = write_run(tmp_path, "standard", 0, [0.8] * 10)
    change(folder)
    run = one_run(tmp_path)
    assert run.status == "unreadable" and reason in run.error and "\n" not in run.error
    assert (run.final, run.rows, run.evals, run.reported) == ({}, [], {}, None)  # no number is used
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0


# -- finding 9: every file written whole, all of them or none; an unwritable place is one line ----


def limit_file_size() -> None:
    """A full disk, as a process sees it: writes past 4 KB fail (Python ignores SIGXFSZ)."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_a_write_that_fails_is_one_line_and_leaves_the_earlier_report_byte_for_byte(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    for seed in (0, 1):
        write_run(runs, "standard", seed, [0.8 + seed / 100] * 10)
    assert report.main([str(runs), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert {"report.md", "results.csv", "results.json", "curves_imagenet_vit_base.png"} <= set(before)
    write_run(runs, "cond_init", 0, [0.9] * 10)  # the new report would differ in every file
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "launch.analysis.report", str(runs), "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        preexec_fn=limit_file_size,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert re.fullmatch(
        rf"error: cannot write {re.escape(str(out))}/\S+ \(File too large; \d+ MB free on its disk\)", line
    )
    assert result.stdout == ""
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # and no temporary file left


def test_a_folder_where_a_file_goes_is_one_line(tmp_path, capsys):
    write_run(tmp_path, "standard", 0, [0.8] * 10)
    (tmp_path / "out" / "results.json").mkdir(parents=True)
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: cannot write {tmp_path / 'out' / 'results.json'} (Is a directory; ")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["results.json"]  # nor any other file


@pytest.mark.parametrize("where", ["/proc/nope", "a-file"])
def test_an_out_folder_that_cannot_be_made_is_one_line(tmp_path, capsys, where):
    write_run(tmp_path, "standard", 0, [0.8] * 10)
    (tmp_path / "a-file").write_text("kept\n")
    out = Path(where) if where.startswith("/") else tmp_path / where
    assert report.main([str(tmp_path), "--out", str(out)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: cannot write {out} (") and "MB free" in line
    assert (tmp_path / "a-file").read_text() == "kept\n"


# -- finding 1: a run folder is data ----------------------------------------------------------------


def planted_payload(sentinel: Path) -> dict:
    """A config value Hydra's instantiate would turn into running ``touch sentinel``."""

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {sentinel}",))

    pickled = base64.b64encode(pickle.dumps(Payload())).decode()
    source = {"_target_": "base64.b64decode", "s": pickled}
    return {
        "_target_": "torch.load",
        "weights_only": False,
        "f": {"_target_": "io.BytesIO", "initial_bytes": source},
    }


@pytest.mark.parametrize("where", ["config.yaml", ".hydra/config.yaml"])
def test_a_planted_target_makes_its_run_unreadable_and_nothing_is_built(tmp_path, where):
    sentinel = tmp_path / "pwned"
    good = write_run(tmp_path, "standard", 0, [0.8] * 10)
    folder = write_run(tmp_path, "standard", 1, [0.9] * 10)
    config = json.loads(json.dumps(yaml.safe_load((folder / "config.yaml").read_text())))
    config["task"]["val_fraction"] = planted_payload(sentinel)
    (folder / where).parent.mkdir(exist_ok=True)
    (folder / where).write_text(json.dumps(config))  # JSON is YAML
    runs = {Path(r.name): r for r in read_runs([tmp_path])}
    assert runs[good].status == "completed"
    planted = runs[folder]
    assert planted.status == "unreadable" and planted.final == {}
    assert (planted.task, planted.attn, planted.seed) == ("imagenet", "standard", 1)  # listed as what it says
    assert "names _target_ 'torch.load' at task.val_fraction._target_" in planted.error
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "| 90.00 " not in text and "task.val_fraction._target_" in text  # its number unused, its line
    assert not sentinel.exists()


def test_an_interpolation_in_a_records_config_makes_its_run_unreadable_and_is_never_resolved(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("REPORT_SECRET", "s3cr3t-value")
    write_run(tmp_path, "standard", 0, [0.8] * 10, settings={"trainer.note": "${oc.env:REPORT_SECRET}"})
    run = one_run(tmp_path)
    assert run.status == "unreadable" and "holds an interpolation at trainer.note" in run.error
    assert report.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert not any("s3cr3t" in p.read_bytes().decode(errors="replace") for p in (tmp_path / "out").iterdir())


def test_nothing_that_reads_runs_builds_or_unpickles_anything():
    """The report's modules name none of the calls that build from a config or unpickle."""
    readers = [
        *(f"analysis/{name}" for name in ["records", "results", "report", "plots", "verdicts", "glue_table"]),
        "cluster/callbacks",
        "analysis/dashboard",
    ]
    forbidden = re.compile(
        r"\b(instantiate|get_class|get_method|get_object|_locate|torch\.load|pickle\.loads?)\b"
    )
    for name in readers:
        found = forbidden.findall((ROOT / "launch" / f"{name}.py").read_text())
        assert not found, f"launch/{name}.py calls {found}"


# -- finding 2: an evaluation counts only where it measured the record's own configuration ---------


def rewrite_eval(folder: Path, name: str = "eval-test.json", **changes) -> None:
    record = json.loads((folder / "eval-test.json").read_text())
    record.update(changes)
    (folder / name).write_text(json.dumps({k: v for k, v in record.items() if v is not None}))


def test_an_eval_of_another_configuration_or_of_none_named_is_left_out_with_the_command(tmp_path):
    folder = write_run(tmp_path, "standard", 0, [0.5] * 10, test=0.7)
    assert one_run(tmp_path).reported.value == 0.7  # of the record's identity: used
    rewrite_eval(folder, identity="0123456789abcdef")  # e.g. task.val_fraction=0.5 given to eval
    with pytest.warns(UserWarning, match=r"measured another configuration .*0123456789abcdef") as said:
        run = one_run(tmp_path)
    assert (run.reported.split, run.reported.value) == ("val", 0.5)
    assert f"python -m src.eval {folder} split=test" in str(said[0].message)
    rewrite_eval(folder, identity=None)  # written before evaluations named their identity
    with pytest.warns(UserWarning, match="does not name the configuration it measured"):
        assert one_run(tmp_path).reported.split == "val"


def test_a_side_eval_never_stands_for_its_split(tmp_path):
    folder = write_run(tmp_path, "standard", 0, [0.5] * 10, test=0.7)
    own = json.loads((folder / "eval-test.json").read_text())["identity"]
    rewrite_eval(folder, "eval-test.0123456789abcdef.json", identity="0123456789abcdef")
    rewrite_eval(folder, f"eval-test.{own}.json", metrics={"test/acc": 0.99})  # even naming the record's
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a side file is not an error either
        run = one_run(tmp_path)
    assert (run.reported.split, run.reported.value) == ("test", 0.7)
    (folder / "eval-test.json").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run = one_run(tmp_path)
    assert run.evals == {} and run.reported.split == "val"


def test_the_hash_an_eval_must_name_is_identity_json_s(tmp_path):
    folder = write_run(tmp_path, "standard", 0, [0.5] * 10, test=0.7)
    config = json.loads(json.dumps(yaml.safe_load((folder / "config.yaml").read_text())))
    meta = {"hash": "feedfacefeedface", "config": {**config, "note": "recorded"}}
    (folder / "identity.json").write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match="another configuration"):  # it names config.yaml's hash
        assert one_run(tmp_path).reported.split == "val"
    rewrite_eval(folder, identity="feedfacefeedface")
    assert one_run(tmp_path).reported.value == 0.7


def test_an_eval_of_a_record_whose_class_has_moved_since_is_the_records(tmp_path):
    """identity.json's hash was computed with the class's old path; an evaluation now computes
    the identity with the new one (:data:`MOVED_TARGETS`): both are the record's."""
    old, new = next(iter(MOVED_TARGETS.items()))
    folder = write_run(tmp_path, "standard", 0, [0.5] * 10, test=0.7)
    config = json.loads(json.dumps(yaml.safe_load((folder / "config.yaml").read_text())))
    config["sched"] = {"_target_": old}
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    meta = {"hash": hashlib.sha256(text.encode()).hexdigest()[:16], "config": config}
    (folder / "identity.json").write_text(json.dumps(meta))
    rewrite_eval(folder, identity=Identity({**config, "sched": {"_target_": new}}).hash)
    assert one_run(tmp_path).reported.value == 0.7
