"""Reading runs back: the run folders the suite writes, or the same numbers from W&B.

A run folder is a folder with the suite's ``config.yaml`` or Hydra's ``.hydra/config.yaml``.
Its status: ``completed`` (a summary says so), ``failed`` (a summary with the error line, after
training), ``failed to start`` (it failed, or died, before its first step: its error from
``failures.jsonl`` or the summary), ``incomplete`` (rows but no summary: killed, timed out or
still running), ``refused`` (refused for bad input before its first step, its error a
:data:`REFUSALS` class: the folder an older version left, which :func:`read_runs` passes over, as
the run never ran; the suite now removes what such a session wrote), ``unreadable`` (a record that
cannot be read: its one-line reason), or ``debug``
(made with a ``debug=`` preset, :func:`debug_preset`: a few steps to try the code, never an
experiment's run), so the report lists every run that did not finish instead of dropping it,
and one damaged folder never stops it. Every file is read within its bounds
(:mod:`src.engine.record.bounded`: a regular file of the folder, within its size; rows streamed),
and the numbers the report averages within their metric's range (:func:`check_ranges`).

A run folder is data: whatever it holds is read as values and checked for the shape the report
needs (:func:`read_run`), and nothing is built from its config. A config that names a
``_target_`` the suite's own configs do not (:func:`src.engine.record.safe_config.check_buildable`) makes
its run ``unreadable``, its numbers unused.

A run's test numbers are ``eval-<split>.json`` beside its record (``python -m src.eval <run>
split=test``), used only where the evaluation says it measured the record's own configuration (its
``identity`` is the record's hash, :func:`read_evals`): :attr:`Run.reported` is its test number
where it has one, its validation number otherwise, and says which.

Each run also carries its identity (:mod:`src.engine.record.identity`) without the seed: runs that
share it are seeds of one experiment; runs that differ in anything else (a variant's option, the
run length, the data) are different experiments, whatever their folders are called.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from src.engine.record.bounded import RefusedFile, limit_of, lines, open_file, read_bytes
from src.engine.record.files import RunRecord, read_metrics
from src.engine.record.identity import Identity, flatten
from src.engine.record.safe_config import as_data, check_buildable
from src.errors import SuiteError

from .record_shapes import (
    DamagedRecord,
    checked_metric,
    checked_rows,
    is_step,
    one_line,
    out_of_range,
    read_evals,
    read_summary,
)


@dataclass
class Run:
    """One run as the report sees it."""

    name: str
    task: str
    backbone: str
    attn: str
    seed: int
    status: str  # completed | failed | failed to start | incomplete | refused | unreadable | debug
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
    #: what trained it, from summary.json's sessions: {"host": …, "commit": …, "torch": …}, each the
    #: sessions' distinct values space-separated ("" where no session says)
    provenance: dict[str, str] = field(default_factory=dict)

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
    moved aside by ``trainer.resume=restart`` (``superseded/``) are not current runs, nor the copies
    of a record a W&B run holds among its files (``wandb/<run>/files/record/``)."""
    found = set()
    for root in map(Path, roots):
        here = {p.parent.parent for p in root.glob("**/.hydra/config.yaml")}
        here |= {p.parent for p in root.glob("**/config.yaml") if (p.parent / "metrics.jsonl").exists()}
        found |= {f for f in here if not {"superseded", "wandb"} & set(f.relative_to(root).parts)}
    return sorted(found)


def read_run(folder: Path) -> Run:
    """A run folder as a :class:`Run`, whatever state it was left in. A folder that cannot be read
    (a config that is not a YAML mapping or names a ``_target_`` the suite does not build, a damaged
    ``identity.json``, a summary or rows of the wrong shape, anything) is one ``unreadable`` run
    with its one-line reason and none of its numbers, so that one folder never stops a report."""
    run = Run(name=str(folder), task="?", backbone="?", attn="?", seed=0, status="incomplete")
    try:
        check_configs(folder)
        config, identity, recorded = run_config(folder, run)
        name_run(run, config, identity, folder)
        read_record(run, folder, recorded)
        check_usable(run)
        preset = debug_preset(folder)
    except Exception as error:  # noqa: BLE001  a run folder is data: whatever is wrong in it
        return unreadable(run, error)
    if preset is not None:
        run.status = "debug"
        run.error = f"a debug run (debug={preset}): a few steps to try the code, not an experiment's run"
    return run


#: The YAML files of a run folder the report reads (:func:`check_configs`).
CONFIGS = ("config.yaml", ".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml")


