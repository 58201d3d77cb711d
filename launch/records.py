"""Reading runs back: the run folders the suite writes, or the same numbers from W&B.

A run folder is a folder with the suite's ``config.yaml`` or Hydra's ``.hydra/config.yaml``.
Its status: ``completed`` (a summary says so), ``failed`` (a summary with the error line, after
training), ``failed to start`` (it failed, or died, before its first step: its error from
``failures.jsonl`` or the summary), ``incomplete`` (rows but no summary: killed, timed out or
still running), or ``unreadable`` (a damaged record, named), so the report lists every run that
did not finish instead of dropping it. A run's test numbers are ``eval-<split>.json`` beside its
record (``python -m src.eval <run> split=test``): :attr:`Run.reported` is its test number where
it has one, its validation number otherwise, and says which.

Each run also carries its identity (:mod:`src.engine.identity`) without the seed: runs that
share it are seeds of one experiment; runs that differ in anything else (a variant's option, the
run length, the data) are different experiments, whatever their folders are called.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from src.engine.identity import Identity, flatten
from src.engine.record import RecordError, RunRecord, read_metrics


@dataclass
class Run:
    """One run as the report sees it."""

    name: str
    task: str
    backbone: str
    attn: str
    seed: int
    status: str  # completed | failed | failed to start | incomplete | unreadable
    metric: str | None = None
    metric_mode: str | None = None  # max | min, from summary.json (None: unknown)
    final: dict[str, float] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl
    error: str | None = None
    steps_per_epoch: int | None = None
    identity: Identity = field(default_factory=lambda: Identity({}))  # without the seed
    steps: int | None = None  # steps trained (summary.json)
    wall_s: float | None = None
    best: dict[str, float] = field(default_factory=dict)  # best validation values, and their "step"
    attn_options: dict[str, Any] = field(default_factory=dict)  # summary.json's, else the config's
    evals: dict[str, dict[str, Any]] = field(default_factory=dict)  # split -> eval-<split>.json

    @property
    def epochs(self) -> float | None:
        return self.steps / self.steps_per_epoch if self.steps and self.steps_per_epoch else None

    @property
    def reported(self) -> Reported | None:
        """The main metric as the report uses it: the test number where ``eval-test.json`` has it
        (the papers report test numbers), else the final validation number; None: neither."""
        test = self.evals.get("test", {})
        value = (test.get("metrics") or {}).get(test.get("metric"))
        if value is not None:
            where = f"{test.get('checkpoint', '?')} checkpoint, step {test.get('checkpoint_step', '?')}"
            return Reported(float(value), "test", test["metric"], where)
        if self.metric in self.final:
            return Reported(self.final[self.metric], "val", self.metric, "final")
        return None

    @property
    def key(self) -> tuple[str, str, str]:
        return self.task, self.backbone, self.attn

    @property
    def experiment(self) -> str:
        """The hash of the run's identity without its seed: what its seeds share."""
        return self.identity.hash

    @property
    def context(self) -> str:
        """The hash of its identity without the variant either: the setting its baseline shares."""
        return self.identity.without("attn").hash

    @property
    def higher_is_better(self) -> bool:
        if self.metric_mode in ("max", "min"):
            return self.metric_mode == "max"
        words = ("loss", "ppl", "perplexity", "error")  # a summary from before metric_mode
        return not any(word in (self.metric or "") for word in words)

    def series(self, key: str, split: str = "val") -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one logged quantity (steps where it was not finite left out)."""
        points = [
            (r["step"], r[key]) for r in self.rows if r.get("split") == split and r.get(key) is not None
        ]
        return [s for s, _ in points], [float(v) for _, v in points]


@dataclass(frozen=True)
class Reported:
    """One run's main number: its value, the split it is from, the key it was logged as
    (``test/acc``), and the checkpoint it was measured on (``final`` for validation)."""

    value: float
    split: str
    key: str
    checkpoint: str


def find_run_dirs(roots: Iterable[Path]) -> list[Path]:
    """Every run folder under ``roots`` (a root may itself be one): a folder with Hydra's
    ``.hydra/config.yaml``, or with the suite's ``config.yaml`` beside its metrics; folders
    moved aside by ``trainer.resume=restart`` (``superseded/``) are not current runs."""
    found = set()
    for root in map(Path, roots):
        here = {p.parent.parent for p in root.glob("**/.hydra/config.yaml")}
        here |= {p.parent for p in root.glob("**/config.yaml") if (p.parent / "metrics.jsonl").exists()}
        found |= {f for f in here if "superseded" not in f.relative_to(root).parts}
    return sorted(found)


def read_run(folder: Path) -> Run:
    """A run folder as a :class:`Run` (whatever state it was left in)."""
    config, identity = run_config(folder)
    run = Run(
        name=str(folder),
        task=str(OmegaConf.select(config, "task.name")),
        backbone=str(OmegaConf.select(config, "backbone.name")),
        attn=str(OmegaConf.select(config, "attn.variant")),
        seed=int(OmegaConf.select(config, "seed", default=0)),
        status="incomplete",
        identity=identity.without("seed", *seed_keys(folder)),
    )
    run.attn_options = dict(run.identity.config.get("attn") or {})
    try:
        run.rows = read_metrics(folder)
        path = folder / "summary.json"
        summary = json.loads(path.read_text()) if path.exists() else None
    except (RecordError, ValueError) as error:
        run.status, run.error = "unreadable", f"{type(error).__name__}: {error}"
        return run
    if summary is not None:
        run.status = summary.get("status", "completed")
        run.metric, run.metric_mode = summary.get("metric"), summary.get("metric_mode")
        run.final = {k: v for k, v in (summary.get("final") or {}).items() if v is not None}
        run.error, run.steps_per_epoch = summary.get("error"), summary.get("steps_per_epoch")
        run.steps, run.wall_s = summary.get("steps"), summary.get("wall_s")
        run.best = {k: v for k, v in (summary.get("best") or {}).items() if v is not None}
        if isinstance(summary.get("attn_options"), dict):
            run.attn_options = summary["attn_options"]
        run.evals = read_evals(folder, summary)
        if run.status == "failed" and not RunRecord(folder, enabled=False).has_trained():
            run.status = "failed to start"
    elif run.rows:
        last = max(r["step"] for r in run.rows)
        run.error = f"no summary.json: killed, timed out or still running (last logged step {last})"
    else:
        run.status = "failed to start"
        run.error = last_failure(folder) or (
            "no record: it died before writing anything (killed while starting?), or is starting now"
        )
    return run


def run_config(folder: Path) -> tuple[Any, Identity]:
    """The run's config and its identity: the record's (:meth:`RunRecord.recorded_identity`),
    else one computed from Hydra's unresolved config, resolving what it can."""
    own = folder / "config.yaml"
    cfg = OmegaConf.load(own if own.exists() else folder / ".hydra" / "config.yaml")
    try:
        identity, _ = RunRecord(folder, enabled=False).recorded_identity()
    except RecordError:  # a damaged identity.json: the config still tells
        identity = None
    if identity is not None:
        return cfg, identity
    try:
        return cfg, Identity.of(OmegaConf.to_container(cfg, resolve=True))
    except Exception:  # noqa: BLE001  Hydra's ${hydra:…} or ${oc.env:…} cannot resolve here
        return cfg, Identity.of(OmegaConf.to_container(cfg, resolve=False))


