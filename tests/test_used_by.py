"""The README's used-by commands, run as written: each either works or stops in one line naming
the one thing that makes it work (exit status 2, no traceback).

The commands are read from the first ``bash`` block under "## Used by" in README.md, so a command
edited there is the command tested here. Each runs as a new user types it: in a fresh shell (no
environment inherited from the tests: ``env -i``, the system's PATH) that has run the README's
activation line (``source .venv/bin/activate``, from its first block) at the repository's root, in
a temporary folder (its ``data/`` and ``outputs/`` are there, so nothing is written into the
repository); nothing is added to the command line, and ``python`` is whatever that shell finds.
Each command needs something this machine may lack (COCO and the detection extra, a SLURM cluster,
a W&B login), and what it says then is what is asserted.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT


def used_by_commands() -> list[str]:
    """The command lines of the first ```bash block under "## Used by" in README.md."""
    section = (ROOT / "README.md").read_text().split("\n## Used by\n", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S).group(1)
    return [line.split("  #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def activation() -> str:
    """The README's line that makes ``python`` the suite's: the ``source`` line of its first block."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S).group(1)
    return next(line.split("  #", 1)[0].strip() for line in block.splitlines() if line.startswith("source "))


def run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``command`` as written, in ``cwd``, in a fresh shell that has run the README's activation
    line at the repository's root (``env``: variables the shell has besides HOME and PATH)."""
    script = activation().split()[1]
    if not (ROOT / script).is_file():
        pytest.skip(f"{script} is not here (the suite was installed another way than `make install`)")
    home = cwd / "home"
    home.mkdir(exist_ok=True)
    fresh = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **env}
    line = f"cd {shlex.quote(str(ROOT))} && {activation()} && cd {shlex.quote(str(cwd))} && {command}"
    return subprocess.run(
        ["env", "-i", *(f"{k}={v}" for k, v in fresh.items()), "bash", "--noprofile", "--norc", "-c", line],
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_line(done: subprocess.CompletedProcess) -> str:
    """The refusal's single stderr line, after checking exit status 2 and no traceback."""
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    return lines[0]


def slurm_answers() -> bool:
    """Whether a SLURM controller answers here (then the command would submit 90 real jobs)."""
    if not shutil.which("sinfo"):
        return False
    return subprocess.run(["sinfo"], capture_output=True, timeout=30).returncode == 0


def test_the_readme_lists_the_five_used_by_commands():
    commands = used_by_commands()
    assert [c for c in commands if "task=coco" in c] == ["python -m src.run task=coco attn=precond"]
    assert any("src.run -m" in c and "hydra/launcher=slurm" in c for c in commands)
    assert any("launch.analysis.dashboard" in c for c in commands)
    assert any(c.startswith("python -m launch.ask ") for c in commands)
    assert [c for c in commands if "task=imagefolder" in c] == [
        "python -m src.run task=imagefolder task.data_dir=my_photos"
    ]
    assert len(commands) == 5, f"a used-by command without a test here: {commands}"
    assert all(c.startswith("python -m ") for c in commands)  # the activated shell's python
    assert activation() == "source .venv/bin/activate"  # make install's venv (Makefile: VENV)


def command(part: str) -> str:
    return next(c for c in used_by_commands() if part in c)


def test_imagefolder_names_the_folder_it_wants_and_trains_on_one(tmp_path):
    """Without ``my_photos/``: one line naming ``my_photos/train`` and the layout. The command itself
    is trained in tests/tasks/test_image_folder.py (on a folder of real-size JPEGs)."""
    line = one_line(run(command("task=imagefolder"), tmp_path, {}))
    assert f"missing folder {tmp_path.resolve() / 'my_photos' / 'train'}" in line
    assert "my_photos/train/<class>/<image>" in line
    assert not (tmp_path / "outputs").exists()


def test_coco_names_the_detection_extra_or_the_coco_files_it_wants(tmp_path):
    line = one_line(run(command("task=coco"), tmp_path, {}))
    if importlib.util.find_spec("mmdet") is None:
        assert "make detection" in line
    else:  # the extra is installed: the data is what is missing, named file by file
        for wanted in ("instances_train2017.json", "instances_val2017.json", "train2017", "val2017"):
            assert wanted in line
        assert "data_dir" in line or "DATA_DIR" in line


def test_the_slurm_multirun_names_the_cluster_it_needs(tmp_path):
    if slurm_answers():
        pytest.skip("a SLURM controller answers here: the command would submit the LRA table's jobs")
    line = one_line(run(command("src.run -m"), tmp_path, {}))
    assert "hydra/launcher=slurm" in line and ("sinfo" in line or "sbatch" in line)
    assert not list(tmp_path.rglob("summary.json")), "a refused sweep recorded runs"


def test_the_question_names_the_cluster_its_seeds_need(tmp_path):
    """launch.ask composes the question, then its first seeds' multirun names the missing cluster:
    that one line is the command's, nothing trained."""
    if slurm_answers():
        pytest.skip("a SLURM controller answers here: the command would submit its seeds")
    line = one_line(run(command("launch.ask"), tmp_path, {}))
    assert "hydra/launcher=slurm" in line and ("sinfo" in line or "sbatch" in line)
    assert not list(tmp_path.rglob("summary.json")), "a refused question recorded runs"


def test_the_dashboard_names_the_wandb_login_it_needs(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "NETRC": str(home / ".netrc"), "WANDB_CONFIG_DIR": str(home)}
    line = one_line(run(command("launch.analysis.dashboard"), tmp_path, env))
    assert "wandb login" in line and "--dry-run" in line
