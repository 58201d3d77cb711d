"""OmegaConf resolvers the configs use: ``${cpus_at_most:4}``, ``${at_least:1,…}``, ``${run_folder:…}``,
``${out_of_name:}``, ``${pretrained_by:…}``, ``${attn_parts:…}``, ``${slurm_attempt_min:…}``,
``${slurm_timeouts:…}``, ``${image_folder:…}`` and ``${patch_grid_size:…}`` (``task=imagefolder``),
``${corpus_label:…}`` (a text task on your text); and the one list of keys that stay out of a
run's identity and of its folder's name (:data:`NO_BEARING`, :data:`CHANGES_BITS`).

Importing this module registers them. ``src/run.py`` imports it (so do the SLURM jobs, which
unpickle ``src.run.main``), and so does ``src/engine/schema.py``, which every composition of the
config imports, tests included.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from src import image_folder, labels

CONF = Path(__file__).resolve().parents[1] / "conf"

#: Keys that do not bear on what a run computes: out of its identity
#: (:mod:`src.engine.record.identity`, which says why for each) and out of its folder's name
#: (:func:`out_of_name`), so that turning one on (``logger.log_checkpoints=true``,
#: ``trainer.progress=none``) resumes the run instead of forking it. A group or node (``logger``)
#: stands for every key under it.
NO_BEARING = (
    "logger",
    "paths.output_dir",
    "sweep_name",
    "trainer.progress",
    "trainer.resume",
    "trainer.checkpoint_every",
    "trainer.checkpoints",
    "trainer.num_workers",
    "trainer.nonfinite",
    "trainer.collapse_entropy",
    "trainer.nonfinite_limit_consecutive",
    "trainer.nonfinite_limit_total",
    "trainer.test_after",
    "trainer.val_at_start",
)
#: Keys that change the bits, not the meaning, of the result (float reduction order, kernels, the
#: job's size): out of the identity and the name alike, so that a requeue elsewhere resumes.
CHANGES_BITS = ("trainer.threads", "trainer.device", "trainer.compile", "trainer.flush_denormal", "resources")
#: Out of the folder's name only: already in its path (``<task>/<backbone>/<variant>/seed=<s>``), or
#: in the identity but not the name (``paths.data_dir``: the same folder name on another machine),
#: or Hydra's own logging.
NAME_ONLY = (
    "task",
    "task.data_dir",  # task=imagefolder's folder: named in the path already (imagefolder-<its name>)
    "backbone",
    "backbone.name",  # backbone=timm's model: the path's backbone part
    "attn",
    "attn.parts",
    "seed",
    "paths.data_dir",
    "hydra.verbose",
)

#: Longest run-folder name kept as it is; file systems refuse names over 255 bytes.
MAX_FOLDER_BYTES = 200
HEAD_BYTES, TAIL_BYTES = 60, 120


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which SLURM and taskset narrow)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity masks
        return os.cpu_count() or 1


def cpus_at_most(limit: int) -> int:
    """DataLoader workers: ``limit``, but at most one less than the usable CPUs.

    The main process trains on a CPU of its own, so workers get the rest: 1 on a 2-core
    machine, 0 (load in the main process) on one core. More workers than cores only thrash,
    and DataLoader warns about them."""
    return max(0, min(int(limit), usable_cpus() - 1))


def at_least(floor: int, value: int | None) -> int:
    """``value``, but no less than ``floor`` (``null`` counts as ``floor``): SLURM's
    ``tasks_per_node`` from ``gpus_per_node``, which is 0 on a CPU-only cluster."""
    return int(floor) if value is None else max(int(floor), int(value))


def run_folder(seed: int | str, overrides: str = "") -> str:
    """The last part of a run's folder: ``seed=0``, or ``seed=0,<overrides>`` with
    ``hydra.job.override_dirname`` (``seed=0,trainer.max_steps=20``).

    The overrides join the seed in one name, not a folder below it, so that no run folder holds
    another: the run without overrides (``seed=0``) and those with (``seed=0,…``) are siblings,
    and moving one's record aside (``trainer.resume=restart``) cannot move the others'.

    A group selection such as ``experiment=smoke/digits`` and a path value such as
    ``backbone.model.pretrained=<run>/checkpoints/last.pt`` carry slashes: they become ``-``,
    and the quotes and backslashes that protect a value's ``=`` are dropped. Overrides over
    :data:`MAX_FOLDER_BYTES` keep their head and tail around a hash of the whole, so that the name
    stays unique and the same for the same command (a rerun must find its folder again)."""
    name = f"seed={seed}"
    return f"{name},{short_name(overrides)}" if str(overrides) else name


def out_of_name() -> list[str]:
    """``hydra.job.config.override_dirname.exclude_keys`` (``${out_of_name:}``): :data:`NAME_ONLY`,
    :data:`NO_BEARING` and :data:`CHANGES_BITS`, each of the last two with every key under it that
    ``conf/`` declares (``logger.log_checkpoints``, ``resources.mem_gb``), as Hydra matches keys
    exactly. One list for the identity and the name: they cannot disagree."""
    return list(_out_of_name())


@functools.cache
def _out_of_name() -> tuple[str, ...]:
    keys = list(NAME_ONLY)
    top = yaml.safe_load((CONF / "config.yaml").read_text(encoding="utf-8"))
    for key in (*NO_BEARING, *CHANGES_BITS):
        keys.append(key)
        node = top.get(key) if "." not in key else None
        below = set(_flat(node)) if isinstance(node, dict) else set()
        for file in sorted((CONF / key).glob("*.yaml")) if "." not in key else ():
            below |= set(_flat(yaml.safe_load(file.read_text(encoding="utf-8")) or {}))
        keys += [f"{key}.{k}" for k in sorted(below) if k != "defaults"]
    return tuple(dict.fromkeys(keys))


def _flat(tree: dict, prefix: str = "") -> list[str]:
    """Every dotted key of ``tree`` (inner nodes too)."""
    found = []
    for key, value in tree.items():
        found.append(f"{prefix}{key}")
        if isinstance(value, dict):
            found += _flat(value, f"{prefix}{key}.")
    return found


def short_name(overrides: str) -> str:
    """``overrides`` as one folder name: see :func:`run_folder`."""
    flat = str(overrides).replace("\\", "").replace("'", "").replace('"', "").replace("/", "-")
    data = flat.encode()
    if len(data) <= MAX_FOLDER_BYTES:
        return flat
    digest = hashlib.sha1(data).hexdigest()[:8]
    head = data[:HEAD_BYTES].decode(errors="ignore")
    tail = data[-TAIL_BYTES:].decode(errors="ignore")
    return f"{head}~{digest}~{tail}"


def seed_and_overrides(run_dir: str | Path) -> tuple[str, str | None]:
    """``("seed=0", "trainer.max_steps=20")`` from a run folder named by :func:`run_folder`
    (``(…, None)`` without overrides); a :class:`ValueError` for a folder not named so."""
    name = Path(run_dir).name
    if not name.startswith("seed="):
        raise ValueError(f"{run_dir} is not a run folder <task>/<backbone>/<variant>/seed=<s>[,<overrides>]")
    seed, _, overrides = name.partition(",")
    return seed, overrides or None


def legacy_folder(run_dir: str | Path) -> Path | None:
    """Where a run with overrides was recorded before they joined the seed's name
    (``…/seed=0/trainer.max_steps=20``, a folder inside the run without overrides); None for a run
    without overrides, whose folder did not change."""
    try:
        seed, overrides = seed_and_overrides(run_dir)
    except ValueError:
        return None
    return None if overrides is None else Path(run_dir).parent / seed / overrides


#: where a run folder's overrides part starts its next ``key=value`` (values may hold commas: ``[0.9,0.95]``)
_NEXT_ITEM = re.compile(r",(?=[+~]*[A-Za-z_][\w.@-]*=)")


def named_before(run_dir: str | Path) -> list[Path]:
    """The folders beside ``run_dir`` that the same command named when some of its overrides were
    still in the name though out of the identity (``seed=0,logger.log_checkpoints=true`` for
    ``seed=0``, before :func:`out_of_name` listed ``logger.*``): the same seed, and the same
    overrides once those keys are dropped. Only names kept whole (not hashed) are read."""
    run_dir = Path(run_dir)
    try:
        seed, mine = seed_and_overrides(run_dir)
    except ValueError:
        return []
    out = set(out_of_name()) - {"seed"}
    found = []
    for sibling in sorted(run_dir.parent.glob(f"{seed},*")) if run_dir.parent.is_dir() else ():
        items = _NEXT_ITEM.split(seed_and_overrides(sibling)[1] or "")
        kept = [item for item in items if item.partition("=")[0].lstrip("+~") not in out]
        if len(kept) < len(items) and ",".join(kept) == (mine or ""):
            found.append(sibling)
    return found


def sibling_run(run_dir: str, task: str, seed: int) -> str:
    """The folder of the run that the same command made for ``task`` and ``seed``: same backbone,
    variant and overrides, e.g. the ``mlm`` pretraining run a GLUE fine-tuning starts from.

    Run folders are ``<base>/<task>/<backbone>/<variant>/seed=<s>[,<overrides>]`` (``conf/config.yaml``,
    ``hydra.run.dir`` and ``hydra.sweep.subdir``); the sibling swaps ``<task>`` and ``seed=<s>``."""
    path = Path(run_dir)
    try:
        _, overrides = seed_and_overrides(path)
    except ValueError as error:
        raise ValueError(f"sibling_run: {error}") from None
    variant_dir = path.parent
    base = variant_dir.parent.parent.parent
    name = run_folder(seed) + (f",{overrides}" if overrides else "")
    return str(base / task / variant_dir.parent.name / variant_dir.name / name)


def pretrained_by(pretrain_task: str, seed: int, task: str) -> str | None:
    """``backbone.model.pretrained`` of a pipeline sweep: the ``checkpoints/last.pt`` of the run the same
    command makes for ``pretrain_task`` and ``seed`` (:func:`sibling_run` of this job's folder, which
    Hydra knows), or None in that run itself.

    ``experiment=glue_tiny`` sets it to ``${pretrained_by:mlm_tiny,${seed},${task.name}}``: its
    ``mlm_tiny`` runs pretrain, its GLUE runs fine-tune from the one of their variant and seed."""
    if task == pretrain_task:
        return None
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import MissingMandatoryValue

    try:  # set in a run of src.run (its jobs and SLURM's); unset, or without a folder, elsewhere
        run_dir = HydraConfig.get().runtime.output_dir
    except (ValueError, MissingMandatoryValue):
        raise ValueError(
            "pretrained_by: no run folder to find the pretraining run from (Hydra's, set in a run of "
            "python -m src.run); set backbone.model.pretrained to a checkpoint instead"
        ) from None
    return str(Path(sibling_run(run_dir, pretrain_task, seed)) / "checkpoints" / "last.pt")


def attn_parts(parts: Iterable[str]) -> str:
    """``${attn_parts:${.parts}}`` (``conf/attn/compose.yaml``): a composition's name,
    ``cond_init+spectral``, as :func:`src.attention.compose.joined` writes it; registered here too,
    so that a config resolves before torch (which ``src.attention`` imports) is."""
    return "+".join(parts)


def slurm_attempt_min(time_min: int, max_time_min: int | str | None, partition: str | None = None) -> int:
    """``hydra.launcher.timeout_min``: :func:`src.slurm_time.attempt_min` (imported on use: only
    the process that submits to SLURM resolves it)."""
    from src.slurm_time import attempt_min

    return attempt_min(time_min, max_time_min, partition)


def slurm_timeouts(time_min: int, attempt: int, signal_delay_s: int) -> int:
    """``hydra.launcher.max_num_timeout``: :func:`src.slurm_time.timeouts_allowed`."""
    from src.slurm_time import timeouts_allowed

    return timeouts_allowed(time_min, attempt, signal_delay_s)


def image_folder_value(key: str, data_dir: str | None, device: str = "auto") -> object:
    """``${image_folder:KEY,${task.data_dir}[,${trainer.device}]}``: :func:`src.image_folder.resolve`
    with this process's usable CPUs (which size the workers)."""
    return image_folder.resolve(key, data_dir, device, usable_cpus())


