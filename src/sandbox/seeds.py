"""Many seeds of the sandbox trained at once: P5's success-by-epoch curves on a laptop.

P5's findings are rates over seeds (how many seeds learn, and when), and its model has about
200 parameters: one run of 64,000 steps spends its time in Python, not arithmetic (about
5 minutes through the shared loop). :func:`train_seeds` trains ``S`` seeds as one stacked
model instead: each seed's model is built exactly as ``python -m src.run … seed=s`` builds
it (same config, same :func:`~src.engine.loop.seeding.seed_everything`, same
:func:`~src.engine.loop.model.build_model`, the variant applied), its parameters are stacked
along a leading seed axis (:func:`torch.func.stack_module_state`), and one step runs every
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

Its output is the test accuracy and loss of every seed after every epoch (:class:`Curves`),
written by ``python -m src.sandbox.seeds`` to ``curves.json`` with the success-by-epoch
figure; :mod:`src.sandbox.success` reads them.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from src.errors import ConfigError

from .curves import SUCCESS, Curves, draw_success, seed_table, success_by_epoch


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


def seed_config(cfg: DictConfig, seed: int) -> DictConfig:
    """``cfg`` as ``seed=<seed>`` composes it (``task.data_seed`` follows ``${seed}``)."""
    out = copy.deepcopy(cfg)
    OmegaConf.set_struct(out, False)
    out.seed = seed
    return out


def build_seed(cfg: DictConfig, seed: int, data_dir: Path) -> tuple[nn.Module, tuple, tuple]:
    """Seed ``seed``'s model, training set and test set, as the shared loop builds them."""
    from hydra.utils import instantiate

    from src import attention
    from src.engine.loop.model import build_model
    from src.engine.loop.seeding import seed_everything

    cfg = seed_config(cfg, seed)
    task = instantiate(cfg.task)
    seed_everything(seed)  # where train_session seeds: after the task, before its data and model
    train, test = task.datasets(Path(data_dir))
    model = build_model(cfg, task, attention.variant_from_config(cfg.attn))
    task.prepare_model(model)
    return model, tuple(train.tensors), tuple(test.tensors)


@dataclass
class Stacked:
    """Every seed's model as one functional model: parameters and data with a leading seed axis."""

    base: nn.Module  # one seed's model on the meta device: the function every seed runs
    trained: dict[str, Tensor]  # (S, …) each
    fixed: dict[str, Tensor]  # parameters that do not train (S, …)
    buffers: dict[str, Tensor]
    x_train: Tensor  # (S, N, L)
    y_train: Tensor  # (S, N)
    x_test: Tensor  # (S, M, L)
    y_test: Tensor  # (S, M)


def stack_seeds(cfg: DictConfig, seeds: Sequence[int], data_dir: Path) -> Stacked:
    """Each seed's model and data built as its own run builds them, stacked along the seed axis."""
    from torch.func import stack_module_state

    built = [build_seed(cfg, s, data_dir) for s in seeds]
    models = [m.train() for m, _, _ in built]
    for model in models:  # SDPA has no batching rule on CPU (vmap would loop over seeds): the
        for module in model.modules():  # explicit softmax path, the same arithmetic
            if hasattr(module, "fused_attn"):
                module.fused_attn = False
    params, buffers = stack_module_state(models)  # each (S, …)
    frozen = {k for k, p in models[0].named_parameters() if not p.requires_grad}
    return Stacked(
        copy.deepcopy(models[0]).to("meta"),
        {k: v for k, v in params.items() if k not in frozen},
        {k: v for k, v in params.items() if k in frozen},
        buffers,
        *(torch.stack([b[part][i] for b in built]) for part, i in ((1, 0), (1, 1), (2, 0), (2, 1))),
    )