def check_configs(folder: Path) -> None:
    """Each of the run's :data:`CONFIGS` that exists is a regular file inside the folder and within
    its size (:func:`src.engine.record.bounded.open_file`), before a YAML reader opens it by name: a
    FIFO would hang it, ``/dev/zero`` fill the memory. A :class:`RefusedFile` otherwise."""
    for name in CONFIGS:
        path = folder / name
        if path.exists() or path.is_symlink():
            open_file(path, limit_of(path), within=folder).close()


def debug_preset(folder: Path) -> str | None:
    """The ``debug=`` preset the run was made with (``fdr``), from Hydra's record of the command:
    ``.hydra/hydra.yaml``'s ``hydra.runtime.choices.debug``, else a ``debug=`` item of
    ``.hydra/overrides.yaml``; None for a run of an experiment (or a record without ``.hydra/``).
    Both are read as plain YAML data (nothing resolved); one that cannot be read says nothing."""
    for name in ("hydra.yaml", "overrides.yaml"):
        path = folder / ".hydra" / name
        if not path.is_file():
            continue
        try:
            tree = yaml.safe_load(read_bytes(path, within=folder))
        except (ValueError, yaml.YAMLError):
            continue
        if name == "hydra.yaml" and isinstance(tree, dict):
            choices = ((tree.get("hydra") or {}).get("runtime") or {}).get("choices") or {}
            if isinstance(choices, dict) and choices.get("debug") not in (None, "null"):
                return str(choices["debug"])
        if name == "overrides.yaml" and isinstance(tree, list):
            found = [str(o).partition("=")[2] for o in tree if str(o).lstrip("+~").startswith("debug=")]
            if found and found[-1] not in ("", "null"):
                return found[-1]
    return None


def unreadable(run: Run, error: BaseException) -> Run:
    """``run`` as ``unreadable``: what it is (where its config told), the reason on one line, and no
    numbers, none of which the report may use."""
    own = isinstance(error, (SuiteError, DamagedRecord))  # their messages name the file already
    reason = one_line(str(error) if own else f"{type(error).__name__}: {error}")
    return Run(run.name, run.task, run.backbone, run.attn, run.seed, "unreadable", error=reason)


def name_run(run: Run, config: dict[str, Any], identity: Identity, folder: Path) -> None:
    """What ``run`` is, from its config's values as data (:func:`run_config`): task, backbone,
    variant, seed, and its identity without the seed (and the keys that follow it, :func:`seed_keys`)."""
    flat = flatten(config)
    run.task = str(flat.get("task.name"))
    run.backbone = str(flat.get("backbone.name"))
    run.attn = str(flat.get("attn.variant"))
    seed = config.get("seed", 0)
    try:
        run.seed = int(seed)
    except (TypeError, ValueError) as error:
        raise DamagedRecord(f"{folder}: its config's seed {seed!r} is not an integer") from error
    run.identity = identity.without("seed", *seed_keys(folder))
    attn = run.identity.config.get("attn")
    run.attn_options = dict(attn) if isinstance(attn, dict) else {}


def provenance(summary: dict[str, Any]) -> dict[str, str]:
    """The hosts, commits and torch builds of a summary's sessions (``{"host": "vm", "commit":
    "1cc804c…", "torch": "2.14.1+cpu"}``), each the distinct values in session order joined by
    spaces; a value that is not a plain word is left out (a summary is data, perhaps someone
    else's)."""
    sessions = summary.get("sessions")
    sessions = [s for s in sessions if isinstance(s, dict)] if isinstance(sessions, list) else []
    found: dict[str, list[str]] = {"host": [], "commit": [], "torch": []}
    for session in sessions:
        code = session.get("code") if isinstance(session.get("code"), dict) else {}
        for key, value in (
            ("host", session.get("host")),
            ("commit", code.get("git")),
            ("torch", session.get("torch")),
        ):
            if isinstance(value, str) and value and len(value) <= 80 and not any(c.isspace() for c in value):
                if value not in found[key]:
                    found[key].append(value)
    return {key: " ".join(values) for key, values in found.items()}


def read_record(run: Run, folder: Path, recorded: frozenset[str]) -> None:
    """The record's rows, summary and evaluations into ``run`` (each checked for the shape the
    report reads), and its status; ``recorded``: the identity hashes an evaluation may name."""
    run.rows = checked_rows(read_metrics(folder, bounded=True), folder / "metrics.jsonl")
    summary = read_summary(folder / "summary.json")
    if summary is not None:
        run.status = summary.get("status", "completed")
        run.metric, run.metric_mode = summary.get("metric"), summary.get("metric_mode")
        run.final = {k: v for k, v in (summary.get("final") or {}).items() if v is not None}
        run.error, run.steps_per_epoch = summary.get("error"), summary.get("steps_per_epoch")
        run.steps, run.wall_s = summary.get("steps"), summary.get("wall_s")
        run.best = {k: v for k, v in (summary.get("best") or {}).items() if v is not None}
        if isinstance(summary.get("attn_options"), dict):
            run.attn_options = summary["attn_options"]
        run.evals = read_evals(folder, summary, recorded)
        run.provenance = provenance(summary)
        if run.status == "failed" and not RunRecord(folder, enabled=False).has_trained():
            run.status = "refused" if is_refusal(run.error) else "failed to start"
    elif run.rows:
        last = max(r["step"] for r in run.rows)
        run.error = f"no summary.json: killed, timed out or still running (last logged step {last})"
    else:
        run.error = last_failure(folder) or (
            "no record: it died before writing anything (killed while starting?), or is starting now"
        )
        run.status = "refused" if is_refusal(run.error) else "failed to start"


