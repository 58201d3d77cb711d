"""Many seeds of the sandbox trained at once: P5's success-by-epoch curves on a laptop.

P5's findings are rates over seeds (how many seeds learn, and when), and its model has about
200 parameters: one run of 64,000 steps spends its time in Python, not arithmetic (about
5 minutes through the shared loop). :func:`train_seeds` trains ``S`` seeds as one stacked
model instead: each seed's model is built exactly as ``python -m src.run … seed=s`` builds
it (same config, same :func:`~src.engine.loop.prepared.prepared`: the task, the seed, the data,
the model with the variant applied), its parameters are stacked along a leading seed axis
(:mod:`src.sandbox.stacked`), and one step runs every
seed's forward pass under :func:`torch.vmap` on its own batch, drawn in the order the shared
loop draws it (:func:`~src.engine.loop.data.epoch_order` of the seed). The loss is the sum of
the seeds' losses, so each seed's gradient is its own; Adam (and any optimizer that acts on
each element alone, with no weight decay) then updates each seed as its own run would. A
test checks that seed ``s`` of an ensemble ends a few epochs on the weights of the run
``seed=s`` (tests/sandbox/test_seeds.py).

``trainer.compile=true`` compiles the stacked step (:func:`torch.compile`).
What it does not do, and refuses: weight decay (timm leaves 1-D parameters out of it, which
stacking turns 2-D), gradient clipping (a norm per seed), accumulation, precision other than
fp32. Those runs go through ``python -m src.run -m … seed=…`` as any sweep.

Its output is the test accuracy and loss of every seed after every epoch (:class:`Curves`), and
every 5 epochs each seed's clustering head (P5's circuit: :mod:`src.sandbox.clustering`),
written by ``python -m src.sandbox.seeds`` to ``curves.json`` with the success-by-epoch
figure and the seeds' final weights (``weights.safetensors``); :mod:`launch.analysis.seed_sets` and
:mod:`launch.analysis.seed_verdicts` read them. ``--init-from DIR`` starts every seed from its final
weights in another set (P5's fine-tuning from p = 2 to p = 3, its curriculum).

In :func:`train_seeds`: ``init`` is another set's final weights to start from (same seeds and
architecture; the optimizer starts afresh, as P5's fine-tuning does); every ``probe_every``
epochs (0: never) each seed's clustering head is measured on its first ``task.sandbox.probe_size``
test sequences (:func:`src.sandbox.clustering.probe_seeds`); ``progress`` is a file the set's
progress is saved to every ``progress_every`` epochs and resumed from when it exists (the batch
order is a function of the seed and the epoch, so a resumed set ends bit-identical to an
uninterrupted one).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from src.command import command_parser, run_command
from src.configs import axes, combinations, compose
from src.engine.record import atomic
from src.engine.record.lock import OutputLock
from src.errors import ConfigError

from .clustering import probe_seeds
from .curves import STAGE_EVERY, SUCCESS, Curves, draw_success, seed_table, success_by_epoch
from .stacked import (
    WEIGHTS,
    DamagedProgress,
    Stacked,
    load_progress,
    load_weights,
    save_progress,
    save_weights,
    stack_seeds,
    stacked_functions,
    start_from,
)


def check_supported(cfg: DictConfig) -> None:
    """Refuse, in one line, what stacking seeds would train differently from separate runs."""
    problems = []
    if float(cfg.optim.get("weight_decay", 0) or 0) != 0:
        problems.append(f"optim.weight_decay={cfg.optim.weight_decay} (use 0)")
    if cfg.trainer.get("clip_grad") is not None:
        problems.append(f"trainer.clip_grad={cfg.trainer.clip_grad} (use null)")
    if int(cfg.trainer.get("accumulate", 1)) != 1:
        problems.append(f"trainer.accumulate={cfg.trainer.accumulate} (use 1)")
    if cfg.trainer.get("precision", "fp32") != "fp32":
        problems.append(f"trainer.precision={cfg.trainer.precision} (use fp32)")
    if cfg.trainer.get("ema"):
        problems.append(f"trainer.ema={cfg.trainer.ema} (use null)")
    if problems:
        raise ConfigError(
            "seeds trained at once must train as separate runs would; not with "
            + ", ".join(problems)
            + ": run those as a sweep, python -m src.run -m … seed=0,1,…"
        )


def train_seeds(
    cfg: DictConfig,
    seeds: Sequence[int],
    epochs: int,
    *,
    data_dir: Path = Path("."),
    overrides: Sequence[str] = (),
    on_epoch: Callable[[int, Tensor], None] | None = None,
    init: dict[str, Tensor] | None = None,
    probe_every: int = STAGE_EVERY,
    progress: Path | None = None,
    progress_every: int = 50,
) -> tuple[Curves, dict[str, Tensor]]:
    """Train ``seeds`` of ``cfg``'s sandbox for ``epochs`` at once; the curves and the final
    stacked weights (``state[name][i]``: seed ``seeds[i]``'s). ``on_epoch(epoch, acc)`` is called
    after each epoch with the seeds' test accuracies ``(S,)``; ``init``, ``probe_every`` and
    ``progress``: the module docstring's fine-tuning, probes and resume. Past ``epochs``, every
    argument is by keyword: ten arguments, several of one type, read wrongly by position."""
    from src.engine.loop.data import epoch_order
    from src.engine.loop.optim import build_scheduler

    seeds = list(seeds)
    st = checked_stack(cfg, seeds, data_dir, init)
    batch, n = int(cfg.task.batch_size), st.x_train.shape[1]
    steps_per_epoch = n // batch
    holder, trained, optimizer = stacked_optimizer(cfg, st)
    scheduler = build_scheduler(cfg.sched, optimizer, epochs * steps_per_epoch, steps_per_epoch)
    step_loss, evaluate = stacked_functions(st.base, bool(cfg.trainer.get("compile")))
    curves = Curves(
        seeds, list(overrides), epochs, steps_per_epoch, int(st.x_test.shape[1]), probe_every=probe_every
    )
    curves.attn = OmegaConf.to_container(cfg.attn, resolve=True)
    probe_x = st.x_test[:, : int(cfg.task.get("sandbox", {}).get("probe_size", 512))]  # (S, B, L)
    accs, losses = [], []
    started, first, spent = time.monotonic(), 0, 0.0
    if progress is not None and progress.is_file():
        try:
            first, accs, losses, spent = resume(progress, overrides, holder, optimizer, st, curves)
        except DamagedProgress as damaged:  # set aside (never resumed, never deleted); start afresh
            set_aside_progress(progress, str(damaged))
            return train_seeds(
                cfg,
                seeds,
                epochs,
                data_dir=data_dir,
                overrides=overrides,
                on_epoch=on_epoch,
                init=init,
                probe_every=probe_every,
                progress=progress,
                progress_every=progress_every,
            )
        if scheduler is not None:
            scheduler.step_update(first * steps_per_epoch)
    for epoch in range(first, epochs):
        order = torch.stack([epoch_order(n, s, epoch) for s in seeds])  # (S, N): each seed's own
        train_epoch(st, trained, step_loss, optimizer, scheduler, order, batch, epoch * steps_per_epoch)
        with torch.no_grad():
            acc, test_loss = evaluate({**trained, **st.fixed}, st.buffers, st.x_test, st.y_test)  # (S,), (S,)
            if probe_every and (epoch + 1) % probe_every == 0:
                found = probe_seeds(st.live, {**trained, **st.fixed, **st.buffers}, probe_x, int(cfg.task.k))
                append_probes(curves, *found)
        accs.append(acc.tolist())
        losses.append(test_loss.tolist())
        if progress is not None and (epoch + 1) % progress_every == 0 and epoch + 1 < epochs:
            so_far = progress_key(curves, epoch + 1, accs, losses, spent + time.monotonic() - started)
            save_progress(progress, {**weights_state(holder, optimizer, st), **so_far})
        if on_epoch is not None:
            on_epoch(epoch + 1, acc)
    curves.acc = [list(a) for a in zip(*accs, strict=True)]
    curves.loss = [list(v) for v in zip(*losses, strict=True)]
    curves.seconds = round(spent + time.monotonic() - started, 1)
    every = {**trained, **st.fixed, **st.buffers}
    return curves, {k: every[k].detach().clone() for k in st.live.state_dict()}  # what a checkpoint keeps


def checked_stack(
    cfg: DictConfig, seeds: list[int], data_dir: Path, init: dict[str, Tensor] | None
) -> Stacked:
    """The seeds stacked (from ``init``'s weights where given), after refusing what would not
    train as separate runs: options stacking cannot keep, no seeds, no whole batch."""
    check_supported(cfg)
    if not seeds:
        raise ConfigError("no seeds to train: give seeds=0-31 (a range) or seeds=[0,3,7]")
    st = stack_seeds(cfg, seeds, data_dir)
    if init is not None:
        start_from(st, init)
    batch, n = int(cfg.task.batch_size), st.x_train.shape[1]
    if n // batch < 1:
        raise ConfigError(f"{n} training sequences make no batch of task.batch_size={batch}")
    return st


def train_epoch(
    st: Stacked,
    trained: dict[str, Tensor],
    step_loss: Callable,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    order: Tensor,
    batch: int,
    step: int,
) -> None:
    """One epoch of stacked steps, every seed on its own batches in its own ``order (S, N)``;
    ``step``: the optimizer steps taken before it (the scheduler's clock)."""
    xs = torch.gather(st.x_train, 1, order[..., None].expand_as(st.x_train))  # (S, N, L)
    ys = torch.gather(st.y_train, 1, order)  # (S, N)
    for j in range(st.x_train.shape[1] // batch):
        window = slice(j * batch, (j + 1) * batch)
        loss = step_loss({**trained, **st.fixed}, st.buffers, xs[:, window], ys[:, window])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step_update(step + j + 1)


def weights_state(holder: nn.Module, optimizer: torch.optim.Optimizer, st: Stacked) -> dict:
    """What of a set's progress is tensors: the stacked parameters, Adam's state, the buffers."""
    return {"holder": holder.state_dict(), "optimizer": optimizer.state_dict(), "buffers": st.buffers}


def progress_key(curves: Curves, epoch: int, accs: list, losses: list, seconds: float) -> dict:
    """A set's progress but its weights: what the file is checked against (its seeds, epochs and
    overrides), the epoch reached, the curves and probes so far, the seconds spent."""
    kept = {"seeds": curves.seeds, "epochs": curves.epochs, "overrides": list(curves.overrides)}
    so_far = {"epoch": epoch, "accs": accs, "losses": losses, "seconds": seconds}
    return kept | so_far | {"clustering": curves.clustering, "focus": curves.focus}


def append_probes(curves: Curves, clustering: list[float], focus: list[float]) -> None:
    """One probe's values (one per seed) onto each seed's series."""
    if not curves.clustering:
        curves.clustering, curves.focus = [[] for _ in clustering], [[] for _ in focus]
    for rows, values in ((curves.clustering, clustering), (curves.focus, focus)):
        for row, value in zip(rows, values, strict=True):
            row.append(value)


def resume(
    path: Path,
    overrides: Sequence[str],
    holder: nn.Module,
    optimizer: torch.optim.Optimizer,
    st: Stacked,
    curves: Curves,
) -> tuple[int, list, list, float]:
    """The set's saved progress put back (weights, Adam's moments, buffers, probes); the epoch it
    reached, the accuracies and losses so far, and the seconds spent."""
    kept = load_progress(path, curves.seeds, curves.epochs, list(overrides))
    try:
        holder.load_state_dict(kept["holder"])
        optimizer.load_state_dict(kept["optimizer"])
        for name, value in kept["buffers"].items():
            st.buffers[name].copy_(value)
        curves.clustering, curves.focus = kept["clustering"], kept["focus"]
        return int(kept["epoch"]), kept["accs"], kept["losses"], float(kept["seconds"])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as error:
        # a progress of this set's name that does not fit it: the caller starts afresh, so nothing
        # half-loaded here stays
        first = (str(error).splitlines() or [""])[0][:200]
        raise DamagedProgress(f"{type(error).__name__}: {first}") from error


def set_aside_progress(path: Path, reason: str) -> Path:
    """Move an unreadable progress file to ``progress.pt.corrupt`` (``.corrupt.<n>`` when taken),
    saying so in one line: the rerun that met it starts the set afresh instead of failing on it
    every time, and the file stays for whoever wants to look at it."""
    from src.engine.record.checkpoint import set_aside_path

    aside = set_aside_path(path)
    os.replace(path, aside)
    print(f"note: unreadable progress {path} ({reason}), moved to {aside.name}; the set starts afresh",
          file=sys.stderr, flush=True)  # fmt: skip
    return aside


def stacked_optimizer(
    cfg: DictConfig, st: Stacked
) -> tuple[nn.Module, dict[str, Tensor], torch.optim.Optimizer]:
    """The stacked parameters as one module (timm's factory wants a module; names flattened),
    the parameters by their model names, and the config's optimizer over them."""
    from src.engine.loop.optim import build_optimizer

    holder = nn.Module()
    for k, v in st.trained.items():
        holder.register_parameter(k.replace(".", "__"), nn.Parameter(v))
    trained = {k: getattr(holder, k.replace(".", "__")) for k in st.trained}
    return holder, trained, build_optimizer(cfg.optim, holder)


# -- the command ----------------------------------------------------------------------------


def parse_seeds(text: str) -> list[int]:
    """``0-31`` (inclusive) or ``0,3,7`` into a list of seeds."""
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        try:
            out.extend(range(int(low), int(high) + 1) if high else [int(low)])
        except ValueError:
            raise ConfigError(f"--seeds {text!r}: give a range 0-31 or a list 0,3,7") from None
    return out


def cells(overrides: Sequence[str]) -> list[tuple[list[str], str]]:
    """The grid ``overrides`` sweep (Hydra's ``key=a,b`` and the experiment's
    ``hydra.sweeper.params``, expanded as ``python -m src.run -m`` would), one seed set per cell:
    its overrides and its folder's name (the swept keys' ``key=value``; ``""`` for one cell)."""
    values, _ = axes(overrides)
    values.pop("seed", None)  # a set trains every seed of --seeds
    found = combinations(values)  # every value as Hydra reads it: 3e-3 is 0.003
    if len(found) == 1:
        return [(found[0], "")]
    swept = [i for i in range(len(found[0])) if len({cell[i] for cell in found}) > 1]
    return [(cell, ",".join(cell[i] for i in swept).replace("/", "-")) for cell in found]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m src.sandbox.seeds [overrides…] --seeds 0-31 [--epochs N] --out DIR``: bad input
    is one ``error:`` line on stderr and exit status 2, before anything is written."""
    parser = command_parser(__spec__.name, __doc__)
    parser.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides, as python -m src.run takes them; key=a,b sweeps: one seed set per cell",
    )
    parser.add_argument("--seeds", default="0-31", help="a range 0-31 or a list 0,3,7 (default 0-31)")
    parser.add_argument("--epochs", type=int, default=None, help="default: the config's trainer.max_epochs")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="folder for curves.json, seeds.json, success.png, weights.safetensors (a grid: one per cell)",
    )
    parser.add_argument(
        "--init-from",
        type=Path,
        default=None,
        help="start each seed from its final weights in this set's folder (P5's fine-tuning: its curriculum)",
    )
    parser.add_argument(
        "--probe-every",
        type=int,
        default=STAGE_EVERY,
        help=f"epochs between clustering-head probes (default {STAGE_EVERY}; 0: none)",
    )
    return run_command(parser, train_sets, argv)


def train_sets(args: argparse.Namespace) -> None:
    """The command's work, under ``--out``'s lock: every cell's seed set trained and written."""
    check_arguments(args.epochs, args.probe_every)
    seeds = parse_seeds(args.seeds)
    try:
        with OutputLock(args.out, COMMAND):  # a second command into this --out is refused: see train_cells
            init = None if args.init_from is None else load_weights(args.init_from, seeds)
            todo = planned(cells(args.overrides), seeds, args.epochs, args.out)
            train_cells(todo, seeds, args.out, init, args.init_from, args.probe_every)
    except OSError as error:  # an --out that cannot be made
        raise ConfigError(f"--out {args.out}: cannot write there ({error.strerror or error})") from error


COMMAND = "python -m src.sandbox.seeds"


def check_arguments(epochs: int | None, probe_every: int) -> None:
    """``--epochs`` at least 1 where given (0 would fall back to the recipe's budget unsaid) and
    ``--probe-every`` at least 0 (0: no probes)."""
    if epochs is not None and epochs < 1:
        raise ConfigError(f"--epochs {epochs}: give at least 1 (leave it out for trainer.max_epochs)")
    if probe_every < 0:
        raise ConfigError(f"--probe-every {probe_every}: give at least 0 (0: no probes)")


def train_cells(
    todo: list[tuple[list[str], DictConfig, int, Path]],
    seeds: list[int],
    root: Path,
    init: tuple[dict[str, Tensor], list[float] | None] | None,
    init_from: Path | None,
    probe_every: int,
) -> None:
    """Train each planned cell, under its own folder's lock too where it is not ``root`` (another
    command may have been given that cell as its ``--out``); a cell trained meanwhile is kept."""
    for overrides, cfg, epochs, out in todo:
        with contextlib.ExitStack() as held:
            if out != root:
                held.enter_context(OutputLock(out, COMMAND))
                if trained_already(out, seeds, epochs, alone=False):  # by that other command, meanwhile
                    continue
            train_one(overrides, cfg, seeds, epochs, out, init, init_from, probe_every)


def planned(
    grid: list[tuple[list[str], str]], seeds: list[int], epochs: int | None, root: Path
) -> list[tuple[list[str], DictConfig, int, Path]]:
    """The grid's cells still to train, each composed and checked before any trains: a sandbox, a
    variant its backbone takes, a budget; a cell already trained with these seeds and epochs is
    kept (said so), one trained otherwise is refused."""
    from src.engine.compatible import check_compatible

    todo = []
    for overrides, name in grid:
        cfg = compose(overrides)
        if cfg.backbone.get("kind") != "modadd":
            raise ConfigError(
                f"backbone={cfg.backbone.name} is not a sandbox (kind: modadd): "
                "task=modadd or experiment=paper/p5"
            )
        check_compatible(cfg)  # a variant the backbone does not take, as python -m src.run refuses it
        budget = epochs or cfg.trainer.max_epochs
        if not budget:
            raise ConfigError("no epochs: give --epochs or trainer.max_epochs")
        out = root / name if name else root
        if not trained_already(out, seeds, budget, alone=len(grid) == 1):
            todo.append((overrides, cfg, budget, out))
    return todo


def trained_already(out: Path, seeds: list[int], epochs: int, alone: bool) -> bool:
    """Whether ``out`` holds this cell's set already (said so: it is kept); a set there of other
    seeds or epochs, or any set where the command trains one set alone, is refused."""
    if not (out / "curves.json").exists():
        return False
    kept = Curves.load(out / "curves.json")
    if alone or kept.seeds != seeds or kept.epochs != epochs:
        raise ConfigError(
            f"{out / 'curves.json'} exists ({len(kept.seeds)} seeds × {kept.epochs} epochs): "
            "give another --out (nothing is overwritten)"
        )
    print(f"{out}: trained already, kept")
    return True


PROGRESS = "progress.pt"  # a set's progress while it trains (every 50 epochs), resumed by a rerun


def train_one(
    overrides: list[str],
    cfg: DictConfig,
    seeds: list[int],
    epochs: int,
    out: Path,
    init: tuple[dict[str, Tensor], list[float] | None] | None = None,
    init_from: Path | None = None,
    probe_every: int = STAGE_EVERY,
) -> None:
    """One seed set of the command: trained (from ``init``'s weights where given), then written to ``out``."""
    torch.set_num_threads(int(cfg.trainer.get("threads") or 1))

    def report(epoch: int, acc: Tensor) -> None:
        if epoch % max(1, epochs // 20) == 0 or epoch == epochs:
            print(
                f"epoch {epoch}/{epochs}: {(acc >= SUCCESS).sum().item()} of {len(seeds)} seeds "
                f"at ≥ {SUCCESS:.0%}",
                flush=True,
            )

    resume = out / PROGRESS
    if resume.is_file():
        print(f"{out}: resuming from {resume}", flush=True)
    curves, state = train_seeds(
        cfg,
        seeds,
        epochs,
        data_dir=Path(cfg.paths.data_dir),
        overrides=overrides,
        on_epoch=report,
        init=init and init[0],
        probe_every=probe_every,
        progress=resume,
    )
    if init is not None:
        curves.init_from, curves.init_acc = str(init_from), init[1]
    out.mkdir(parents=True, exist_ok=True)
    save_weights(state, seeds, out / WEIGHTS)
    curves.save(out / "curves.json")
    resume.unlink(missing_ok=True)  # the set is whole: its own progress file is spent
    atomic.write_text(out / "seeds.json", json.dumps(seed_table(curves), indent=1))
    draw_success({" ".join(overrides) or "default": curves}, out / "success.png")
    rate = success_by_epoch(curves)[-1]
    print(
        f"{rate:.0%} of {len(seeds)} seeds at ≥ {SUCCESS:.0%} after {epochs} epochs, "
        f"in {curves.seconds:.0f} s: {out}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