def stacked_functions(base: nn.Module, compile: bool) -> tuple[Callable, Callable]:
    """The stacked step's loss (the sum of the seeds' mean cross-entropies: each seed's gradient
    is its own) and the seeds' test accuracy and loss, each seed through ``base`` under vmap."""
    from torch.func import functional_call

    def seed_loss(p, b, x, y):  # one seed's mean cross-entropy
        return F.cross_entropy(functional_call(base, (p, b), (x,)), y)

    def seed_eval(p, b, x, y):  # one seed's test accuracy and loss
        out = functional_call(base, (p, b), (x,))
        return (out.argmax(-1) == y).float().mean(), F.cross_entropy(out, y)

    every_seed = torch.vmap(seed_loss)

    def total_loss(p, b, x, y):  # (S, B, L), (S, B) -> the sum of the seeds' losses
        return every_seed(p, b, x, y).sum()

    # trainer.compile: the stacked step through torch.compile (about 2.5× faster on the
    # multi-head sandbox after ~20 s of compiling; the same arithmetic up to float rounding)
    return (torch.compile(total_loss) if compile else total_loss), torch.vmap(seed_eval)


def train_seeds(
    cfg: DictConfig,
    seeds: Sequence[int],
    epochs: int,
    data_dir: Path = Path("."),
    overrides: Sequence[str] = (),
    on_epoch: Callable[[int, Tensor], None] | None = None,
) -> tuple[Curves, dict[str, Tensor]]:
    """Train ``seeds`` of ``cfg``'s sandbox for ``epochs`` at once; the curves and the final
    stacked parameters (``params[name][i]``: seed ``seeds[i]``'s). ``on_epoch(epoch, acc)``
    is called after each epoch with the seeds' test accuracies ``(S,)``."""
    from src.engine.loop.data import epoch_order
    from src.engine.loop.optim import build_scheduler

    check_supported(cfg)
    if not seeds:
        raise ConfigError("no seeds to train: give seeds=0-31 (a range) or seeds=[0,3,7]")
    seeds = list(seeds)
    st = stack_seeds(cfg, seeds, data_dir)

    batch, n = int(cfg.task.batch_size), st.x_train.shape[1]
    steps_per_epoch = n // batch
    if steps_per_epoch < 1:
        raise ConfigError(f"{n} training sequences make no batch of task.batch_size={batch}")
    holder = nn.Module()  # timm's factory wants a module: the stacked parameters, names flattened
    for k, v in st.trained.items():
        holder.register_parameter(k.replace(".", "__"), nn.Parameter(v))
    trained = {k: getattr(holder, k.replace(".", "__")) for k in st.trained}
    optimizer = _optimizer(cfg.optim, holder)
    scheduler = build_scheduler(cfg.sched, optimizer, epochs * steps_per_epoch, steps_per_epoch)
    step_loss, evaluate = stacked_functions(st.base, bool(cfg.trainer.get("compile")))
    curves = Curves(seeds, list(overrides), epochs, steps_per_epoch, int(st.x_test.shape[1]))
    curves.attn = OmegaConf.to_container(cfg.attn, resolve=True)
    accs, losses = [], []
    started, step = time.monotonic(), 0
    for epoch in range(epochs):
        order = torch.stack([epoch_order(n, s, epoch) for s in seeds])  # (S, N): each seed's own
        xs = torch.gather(st.x_train, 1, order[..., None].expand_as(st.x_train))  # (S, N, L)
        ys = torch.gather(st.y_train, 1, order)  # (S, N)
        for j in range(steps_per_epoch):
            window = slice(j * batch, (j + 1) * batch)
            loss = step_loss({**trained, **st.fixed}, st.buffers, xs[:, window], ys[:, window])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if scheduler is not None:
                scheduler.step_update(step)
        with torch.no_grad():
            acc, test_loss = evaluate({**trained, **st.fixed}, st.buffers, st.x_test, st.y_test)  # (S,), (S,)
        accs.append(acc.tolist())
        losses.append(test_loss.tolist())
        if on_epoch is not None:
            on_epoch(epoch + 1, acc)
    curves.acc = [list(a) for a in zip(*accs, strict=True)]
    curves.loss = [list(v) for v in zip(*losses, strict=True)]
    curves.seconds = round(time.monotonic() - started, 1)
    return curves, {k: v.detach().clone() for k, v in {**trained, **st.fixed}.items()}


