"""A run longer than its partition allows is submitted in attempts that fit (``resources.max_time_min``,
or the partition's MaxTime read by ``sinfo``), with enough timeout requeues for the whole run: checked on
the submitit parameters the composed config gives hydra/launcher=slurm, and against a stand-in
``sinfo`` on PATH."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

import pytest
from conftest import QUIET
from omegaconf import OmegaConf

from launch.cluster.slurm_launcher import OneLineSubmissionErrors, attempts_line
from src import slurm_time
from src.configs import compose
from src.errors import ConfigError
from src.slurm_time import MIN_TIMEOUTS, SLACK, attempt_min, parse_slurm_time


def slurm_config(overrides: list[str], tmp_path: Path):
    """The config a sweep on SLURM composes, its hydra node included."""
    return compose(["hydra/launcher=slurm", *overrides, *QUIET], tmp_path, hydra=True)


def submitted(cfg) -> dict:
    """The launcher's options as submitit gets them (``timeout_min``, ``max_num_timeout``, …)."""
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=True)


def trains_enough(time_min: int, launcher: dict) -> bool:
    """Whether ``max_num_timeout + 1`` attempts, each stopping ``signal_delay_s`` early, train
    :data:`SLACK` times the run's estimate."""
    usable_min = launcher["timeout_min"] - launcher["signal_delay_s"] / 60
    return (launcher["max_num_timeout"] + 1) * usable_min >= SLACK * time_min


@pytest.fixture
def sinfo(tmp_path, monkeypatch):
    """``sinfo(text, status=0)``: a stand-in ``sinfo`` first on PATH that prints ``text`` (the
    ``%P %l`` table) for every partition, or only the ``-p`` ones asked for."""
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    slurm_time._partition_limit_min.cache_clear()

    def make(text: str, status: int = 0) -> Path:
        script = folder / "sinfo"
        script.write_text(
            "#!/bin/sh\n"
            f"TABLE='{text}'\n"
            'want=""; while [ $# -gt 0 ]; do [ "$1" = -p ] && want="$2"; shift; done\n'
            'if [ -z "$want" ]; then printf "%s\\n" "$TABLE"; else\n'
            '  printf "%s\\n" "$TABLE" | while read -r p l; do\n'
            '    case ",$want," in *",${p%\\*},"*) echo "$p $l";; esac; done; fi\n'
            f"exit {status}\n"
        )
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
        slurm_time._partition_limit_min.cache_clear()
        return script

    yield make
    slurm_time._partition_limit_min.cache_clear()


@pytest.mark.parametrize(
    "text, minutes",
    [
        ("infinite", None),
        ("UNLIMITED", None),
        ("30", 30),
        ("30:30", 31),
        ("1:00:00", 60),
        ("2-00:00:00", 2880),
        ("1-12", 2160),
        ("1-12:30", 2190),
        ("7-00:00:01", 10081),
    ],
)
def test_slurm_times_read_as_minutes(text, minutes):
    assert parse_slurm_time(text) == minutes


def test_a_time_that_is_not_slurms_is_refused():
    with pytest.raises(ValueError, match="not a SLURM time"):
        parse_slurm_time("two days")


@pytest.mark.parametrize("cap", [1440, 2880, 720, 120])
def test_imagenet_over_a_capped_partition_asks_the_cap_and_enough_requeues(cap, tmp_path):
    """DeiT's 72 hours on a partition of ``cap`` minutes: each attempt asks the cap; the timeouts
    allowed carry the whole run twice over, and never fewer than submitit's earlier 20."""
    cfg = slurm_config(["task=imagenet", f"resources.max_time_min={cap}"], tmp_path)
    launcher = submitted(cfg)
    assert cfg.resources.time_min == 4320 and launcher["timeout_min"] == cap
    assert trains_enough(4320, launcher) and launcher["max_num_timeout"] >= MIN_TIMEOUTS
    needed = math.ceil(4320 / (cap - 2))  # attempts of cap minutes, each signalled 120 s early
    assert launcher["max_num_timeout"] == max(MIN_TIMEOUTS, SLACK * needed)
    line = attempts_line(cfg)
    assert f"each SLURM attempt asks {cap} of the run's 4320 min" in line and f"{needed} attempts" in line