def patch_grid_size(patch_size: int | None) -> int:
    """The image side at which a backbone of ``patch_size`` sees 14 × 14 patches, as ViT-B/16 does at
    its 224 px (``task=imagefolder``'s ``img_size``: the backbone's, not the data's); 224 for a
    backbone that states no patch size (``${oc.select:backbone.model.patch_size,null}``)."""
    return 14 * int(patch_size or 16)


OmegaConf.register_new_resolver("cpus_at_most", cpus_at_most, replace=True)
OmegaConf.register_new_resolver("at_least", at_least, replace=True)
OmegaConf.register_new_resolver("run_folder", run_folder, replace=True)
OmegaConf.register_new_resolver("out_of_name", out_of_name, replace=True)
OmegaConf.register_new_resolver("pretrained_by", pretrained_by, replace=True)
OmegaConf.register_new_resolver("attn_parts", attn_parts, replace=True)
OmegaConf.register_new_resolver("slurm_attempt_min", slurm_attempt_min, replace=True)
OmegaConf.register_new_resolver("slurm_timeouts", slurm_timeouts, replace=True)
OmegaConf.register_new_resolver("image_folder", image_folder_value, replace=True)
OmegaConf.register_new_resolver("image_folder_label", image_folder.label, replace=True)
OmegaConf.register_new_resolver("corpus_label", labels.corpus_label, replace=True)
OmegaConf.register_new_resolver("patch_grid_size", patch_grid_size, replace=True)