def _optimizer(cfg: DictConfig, holder: nn.Module):
    from src.engine.loop.optim import build_optimizer

    return build_optimizer(cfg, holder)


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
    from launch.plan import jobs

    found = [o for o, _ in jobs(list(overrides))]  # every value as Hydra reads it: 3e-3 is 0.003
    if len(found) == 1:
        return [(found[0], "")]
    swept = [i for i in range(len(found[0])) if len({cell[i] for cell in found}) > 1]
    return [(cell, ",".join(cell[i] for i in swept).replace("/", "-")) for cell in found]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m src.sandbox.seeds [overrides…] --seeds 0-31 [--epochs N] --out DIR``."""
    import argparse

    from launch.plan import compose
    from src.engine.compatible import check_compatible

    parser = argparse.ArgumentParser(prog="python -m src.sandbox.seeds", description=__doc__.split("\n\n")[0])
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
        help="folder for curves.json, seeds.json, success.png (a grid: one subfolder per cell)",
    )
    args = parser.parse_args(argv)
    todo = []
    try:
        seeds = parse_seeds(args.seeds)
        grid = cells(args.overrides)
        for overrides, name in grid:
            cfg = compose(overrides)
            if cfg.backbone.get("kind") != "modadd":
                raise ConfigError(
                    f"backbone={cfg.backbone.name} is not a sandbox (kind: modadd): "
                    "task=modadd or experiment=paper/p5"
                )
            check_compatible(cfg)  # a variant the backbone does not take, as python -m src.run refuses it
            epochs = args.epochs or cfg.trainer.max_epochs
            if not epochs:
                raise ConfigError("no epochs: give --epochs or trainer.max_epochs")
            out = args.out / name if name else args.out
            if (out / "curves.json").exists():
                kept = Curves.load(out / "curves.json")
                if len(grid) == 1 or kept.seeds != seeds or kept.epochs != epochs:
                    raise ConfigError(
                        f"{out / 'curves.json'} exists ({len(kept.seeds)} seeds × {kept.epochs} epochs): "
                        "give another --out (nothing is overwritten)"
                    )
                print(f"{out}: trained already, kept")
                continue
            todo.append((overrides, cfg, epochs, out))
    except ConfigError as error:
        print(f"error: {error}")
        return 2
    for overrides, cfg, epochs, out in todo:
        train_one(overrides, cfg, seeds, epochs, out)
    return 0


def train_one(overrides: list[str], cfg: DictConfig, seeds: list[int], epochs: int, out: Path) -> None:
    """One seed set of the command: trained, then written to ``out``."""
    torch.set_num_threads(int(cfg.trainer.get("threads") or 1))

    def progress(epoch: int, acc: Tensor) -> None:
        if epoch % max(1, epochs // 20) == 0 or epoch == epochs:
            print(
                f"epoch {epoch}/{epochs}: {(acc >= SUCCESS).sum().item()} of {len(seeds)} seeds "
                f"at ≥ {SUCCESS:.0%}",
                flush=True,
            )

    curves, _ = train_seeds(cfg, seeds, epochs, Path(cfg.paths.data_dir), overrides, progress)
    out.mkdir(parents=True, exist_ok=True)
    curves.save(out / "curves.json")
    (out / "seeds.json").write_text(json.dumps(seed_table(curves), indent=1))
    draw_success({" ".join(overrides) or "default": curves}, out / "success.png")
    rate = success_by_epoch(curves)[-1]
    print(
        f"{rate:.0%} of {len(seeds)} seeds at ≥ {SUCCESS:.0%} after {epochs} epochs, "
        f"in {curves.seconds:.0f} s: {out}"
    )


if __name__ == "__main__":
    raise SystemExit(main())