#: The error classes of bad input found before a run's first step (:mod:`src.errors` and its
#: subclasses a session can meet there): a run they stopped never ran.
REFUSALS = ("ConfigError", "DataError", "NotPrepared", "UntrustedConfig")


def is_refusal(error: str | None) -> bool:
    """Whether the error line ``error`` (``DataError: missing data folder …``) is a :data:`REFUSALS`'."""
    return isinstance(error, str) and error.partition(":")[0].strip() in REFUSALS


def variant_options(attn: str, attn_options: dict[str, Any]) -> str:
    """The options of ``attn`` that differ from its defaults: ``mode=svd``, ``spectral.lam=1.0``
    for a composition's part, ``""`` when all are defaults (:func:`src.attention.config.changed_options`)."""
    from src.attention.config import changed_options

    return " ".join(f"{k}={v}" for k, v in changed_options(attn, attn_options).items())


def variant_label(run: Run) -> str:
    """``spectral mode=svd``: the variant's name and its options that are not defaults."""
    return " ".join(filter(None, [run.attn, variant_options(run.attn, run.attn_options)]))


def check_usable(run: Run) -> None:
    """Compute once what the report computes of ``run`` alone (its number, length, label, curve),
    so that whatever still fails on it fails here, for this run only; and check that the numbers it
    averages can be what they say (:func:`check_ranges`)."""
    _ = run.reported, run.epochs, run.higher_is_better, run.context, variant_label(run)
    if run.metric:
        run.series(run.metric)
    check_ranges(run)


def check_ranges(run: Run) -> None:
    """A :class:`DamagedRecord` where a number the report averages is outside what its metric can
    be (:func:`launch.analysis.record_shapes.out_of_range`: an accuracy of -5.0, or of 85 where the suite
    records a fraction): summary.json's ``final`` and ``best`` values (each metric whose range is
    known, and the main one) and the main metric's rows in metrics.jsonl."""
    folder = Path(run.name)
    for where in ("final", "best"):
        for key, value in getattr(run, where).items():
            if key == "step" or (key != run.metric and not checked_metric(key)):
                continue
            problem = out_of_range(key, value)
            if problem:
                raise DamagedRecord(f"{folder / 'summary.json'}: {where}.{key} {problem}")
    if run.metric:
        for number, row in enumerate(run.rows, start=1):
            value = row.get(run.metric)
            problem = None if value is None else out_of_range(run.metric, value)
            if problem:
                where = f"{folder / 'metrics.jsonl'}: row {number} (step {row['step']})"
                raise DamagedRecord(f"{where} has {run.metric} {problem}")


def run_config(folder: Path, run: Run | None = None) -> tuple[dict[str, Any], Identity, frozenset[str]]:
    """The run's config as data, its identity, and the hashes an evaluation of it may name
    (:func:`read_evals`).

    The config is the record's ``config.yaml`` (written resolved), else Hydra's
    ``.hydra/config.yaml`` (unresolved). Each of them that exists is read as data (:func:`load_config`)
    and checked (:func:`src.engine.record.safe_config.check_buildable`: only the ``_target_`` s the suite's
    own configs set, and no interpolation in a config written resolved) before anything else is read
    from it; ``run``, where given, is named from its plain values first (:func:`name_plainly`), so
    that a refused run is still listed as what it says it is. No resolver runs on it: its values are
    :func:`src.engine.record.safe_config.as_data` (node interpolations followed, ``${oc.env:…}`` and
    every other resolver call kept as text). The identity is ``identity.json``'s (its ``hash``), else
    the one the record's config gives (as :meth:`RunRecord.recorded_identity` computes it), else the
    one of Hydra's config's values as data."""
    own, hydra = folder / "config.yaml", folder / ".hydra" / "config.yaml"
    loaded = {path: load_config(path) for path in (own, hydra) if path.exists()}
    if not loaded:
        raise DamagedRecord(f"{folder} holds neither config.yaml nor .hydra/config.yaml")
    raw = OmegaConf.to_container(loaded[own] if own in loaded else loaded[hydra], resolve=False)
    if run is not None:
        name_plainly(run, raw)
    for path, config in loaded.items():
        check_buildable(OmegaConf.to_container(config, resolve=False), path, resolved=path == own)
    cfg = as_data(raw)
    recorded = recorded_identity(folder / "identity.json")
    if recorded is not None:
        return cfg, *recorded
    identity = Identity.of(cfg)
    return cfg, identity, frozenset({identity.hash})