def seed_keys(folder: Path) -> list[str]:
    """The dotted keys Hydra's config sets to ``${seed}`` (``task.data_seed`` of ``modadd``): they
    change with the seed, so a run's seeds share its identity only without them too."""
    path = folder / ".hydra" / "config.yaml"
    if not path.exists():
        return []
    raw = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return [key for key, value in flatten(raw).items() if value == "${seed}"]


def read_evals(folder: Path, summary: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """``{split: record}`` of the folder's ``eval-<split>.json`` files; a damaged one, or one of a
    checkpoint the record no longer names (:func:`stale_eval`), is left out with a warning."""
    evals = {}
    for path in sorted(folder.glob("eval-*.json")):
        try:
            record = json.loads(path.read_text())
            if not isinstance(record.get("metrics"), dict) or record.get("metric") not in record["metrics"]:
                raise ValueError("no 'metrics' holding its 'metric'")
            stale_eval(record, summary or {})
        except (ValueError, AttributeError) as error:
            warnings.warn(
                f"{path} is left out ({error}); its run is reported on validation: rerun "
                f"`python -m src.eval {folder} split={path.stem.removeprefix('eval-')}`",
                stacklevel=2,
            )
            continue
        evals[record.get("split") or path.stem.removeprefix("eval-")] = record
    return evals


def stale_eval(record: dict[str, Any], summary: dict[str, Any]) -> None:
    """A ``ValueError`` when the evaluated checkpoint's step is not the one ``summary`` names for it
    (``best``: the best validation's step; ``last``: the steps trained): the run went on since."""
    which, step = record.get("checkpoint"), record.get("checkpoint_step")
    expected = {"best": (summary.get("best") or {}).get("step"), "last": summary.get("steps")}.get(which)
    if expected is not None and step != expected:
        raise ValueError(f"it measured the {which} checkpoint at step {step}, the record's at {expected}")


def last_failure(folder: Path) -> str | None:
    """The error line of the last session that failed in ``folder`` (``failures.jsonl``)."""
    path = folder / "failures.jsonl"
    if not path.exists():
        return None
    for line in reversed(path.read_text(errors="replace").splitlines()):
        try:
            return json.loads(line).get("error")
        except ValueError:
            continue
    return None


def read_runs(roots: Iterable[Path]) -> list[Run]:
    return [read_run(folder) for folder in find_run_dirs(roots)]


def options(runs: Iterable[Run]) -> dict[str, dict[str, Any]]:
    """For each experiment (:attr:`Run.experiment`), the settings that tell it apart from the
    other experiments of the same task and backbone: ``{"attn.lam": 10.0, "trainer.max_steps": 100}``
    (the variant's name is the table's own column and is left out)."""
    by_experiment = {r.experiment: r for r in runs}
    flat = {e: flatten(r.identity.config) for e, r in by_experiment.items()}
    out = {}
    for experiment, run in by_experiment.items():
        peers = [
            flat[e]
            for e, other in by_experiment.items()
            if (other.task, other.backbone) == (run.task, run.backbone)
        ]
        keys = {k for f in peers for k in f}
        differing = sorted(k for k in keys if len({json.dumps(f.get(k), default=str) for f in peers}) > 1)
        named = ("attn.variant", "attn.parts", "attn._target_")  # said by the variant's own column
        out[experiment] = {k: flat[experiment].get(k) for k in differing if k not in named}
    return out


def read_wandb(path: str, api: Any = None) -> list[Run]:
    """The runs of a W&B project ``ENTITY/PROJECT``, as :class:`Run` s (needs network and a key)."""
    if api is None:
        import wandb

        api = wandb.Api()
    runs = []
    for r in api.runs(path):
        cfg = r.config
        final = {k.removeprefix("final/"): v for k, v in r.summary.items() if k.startswith("final/")}
        rows = []
        for row in r.scan_history():
            step = row.get("_step")
            split = (
                "monitor"
                if any(k.startswith("kappa/") for k in row)
                else ("val" if any(k.startswith("val") for k in row) else "train")
            )
            rows.append(
                {"step": step, "split": split, **{k: v for k, v in row.items() if not k.startswith("_")}}
            )
        state = {"finished": "completed", "failed": "failed", "crashed": "failed"}.get(r.state, "incomplete")
        runs.append(
            Run(
                name=f"wandb:{path}/{r.id}",
                task=cfg["task"]["name"],
                backbone=cfg["backbone"]["name"],
                attn=cfg["attn"]["variant"],
                seed=int(cfg.get("seed", 0)),
                status=state if final or state != "completed" else "incomplete",
                metric=cfg["task"].get("metric"),
                metric_mode=r.summary.get("metric_mode"),
                final=final,
                rows=rows,
                error=None if state == "completed" else f"W&B state {r.state}",
                identity=Identity.of(dict(cfg)).without("seed"),
                attn_options=dict(cfg["attn"]),
            )
        )
    return runs
