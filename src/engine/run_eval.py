"""The work behind ``python -m src.eval`` (:mod:`src.eval`, whose docstring is the account):
reading a run folder's or a checkpoint file's configuration back with its checks, building the
task and model as training built them, and evaluating a split into ``eval-<split>.json``. Kept
apart from the command so that ``python -m src.eval --help`` answers without importing torch."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from src.engine.experiment import processes
from src.engine.generated import reading
from src.engine.loop import evaluation
from src.engine.loop.numerics import run_autocast
from src.engine.loop.prepared import prepared
from src.engine.record import checkpoint
from src.engine.record.bounded import RefusedFile, read_bytes
from src.engine.record.checkpoint import CheckpointError
from src.engine.record.files import RunRecord, plain_json, write_atomic
from src.engine.record.identity import DATA, Identity
from src.engine.record.safe_config import check_buildable
from src.engine.schema import check_values
from src.engine.task import Task
from src.errors import ConfigError, SuiteError

log = logging.getLogger(__name__)

CONFIG = "config.yaml"  # the record's resolved config


@dataclass
class Recorded:
    """What an evaluation builds from: the record's config with the record's data folder and the
    command line's overrides, the hash of that configuration's identity, the record's identity
    hash, and the overrides as given."""

    cfg: DictConfig
    identity: str
    record_identity: str
    overrides: list[str]
    owners: set[str]  # the identity hashes the record's checkpoints may carry
    data: dict[str, str] = field(default_factory=dict)  # the content hashes of the generated data it read


def load_config(run_dir: Path, overrides: list[str]) -> Recorded:
    """The run's recorded config, checked before anything is built from it: it names only what the
    suite's configs build (:func:`check_buildable`: a run folder is data), and it is the
    configuration the record's ``identity.json`` describes, whose absolute data folder it reads
    (not ``./data`` from wherever the command runs). Then ``overrides`` (dotted keys the config
    has), checked the same way."""
    if not run_dir.is_dir():
        raise ConfigError(f"no run folder {run_dir}")
    path = run_dir / CONFIG
    if not path.is_file():
        raise ConfigError(
            f"{run_dir} holds no run record (no {CONFIG}): give the folder of one run, "
            "e.g. outputs/runs/<task>/<backbone>/<variant>/seed=<n>"
        )
    tree = read_tree(path)
    tree.pop("hydra", None)
    check_buildable(tree, path)
    recorded, meta = RunRecord(run_dir, enabled=False).recorded_identity()
    cfg = OmegaConf.create(tree)
    owners = {recorded.hash} if recorded is not None else set()  # what the record's checkpoints may carry
    if meta:
        if meta.get("hash") not in (recorded.hash, raw_hash(meta.get("config"))):
            raise ConfigError(
                f"{run_dir / 'identity.json'} is damaged: its hash is not its config's; refused"
            )
        owners.add(meta["hash"])  # as written, before a class in it moved (identity.MOVED_TARGETS)
        data_dir = (recorded.config.get("paths") or {}).get("data_dir")
        if data_dir is not None:
            cfg.paths.data_dir = data_dir  # absolute, as the run read it
        differs = recorded.without(DATA).differences(Identity.of(cfg))  # the data is checked as it is read
        if differs:
            listed = "; ".join(f"{k}: {_show(a)} → {_show(b)}" for k, (a, b) in list(differs.items())[:6])
            raise ConfigError(
                f"{path} is not the configuration its record ran (identity.json → config.yaml: {listed}): "
                "the file was edited or replaced; refused. To evaluate other settings, pass them as key=value"
            )
    else:
        log.warning(
            "%s has no identity.json (a record older than identities): its data folder is read as given",
            run_dir,
        )
    record_identity = recorded.hash if recorded is not None else Identity.of(cfg).hash
    data = (recorded.config.get(DATA) or {}) if recorded is not None else {}
    checked = with_overrides(cfg, record_identity, overrides, f"the run's config ({path})", data)
    checked.owners = owners or {record_identity}
    return checked


def raw_hash(config: Any) -> str:
    """The hash :class:`Identity` gave ``config`` when it was written, before any class it names
    moved (the identity compares the moved class's new path)."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_tree(path: Path) -> dict[str, Any]:
    """A YAML file as a plain mapping, unresolved; one :class:`ConfigError` when it is not one. Its
    bytes come through :func:`~src.engine.record.bounded.read_bytes` (a regular file, within the
    config cap): a received folder's FIFO or giant file is refused, not read."""
    try:
        tree = OmegaConf.to_container(OmegaConf.load(io.BytesIO(read_bytes(path))), resolve=False)
    except RefusedFile as refused:
        raise ConfigError(str(refused)) from refused
    except Exception as error:  # noqa: BLE001  YAML's and OmegaConf's parse errors
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"{path} is not a readable config ({first})") from error
    if not isinstance(tree, dict):
        raise ConfigError(f"{path} is not a config (a mapping of keys), it holds a {type(tree).__name__}")
    return tree