def load_config(path: Path) -> DictConfig:
    """``path`` read as data, nothing in it resolved nor built: a YAML mapping, else a
    :class:`DamagedRecord`. Its bytes come through :func:`~src.engine.record.bounded.read_bytes`
    (a regular file, within the config cap), so the file checked is the file parsed."""
    try:
        cfg = OmegaConf.load(io.BytesIO(read_bytes(path)))
    except RefusedFile as refused:
        raise DamagedRecord(str(refused)) from refused
    except Exception as error:  # noqa: BLE001  YAML's errors, OmegaConf's, a folder by that name
        raise DamagedRecord(f"{path} is not a YAML mapping ({one_line(str(error), 160)})") from error
    if not isinstance(cfg, DictConfig):
        raise DamagedRecord(f"{path} is not a YAML mapping (it holds a list)")
    return cfg


def name_plainly(run: Run, tree: dict[str, Any]) -> None:
    """``run``'s task, backbone, variant and seed where its unresolved config gives them as plain
    values (an interpolation is not resolved: the config is not checked yet)."""
    flat = flatten(tree)
    for attr, key in (("task", "task.name"), ("backbone", "backbone.name"), ("attn", "attn.variant")):
        value = flat.get(key)
        if isinstance(value, (str, int, float)) and "${" not in str(value):
            setattr(run, attr, str(value))
    if is_step(tree.get("seed")):
        run.seed = tree["seed"]


def recorded_identity(path: Path) -> tuple[Identity, frozenset[str]] | None:
    """``(identity, hashes)`` from ``identity.json`` (None: the record has none): its ``hash``, and
    its config's hash as computed now, which differs only where a class named in it has moved since
    (:data:`src.engine.record.identity.MOVED_TARGETS`): both are the record's. A damaged one is a
    :class:`DamagedRecord`: without it no evaluation can be matched to the run."""
    if not path.exists() and not path.is_symlink():
        return None
    data = read_bytes(path, within=path.parent)
    try:
        meta = json.loads(data)
    except ValueError as error:
        raise DamagedRecord(f"{path} is damaged (not JSON: {error})") from error
    if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
        raise DamagedRecord(f"{path} is damaged (no 'config' object)")
    identity = Identity(meta["config"])
    recorded = meta.get("hash", identity.hash)
    if not isinstance(recorded, str):
        raise DamagedRecord(f"{path} is damaged (its 'hash' is not a string)")
    return identity, frozenset({recorded, identity.hash})


def seed_keys(folder: Path) -> list[str]:
    """The dotted keys Hydra's config sets to ``${seed}`` (``task.data_seed`` of ``modadd``): they
    change with the seed, so a run's seeds share its identity only without them too."""
    path = folder / ".hydra" / "config.yaml"
    if not path.exists():
        return []
    raw = OmegaConf.to_container(OmegaConf.load(io.BytesIO(read_bytes(path, within=folder))), resolve=False)
    return [key for key, value in flatten(raw).items() if value == "${seed}"]


def last_failure(folder: Path) -> str | None:
    """The error line of the last session that failed in ``folder`` (``failures.jsonl``, streamed
    within its limit; a line that is not an entry is passed over)."""
    path = folder / "failures.jsonl"
    if not path.exists() and not path.is_symlink():
        return None
    found = None
    for _, line in lines(path, limit_of(path), within=folder):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("error") is not None:
            found = str(entry["error"])
    return found


def read_runs(roots: Iterable[Path]) -> list[Run]:
    """Every run folder under ``roots`` (:func:`find_run_dirs`), each read on its own (:func:`read_run`),
    but those refused before their first step (``refused``: the run never ran)."""
    return [run for run in map(read_run, find_run_dirs(roots)) if run.status != "refused"]


def options(runs: Iterable[Run]) -> dict[str, dict[str, Any]]:
    """For each experiment (:attr:`Run.experiment`), the settings that tell it apart from the
    other experiments of the same task and backbone: ``{"attn.lam": 10.0, "trainer.max_steps": 100}``
    (the variant's name is the table's own column and is left out). Unreadable runs have no
    settings to compare."""
    by_experiment = {r.experiment: r for r in runs if r.status != "unreadable"}
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