def test_no_cap_or_a_cap_above_the_run_asks_the_runs_time(tmp_path):
    for cap in ("null", "10000"):
        cfg = slurm_config(["task=imagenet", f"resources.max_time_min={cap}"], tmp_path)
        launcher = submitted(cfg)
        assert launcher["timeout_min"] == 4320 and launcher["max_num_timeout"] == MIN_TIMEOUTS
        assert attempts_line(cfg) is None  # nothing split: no line


def test_auto_reads_the_default_partitions_maxtime(sinfo, tmp_path):
    sinfo("short 2:00:00\ngpu* 2-00:00:00\nlong infinite")
    cfg = slurm_config(["task=imagenet"], tmp_path)  # max_time_min: auto is the default
    assert cfg.resources.max_time_min == "auto"
    launcher = submitted(cfg)
    assert launcher["timeout_min"] == 2880 and trains_enough(4320, launcher)
    assert "(the partition's MaxTime)" in attempts_line(cfg)
    digits = submitted(slurm_config(["task=digits"], tmp_path))
    assert digits["timeout_min"] == 30  # shorter than the cap: its own


@pytest.mark.parametrize(
    "partition, minutes", [("short", 120), ("long", 4320), ("short,gpu", 120), ("gpu,long", 2880)]
)
def test_auto_reads_the_named_partitions_and_takes_the_shortest(partition, minutes, sinfo, tmp_path):
    sinfo("short 2:00:00\ngpu* 2-00:00:00\nlong infinite")
    cfg = slurm_config(["task=imagenet", f"hydra.launcher.partition='{partition}'"], tmp_path)
    launcher = submitted(cfg)
    assert launcher["timeout_min"] == minutes and trains_enough(4320, launcher)


def test_auto_without_an_answer_from_slurm_leaves_the_time_uncapped(sinfo, tmp_path):
    sinfo("", status=1)  # a controller that does not answer: the launcher check says so (callbacks.py)
    assert submitted(slurm_config(["task=imagenet"], tmp_path))["timeout_min"] == 4320
    sinfo("gpu* infinite")
    assert submitted(slurm_config(["task=imagenet"], tmp_path))["timeout_min"] == 4320


@pytest.mark.parametrize(
    "overrides, said",
    [
        (["resources.max_time_min=soon"], "resources.max_time_min='soon': minutes, auto"),
        (["resources.max_time_min=0"], "at least 1 minute"),
        (["resources.max_time_min=2", "hydra.launcher.signal_delay_s=120"], "signal_delay_s=120 signals it"),
    ],
)
def test_a_cap_that_cannot_work_is_one_line_before_anything_is_submitted(overrides, said, tmp_path, capsys):
    cfg = slurm_config(["task=imagenet", *overrides], tmp_path)
    with pytest.raises(SystemExit) as ended:
        OneLineSubmissionErrors().on_multirun_start(cfg)
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and said in err


def test_the_line_that_says_how_a_run_is_split(tmp_path, capsys):
    cfg = slurm_config(["task=imagenet", "resources.max_time_min=1440"], tmp_path)
    OneLineSubmissionErrors().on_multirun_start(cfg)
    err = capsys.readouterr().err
    assert err == (
        "each SLURM attempt asks 1440 of the run's 4320 min (resources.max_time_min=1440): 4 attempts, "
        "each requeued after its timeout from last.pt (up to 20 timeouts)\n"
    )


def test_attempt_min_takes_the_cap_as_a_number_or_text():
    assert attempt_min(4320, 1440) == attempt_min(4320, "1440") == 1440
    assert attempt_min(60, None) == attempt_min(60, 1440) == 60
    with pytest.raises(ConfigError):
        attempt_min(60, "1.5h")


def test_the_cap_stays_out_of_the_run_folders_name(tmp_path):
    """Like the rest of ``resources``, the cap is the cluster's, not the run's: a rerun on another
    partition resumes the same folder."""
    excluded = slurm_config([], tmp_path).hydra.job.config.override_dirname.exclude_keys
    assert "resources.max_time_min" in excluded