def _show(value: Any) -> str:
    return json.dumps(value, default=str)


def refuse_other_loops(cfg: DictConfig) -> None:
    """A task that trains outside the shared loop (detection, in mmengine) is not evaluated here."""
    task_class = get_class(cfg.task._target_)
    if task_class.fit is not Task.fit:
        raise ConfigError(
            f"task {cfg.task.name} trains and validates in its own loop (mmengine for detection): its "
            "val2017 COCO mAP is in the run's metrics.jsonl and summary.json, and COCO's test-dev labels "
            "are not public; python -m src.eval evaluates runs of the shared loop"
        )


def evaluate_run(
    run_dir: Path, split: str, which: str, overrides: list[str], logger: str = ""
) -> tuple[dict[str, Any], Path]:
    """Evaluate the run's ``which`` checkpoint on ``split``; the result and where it was written.
    ``logger`` (``wandb``, ``none``, or empty for the record's own) says where else it goes."""
    recorded = load_config(run_dir, overrides)
    cfg = with_logger(recorded.cfg, logger)
    task = checked_task(cfg, split)
    opened = evaluation.open_checkpoint(
        run_dir,
        which,
        note=print_note,
        best_step=recorded_best_step(run_dir),
        identity=recorded.owners,
    )
    result, written = measure(
        recorded,
        opened,
        split,
        lambda r: evaluation.result_path(
            run_dir, split, None if r.identity == r.record_identity else r.identity
        ),
        task,
    )
    own = result["identity"] == result["record_identity"]  # the data read included (measure)
    if written is not None and cfg.logger.name == "wandb":
        if own:
            send_to_wandb(run_dir, cfg, result)
        else:
            print_note("not sent to W&B: it measures another configuration than the run's")
    return result, written


def checked_task(cfg: DictConfig, split: str) -> Task:
    """The run's task, built once its loop is the shared one and ``split`` is one of its splits."""
    refuse_other_loops(cfg)
    task = instantiate(cfg.task)
    task.check_split(split)
    return task


def measure(
    recorded: Recorded,
    opened: evaluation.Opened,
    split: str,
    where: Callable[[Recorded], Path],
    task: Task | None = None,
) -> tuple[dict[str, Any], Path | None]:
    """Evaluate ``opened`` on ``split`` with the model built from ``recorded``; the result, written
    by the main process (None elsewhere) to ``where(recorded)`` once the split is read: the generated
    data it read (regenerated first where damaged, :mod:`src.engine.generated`) joins the identity,
    so a result on other data than the run's never goes to the run's own file."""
    cfg = recorded.cfg
    task = task if task is not None else checked_task(cfg, split)
    with processes(cfg) as dist:
        data_dir = Path(cfg.paths.data_dir)
        with reading(data_dir) as read:  # the split (LM's vocabulary), then the model as training built it
            _, (dataset,), model = prepared(cfg, task, split=split)  # no prepare_model: the weights load next
        measured = with_data(recorded, read)
        path = where(measured)
        if measured.identity != measured.record_identity:
            print_note(
                f"{changed_by(recorded, read)} change what is measured: the result goes to {path.name}, "
                "beside the run's own, and the report does not use it"
            )
        recorded = measured
        autocast = run_autocast(dist.device, cfg.trainer.precision)
        batches = cfg.trainer.eval_batches
        result = evaluation.evaluate_checkpoint(
            task, model, dataset, split, opened, dist, autocast, batches, cfg.trainer.num_workers
        )
        result.update(
            identity=recorded.identity,
            record_identity=recorded.record_identity,
            overrides=recorded.overrides,
            data_dir=str(data_dir),
        )
        written = None
        if dist.main:
            written = path
            write_atomic(path, json.dumps(plain_json(result)[0], indent=2) + "\n")
    return result, written


def with_data(recorded: Recorded, read: dict[str, str]) -> Recorded:
    """``recorded`` with the content hashes of the generated data an evaluation read: the identity it
    measures is the record's only where every artefact the run read is read again as it was (one the
    run did not read, a test split's cache made since, leaves it as it is). A record made before runs
    recorded their data (no ``data``) cannot be checked: a note says so, and its identity stays."""
    if not read:
        return recorded
    if not recorded.data:
        print_note(
            "the run's record predates data checksums (identity.json has no data): the generated data "
            "read now cannot be checked against the data the run trained on"
        )
        return recorded
    data = {**recorded.data, **{name: digest for name, digest in read.items() if name in recorded.data}}
    return replace(recorded, identity=Identity.of(recorded.cfg, data).hash, data=data)


def changed_by(recorded: Recorded, read: dict[str, str]) -> str:
    """What makes an evaluation another identity than its record's (``recorded``, before the data was
    read): the overrides, and the generated data whose content is not the run's (named)."""
    other = [name for name, digest in read.items() if digest != recorded.data.get(name, digest)]
    said = [" ".join(recorded.overrides)] if recorded.overrides else []
    if other:
        said.append(f"data other than the run's ({', '.join(other)})")
    return " and ".join(said) or "the data read"


def with_logger(cfg: DictConfig, logger: str) -> DictConfig:
    """``cfg`` with ``conf/logger/<logger>.yaml`` as its logger (resolved against ``cfg``); as it
    is when ``logger`` is empty."""
    if not logger:
        return cfg
    node = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "logger" / f"{logger}.yaml")
    cfg = OmegaConf.merge(cfg, {"logger": None})
    cfg.logger = node
    OmegaConf.resolve(cfg)
    return cfg


def send_to_wandb(run_dir: Path, cfg: DictConfig, result: dict[str, Any]) -> None:
    """Add ``result`` to the summary of the W&B run ``run_dir`` logged to (``identity.json``'s
    ``wandb_id``), resumed with ``resume="allow"``: evaluation belongs to the run it measures, and
    its summary keys (``eval/test/acc``) sit beside the training's in the runs table. Its
    ``job_type`` stays the training's ``train`` (resuming with ``eval`` would relabel the training
    run); its config is left as it was. Offline, the resumed run is one more offline folder of the
    same id, which ``wandb sync`` merges into the run. Best effort, as in training."""
    from src.engine.record.tracking import add_to_summary, eval_summary

    if not add_to_summary(run_dir, cfg, eval_summary(result)):
        print_note(f"not sent to W&B: {run_dir / 'identity.json'} holds no W&B run id")


def print_note(line: str) -> None:
    print(f"note: {line}", file=sys.stderr)


def recorded_best_step(run_dir: Path) -> int | None:
    """The step of the best validation ``summary.json`` records (None without one)."""
    try:
        return ((RunRecord(run_dir, enabled=False).summary() or {}).get("best") or {}).get("step")
    except (OSError, ValueError, AttributeError, SuiteError):  # damaged, or not a regular file
        return None


# -- a checkpoint file ----------------------------------------------------------------------------


def home_run(file: Path) -> Path | None:
    """The run folder a checkpoint file sits in (``<run>/checkpoints/<file>``), or None."""
    folder = file.resolve().parent
    return folder.parent if folder.name == "checkpoints" and (folder.parent / CONFIG).is_file() else None


def read_file(file: Path) -> dict[str, Any]:
    """A checkpoint file of the suite (a training state or a ``best.pt``), read by torch's safe
    loader; one :class:`CheckpointError` when it is missing, unreadable or another program's."""
    if not file.is_file():
        raise CheckpointError(f"no checkpoint file {file}: give a .pt file or a run folder")
    try:
        state = checkpoint.load(file)
    except Exception as error:  # noqa: BLE001  truncated, corrupt, refused by the safe loader
        raise CheckpointError(f"cannot read {file} ({checkpoint.unreadable_reason(error)})") from error
    training = isinstance(state, dict) and isinstance(state.get("loop"), dict)
    if not (isinstance(state, dict) and "model" in state and (training or "step" in state)):
        found = ", ".join(map(repr, list(state)[:4])) if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{file} is not a checkpoint of this suite (it holds {found or 'nothing'})")
    problem = checkpoint.field_problem(state)  # a step "abc", a record that is a string
    if problem:
        raise CheckpointError(f"{file} is not a checkpoint of this suite ({problem})")
    return state


def opened_file(file: Path, state: dict[str, Any], owners: set[str]) -> evaluation.Opened:
    """``state`` (read from ``file``) opened for evaluation, provided it carries one of ``owners``."""
    evaluation.check_owner(state, file, owners)
    if "loop" in state:
        return evaluation.Opened("last", file, state, state["loop"]["step"])
    return evaluation.Opened("best", file, state, state["step"])


def carried(file: Path, state: dict[str, Any], overrides: list[str]) -> Recorded:
    """The config a checkpoint carries, checked as a record's is before anything is built from
    it: only the suite's ``_target_`` keys, and the configuration its identity names; then the
    ``overrides``. Refused, saying to pass ``run=``, where it carries none."""
    meta = state.get("record") or {}
    tree = meta.get("config")
    if not isinstance(tree, dict):
        raise ConfigError(
            f"{file} carries no config (a checkpoint written before checkpoints carried theirs, or not "
            "in a run folder): name the run folder it came from, run=<run_dir>"
        )
    check_buildable(tree, f"the config carried by {file}")
    cfg = OmegaConf.create(tree)
    data = meta.get(DATA) if isinstance(meta.get(DATA), dict) else {}
    if Identity.of(cfg, data).hash != meta.get("identity"):
        raise ConfigError(
            f"the config carried by {file} is not the configuration its identity ({meta.get('identity')}) "
            "names: the file was edited; refused. Name the run folder it came from, run=<run_dir>"
        )
    return with_overrides(cfg, meta["identity"], overrides, f"the config carried by {file}", data)


def with_overrides(
    cfg: DictConfig,
    record_identity: str,
    overrides: list[str],
    where: str,
    data: dict[str, str] | None = None,
) -> Recorded:
    """:class:`Recorded` from a checked config and the command line's ``overrides`` (checked too)."""
    for item in overrides:
        key = item.partition("=")[0]
        if OmegaConf.select(cfg, key, default=KeyError) is KeyError:
            raise ConfigError(f"{key} is not a key of {where}; check its spelling")
        cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([item]))
    check_buildable(OmegaConf.to_container(cfg, resolve=False), "the command line's overrides")
    cfg.paths.data_dir = os.path.abspath(str(cfg.paths.data_dir))
    check_values(cfg)
    data = dict(data or {})
    return Recorded(
        cfg, Identity.of(cfg, data).hash, record_identity, list(overrides), {record_identity}, data
    )


def file_result_path(file: Path, run_dir: Path | None, split: str, recorded: Recorded) -> Path:
    """Where a file's evaluation goes: the run's own ``eval-<split>.json`` for its ``best.pt`` or
    ``last.pt``; ``eval-<split>.<stem>.json`` in the run for another of its files; beside the file,
    ``<stem>.eval-<split>.json``, for one outside a run folder. ``.<identity>`` before ``.json``
    where an override changed what is measured."""
    other = "" if recorded.identity == recorded.record_identity else f".{recorded.identity}"
    if run_dir is None:
        return file.with_name(f"{file.stem}.eval-{split}{other}.json")
    if file.name in ("best.pt", "last.pt"):
        return evaluation.result_path(run_dir, split, recorded.identity if other else None)
    return run_dir / f"eval-{split}.{file.stem}{other}.json"


def evaluate_file(
    file: Path, split: str, run: Path | None, overrides: list[str]
) -> tuple[dict[str, Any], Path | None]:
    """Evaluate exactly the checkpoint ``file`` on ``split`` (see the module docstring)."""
    home = home_run(file) if file.is_file() else None
    state = read_file(file)
    run_dir = run if run is not None else home
    recorded = load_config(run_dir, overrides) if run_dir is not None else carried(file, state, overrides)
    opened = opened_file(file, state, recorded.owners)
    in_run = home is not None and run_dir is not None and run_dir.resolve() == home
    return measure(
        recorded, opened, split, lambda r: file_result_path(file, run_dir if in_run else None, split, r)
    )
