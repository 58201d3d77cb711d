"""Seeds trained at once (src/sandbox/seeds.py) train as their own runs would, and the success
curve counts the seeds that never learn."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from conftest import SMALL_MODADD, compose
from omegaconf import OmegaConf
from scipy.stats import binomtest

from launch.analysis.seed_sets import P5_SAYS, compare
from src.engine import train
from src.engine.record import checkpoint
from src.engine.record.files import read_metrics
from src.errors import ConfigError
from src.sandbox.curves import Curves, first_success, seed_table, success_by_epoch
from src.sandbox.seeds import parse_seeds, train_seeds

SMALL = [
    *SMALL_MODADD,
    "trainer.max_steps=null",
    "trainer.max_epochs=3",
    "trainer.val_every=24",
    "trainer.monitor_every=0",
    "trainer.checkpoint_every=24",
]


def discounted(r: float) -> list[str]:
    """The overrides that give modadd P5's feed-forward discount ``r``, by the hook that
    experiment=paper/p5_mlp_lr names."""
    hook = "src.sandbox.param_groups.mlp_lr_discount"
    return [
        f"+optim.param_groups._target_={hook}",
        "+optim.param_groups._partial_=true",
        f"+optim.mlp_lr_discount={r}",
    ]


@pytest.mark.parametrize(
    "model",
    [["attn=precond", *discounted(10)], ["backbone=sandbox_multihead", "attn=spectral"]],
    ids=["sandbox", "multihead"],
)
def test_a_seed_trained_with_others_ends_on_its_own_runs_weights(tmp_path, model):
    """Seed 3 beside seed 1 ends 3 epochs (24 Adam steps) on the weights and the accuracy of the
    run ``seed=3`` through the shared loop: same init, same data, same batch order, own gradient
    (and, on the reference, the same feed-forward learning rate discount).
    (Not bit-identical: the run takes torch's fused attention, the stack the explicit softmax.)"""
    overrides = [*SMALL, *model]
    run_dir = tmp_path / "run"
    train(compose([*overrides, "seed=3"], tmp_path), run_dir)
    alone = checkpoint.load(run_dir / "checkpoints" / "last.pt")["model"]

    curves, stacked = train_seeds(compose(overrides, tmp_path), [1, 3], epochs=3)

    assert set(stacked) <= set(alone)
    moved = 0
    for name, value in stacked.items():
        torch.testing.assert_close(value[1], alone[name], rtol=1e-4, atol=1e-5, msg=name)
        moved += not torch.allclose(value[0], value[1])  # seed 1 is another model
    assert moved > 0
    final = [r for r in read_metrics(run_dir) if r.get("split") == "val"][-1]
    assert curves.acc[1][-1] == pytest.approx(final["val/acc"], abs=1 / 128)


def test_success_counts_the_seeds_that_never_learn():
    """Two of four seeds learn (epochs 3 and 5), two never: the curve ends at one half, not one."""
    acc = [
        [0.5, 0.6, 0.96, 0.97, 1.0, 1.0],
        [0.5, 0.5, 0.5, 0.7, 0.95, 1.0],
        [0.5] * 6,
        [0.5, 0.5, 0.94, 0.94, 0.94, 0.94],  # close, never there
    ]
    curves = Curves(seeds=[0, 1, 2, 3], overrides=[], epochs=6, steps_per_epoch=64, test_size=2048, acc=acc)
    assert success_by_epoch(curves) == [0, 0, 0.25, 0.25, 0.5, 0.5]
    assert [first_success(a) for a in acc] == [3, 5, None, None]
    assert [r["first_success"] for r in seed_table(curves)] == [3, 5, None, None]


def test_the_seed_table_reads_stages_at_every_fifth_epoch_and_censors_the_never_learners():
    """A seed at chance to epoch 30 then at 100%, and one at chance throughout, 60 epochs."""
    curves = curves_learning_at([31, None], total=60)
    learned, never = seed_table(curves)
    assert (learned["plateaus"], learned["rises"], learned["censored"]) == (2, 1, False)
    assert 25 <= learned["first_plateau"] <= 30  # the last point at chance, on the 5-epoch grid
    assert (never["plateaus"], never["rises"], never["censored"]) == (1, 0, True)
    assert never["first_plateau"] == 60  # at least the run: censored, not dropped


def test_it_refuses_what_would_train_the_seeds_differently(tmp_path):
    cfg = compose([*SMALL, "optim.weight_decay=0.05", "trainer.clip_grad=1.0"], tmp_path)
    with pytest.raises(ConfigError, match=r"weight_decay=0.05.*clip_grad=1.0.*python -m src.run -m"):
        train_seeds(cfg, [0], epochs=1)


def test_a_variant_the_backbone_does_not_take_is_one_error_line(tmp_path, capsys):
    """The reference sandbox has no W_V for cond_init: refused before anything is written."""
    from src.sandbox.seeds import main

    out = tmp_path / "set"
    args = ["experiment=paper/p5", "reading=cond_init_per_head", "--epochs", "1", "--out", str(out)]
    assert main(args) == 2
    assert "error: attn=cond_init does not apply to backbone=sandbox" in capsys.readouterr().err
    assert not out.exists()


def test_seed_lists_and_ranges():
    assert parse_seeds("0-3") == [0, 1, 2, 3]
    assert parse_seeds("0,3,7") == [0, 3, 7]
    assert parse_seeds("5,10-11") == [5, 10, 11]
    with pytest.raises(ConfigError, match="0-31"):
        parse_seeds("a-b")


def curves_learning_at(epochs: list[int | None], total: int = 20) -> Curves:
    """Seeds that reach 100% at the given epochs (None: never), at chance before."""
    acc = [[1.0 if e is not None and i + 1 >= e else 0.5 for i in range(total)] for e in epochs]
    return Curves(list(range(len(epochs))), [], total, 64, 2048, acc)


def test_the_paired_comparison_counts_censored_seeds_and_adjusts_over_the_sets():
    base = curves_learning_at([10, 10, 12, None, None, 15, 10, None])
    every_seed_sooner = curves_learning_at([5, 6, 7, 9, 12, 8, 4, 19])  # 8 of 8 first: p = 1/256
    six_of_eight = curves_learning_at([5, 6, 7, None, None, 8, 11, None])  # 4 first, 1 later, 3 ties
    rows = compare({"standard": base, "a": every_seed_sooner, "b": six_of_eight}, "standard")
    assert [r.learned for r in rows] == [5, 8, 5]
    assert rows[0].p_faster is None and rows[0].median.censored == 3
    assert rows[0].median.steps == 12  # KM over 10, 10, 10, 12, 15 and three censored at 20
    a, b = rows[1], rows[2]
    assert (a.faster, a.slower) == (8, 0) and a.p_faster == pytest.approx(1 / 256)
    assert (a.verdict, a.adjusted) == ("faster", "faster")
    assert (b.faster, b.slower) == (4, 1) and (b.verdict, b.adjusted) == ("inconclusive", "inconclusive")
    assert (rows[0].low, rows[0].high) == pytest.approx(tuple(binomtest(5, 8).proportion_ci(method="exact")))


def test_sets_with_other_seeds_are_refused_not_paired():
    with pytest.raises(ConfigError, match="same seeds and epochs"):
        compare({"a": curves_learning_at([1, 2]), "b": curves_learning_at([1, 2, 3])}, "a")


def test_a_common_budget_reads_every_set_to_the_same_epoch():
    """Truncated to epoch 12, a seed that learned at 15 has not learned: censored there."""
    base = curves_learning_at([10, 15, None]).truncated(12)
    assert base.epochs == 12 and all(len(a) == 12 for a in base.acc)
    assert [r.learned for r in compare({"b": base}, "b")] == [1]
    with pytest.raises(ConfigError, match="trained 20 epochs"):
        curves_learning_at([1]).truncated(21)


def test_the_report_pairs_seed_sets_by_backbone_with_their_standard(tmp_path):
    """``python -m launch.analysis.report`` on a folder of seed sets only: one section per backbone, the
    variant paired with standard, a set of other epochs listed as not paired, a figure each."""
    from launch.analysis.report import main as report

    sets = {
        "standard": (curves_learning_at([10, 10, 12, None, None, 15, 10, None]), []),
        "cond_init": (curves_learning_at([5, 6, 7, 9, 12, 8, 4, 19]), ["attn=cond_init"]),
        "short": (curves_learning_at([5, 6], total=10), ["attn=precond"]),
    }
    for name, (curves, overrides) in sets.items():
        (tmp_path / name).mkdir()
        curves.overrides = ["experiment=paper/p5", *overrides]
        curves.save(tmp_path / name / "curves.json")
    assert report([str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "### `sandbox`" in text
    assert "| `attn=cond_init` (8) | 8 of 8" in text and "faster / faster" in text
    assert "Not paired with" in text and "short` (2 seeds × 10 epochs)" in text
    # P5's claims from the sets: cond_init learned first in 8 of 8 (launch/analysis/seed_verdicts.py)
    assert "| `P5-cond_init` | `sandbox` |" in text and "| 8 | 1.00 [0.63, 1.00] | reproduced |" in text
    assert (tmp_path / "report" / "p5_success_sandbox.png").stat().st_size > 1000


def test_the_feed_forward_discount_divides_its_learning_rate_and_keeps_timms_weight_decay_rule(tmp_path):
    """P5's ``mlp_lr_discount``: every parameter under an ``mlp`` module at lr / r, the rest at lr;
    biases and other 1-D parameters without weight decay, as timm's own groups; stacked names too."""
    from hydra.utils import instantiate

    from src.engine.loop.optim import build_optimizer
    from src.sandbox.param_groups import is_feed_forward

    overrides = ["task=modadd", "backbone=sandbox_multihead", *discounted(4), "optim.weight_decay=0.1"]
    cfg = compose(overrides, tmp_path)
    model = instantiate(cfg.backbone.model)
    optimizer = build_optimizer(cfg.optim, model)
    by_param = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        group = by_param[id(p)]
        assert group["lr"] == pytest.approx(3e-3 / 4 if ".mlp." in name else 3e-3), name
        assert group["weight_decay"] == (0.1 if p.ndim > 1 else 0.0), name
    assert sum(".mlp." in n for n, _ in model.named_parameters()) > 0
    assert is_feed_forward("blocks__0__mlp__fc1__weight") and not is_feed_forward("mlp_gate")
    with pytest.raises(ConfigError, match="mlp_lr_discount=0"):
        build_optimizer(compose(["task=modadd", *discounted(0)], tmp_path).optim, model)
    no_discount = build_optimizer(compose(["experiment=paper/p5_mlp_lr"], tmp_path).optim, model)
    timms = build_optimizer(compose(["experiment=paper/p5"], tmp_path).optim, model)
    assert [(g["lr"], len(g["params"])) for g in no_discount.param_groups] == [
        (g["lr"], len(g["params"])) for g in timms.param_groups
    ]  # the hook without a discount: timm's own groups


def test_a_sweep_trains_one_set_per_cell_and_the_report_draws_the_grid(tmp_path, capsys):
    """``optim.lr=a,b,c`` gives three sets in folders named by the cell; a second call keeps them
    (and refuses other seeds); the report tabulates the cells against the swept key, and pairs
    a variant with the standard set of its own cell."""
    from launch.analysis.report import main as report
    from src.sandbox.seeds import cells, main

    grid = cells(["experiment=paper/p5", "optim.lr=1e-3,3e-3,1e-2"])
    assert [name for _, name in grid] == ["optim.lr=0.001", "optim.lr=0.003", "optim.lr=0.01"]
    assert cells(["experiment=paper/p5", "optim.lr=3e-3"]) == [
        (["experiment=paper/p5", "optim.lr=0.003"], "")
    ]

    args = [*SMALL[1:], "experiment=paper/p5", "optim.lr=1e-3,3e-3,1e-2", "--seeds", "0-1", "--epochs", "2"]
    assert main([*args, "--out", str(tmp_path / "grid")]) == 0
    assert sorted(p.name for p in (tmp_path / "grid").iterdir()) == [n for _, n in grid]
    assert main([*args, "--out", str(tmp_path / "grid")]) == 0  # kept, not retrained
    assert capsys.readouterr().out.count("trained already, kept") == 3
    assert main([*args[:-3], "0-2", "--epochs", "2", "--out", str(tmp_path / "grid")]) == 2
    variant = [
        *SMALL[1:],
        "experiment=paper/p5",
        "optim.lr=3e-3",
        "attn=precond",
        "--seeds",
        "0-1",
        "--epochs",
        "2",
    ]
    assert main([*variant, "--out", str(tmp_path / "precond")]) == 0

    assert report([str(tmp_path), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "success against `optim.lr`" in text and "| 0.01 | 2 × 2 |" in text
    assert f"`optim.lr`: {P5_SAYS['optim.lr']}." in text  # beside P5's word on the key
    assert (tmp_path / "report" / "p5_grid_sandbox_standard.png").stat().st_size > 1000
    # precond (lr 3e-3) is paired with the standard cell of lr 3e-3, the other cells are the grid's
    assert "attn=precond" in text and "Not paired" not in text


@pytest.mark.parametrize(
    "name, key, count",
    [
        ("lr", "optim.lr", 5),
        ("batch", "task.batch_size", 5),
        ("mlp_lr", "optim.mlp_lr_discount", 5),
        ("ffn_dim", "backbone.model.ffn_dim", 5),
        ("ffn_bias", "backbone.model.ffn_bias", 2),
        ("init", "backbone.model.init_scale", 4),
    ],
)
def test_p5s_ablations_sweep_one_key_at_p5s_recipe(name, key, count):
    """Each experiment=paper/p5_<ablation> is P5's recipe with one key swept: its cells are the
    values, and its last cell composes the recipe with that key's value."""
    from src.configs import compose as compose_cell
    from src.sandbox.seeds import cells

    grid = cells([f"experiment=paper/p5_{name}"])
    assert len(grid) == count and all(n.startswith(f"{key}=") for _, n in grid)
    cfg = compose_cell(grid[-1][0])
    assert str(OmegaConf.select(cfg, key)).lower() == grid[-1][1].split("=", 1)[1].lower()
    assert (cfg.trainer.max_epochs, cfg.optim.opt, cfg.backbone.model.num_embeddings) == (1000, "adam", 3)


def test_a_set_fine_tuned_from_another_starts_on_its_weights_and_refuses_other_seeds(tmp_path, capsys):
    """--init-from: at lr 0 the fine-tuned seeds end bit-identical to the source set's final weights
    (so they started there, not at their own init); the source's final accuracies are recorded; other
    seeds, or weights of another architecture, are one error line and nothing is written."""
    from safetensors.torch import load_file

    from src.sandbox.seeds import main

    base = [*SMALL, "experiment=paper/p5", "task.train_size=256", "task.test_size=128", "trainer.threads=1"]
    source, tuned = tmp_path / "p2", tmp_path / "p3"
    assert main([*base, "--seeds", "0-1", "--epochs", "2", "--out", str(source)]) == 0
    assert main([*base, "task.p=3", "optim.lr=0", "--seeds", "0-1", "--epochs", "1",
                 "--init-from", str(source), "--out", str(tuned)]) == 0  # fmt: skip
    before, after = load_file(source / "weights.safetensors"), load_file(tuned / "weights.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    kept = Curves.load(tuned / "curves.json")
    assert kept.init_from == str(source) and kept.init_acc == [
        a[-1] for a in Curves.load(source / "curves.json").acc
    ]
    capsys.readouterr()
    other = tmp_path / "other"
    assert (
        main([*base, "--seeds", "0-2", "--epochs", "1", "--init-from", str(source), "--out", str(other)]) == 2
    )
    assert "trained seeds [0, 1], not --seeds [0, 1, 2]" in capsys.readouterr().err
    assert main([*base, "backbone=sandbox_multihead", "--seeds", "0-1", "--epochs", "1",
                 "--init-from", str(source), "--out", str(other)]) == 2  # fmt: skip
    assert "not this sandbox's with these seeds" in capsys.readouterr().err
    assert not other.exists()


def test_each_seeds_probe_is_its_own_models_clustering_head(tmp_path):
    """The probes taken on the stacked seeds equal clustering_head of each seed's final weights
    loaded into its own model, on its own first test sequences."""
    from src.sandbox.clustering import clustering_head, last_layer
    from src.sandbox.stacked import build_seed

    cfg = compose([*SMALL, "task.sandbox.probe_size=64"], tmp_path)
    curves, state = train_seeds(cfg, [2, 5], epochs=2, data_dir=tmp_path, probe_every=2)
    assert curves.probe_epochs() == [2] and len(curves.clustering) == 2
    for i, seed in enumerate([2, 5]):
        model, _, (x_test, _) = build_seed(cfg, seed, tmp_path)
        model.load_state_dict({k: v[i] for k, v in state.items()})
        clustering, focus = last_layer(clustering_head(model, x_test[:64], int(cfg.task.k)))
        assert curves.clustering[i][0] == pytest.approx(clustering, abs=1e-6)
        assert curves.focus[i][0] == pytest.approx(focus, abs=1e-6)
        assert 0.0 <= clustering <= 1.0


def test_a_common_budget_cuts_the_probes_with_the_epochs_and_older_sets_still_load(tmp_path):
    curves = curves_learning_at([5, None])
    curves.probe_every, curves.clustering = 5, [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]]
    curves.focus = [list(row) for row in curves.clustering]
    cut = curves.truncated(12)
    assert cut.probe_epochs() == [5, 10] and cut.clustering == [[0.1, 0.2], [0.5, 0.6]]
    assert len(cut.acc[0]) == 12 and cut.focus == cut.clustering
    older = {
        k: v for k, v in vars(curves).items() if k not in ("probe_every", "clustering", "focus", "init_from")
    }
    (tmp_path / "curves.json").write_text(__import__("json").dumps({**older, "init_acc": None}))
    loaded = Curves.load(tmp_path / "curves.json")
    assert loaded.acc == curves.acc and loaded.clustering == [] and loaded.probe_epochs() == []


def test_p5s_own_criterion_counts_only_the_seeds_at_100_percent(tmp_path, capsys):
    """--threshold 1.0 (P5's code): a seed that plateaus at 97% learned at 95%, not at 100%."""
    from launch.analysis.seed_sets import main

    curves = curves_learning_at([5, 8, None])
    curves.acc[1] = [min(a, 0.97) for a in curves.acc[1]]
    (tmp_path / "s").mkdir()
    curves.save(tmp_path / "s" / "curves.json")
    assert main([str(tmp_path / "s")]) == 0
    assert "| 2 of 3 [" in capsys.readouterr().out
    assert main([str(tmp_path / "s"), "--threshold", "1.0"]) == 0
    assert "| 1 of 3 [" in capsys.readouterr().out
    assert main([str(tmp_path / "s"), "--threshold", "95"]) == 2


def test_the_report_draws_the_clustering_heads_only_for_sets_with_probes():
    from pathlib import Path

    from launch.analysis.seed_sets import report_section

    plain = curves_learning_at([5, None])
    probed = curves_learning_at([5, None])
    probed.probe_every, probed.clustering = 5, [[0.2, 0.9, 0.95, 0.95], [0.2, 0.2, 0.3, 0.2]]
    probed.focus = probed.clustering
    assert "p5_clustering_sandbox.png" not in report_section([(Path("a"), plain)])[1]
    lines, pngs = report_section([(Path("b"), probed)])
    assert pngs["p5_clustering_sandbox.png"].startswith(b"\x89PNG")
    assert any("(p5_clustering_sandbox.png)" in line for line in lines)


def test_a_set_stopped_mid_run_resumes_to_the_same_end(tmp_path):
    """Progress saved every 2 epochs; a set stopped after epoch 3 resumes from epoch 2 and ends on
    the weights, curves and probes of an uninterrupted set (Adam's moments restored; the batch
    order is the seed's and the epoch's). Another set's progress file is refused."""

    class Stop(Exception):
        pass

    def stop_at_3(epoch, acc):
        if epoch == 3:
            raise Stop

    cfg = compose(SMALL, tmp_path)
    whole, whole_state = train_seeds(cfg, [0, 4], epochs=5, data_dir=tmp_path, probe_every=1)
    saved = tmp_path / "set" / "progress.pt"
    with pytest.raises(Stop):
        train_seeds(
            cfg,
            [0, 4],
            5,
            data_dir=tmp_path,
            on_epoch=stop_at_3,
            probe_every=1,
            progress=saved,
            progress_every=2,
        )
    assert torch.load(saved, weights_only=True)["epoch"] == 2
    resumed, state = train_seeds(
        cfg, [0, 4], 5, data_dir=tmp_path, probe_every=1, progress=saved, progress_every=2
    )
    assert resumed.acc == whole.acc and resumed.loss == whole.loss and resumed.clustering == whole.clustering
    assert all(torch.equal(state[k], whole_state[k]) for k in whole_state)
    with pytest.raises(ConfigError, match="progress of another set"):
        train_seeds(cfg, [0, 5], 5, data_dir=tmp_path, progress=saved)


def test_sets_trained_apart_join_into_the_set_trained_at_once(tmp_path, capsys):
    """Seeds 4 and 0 trained apart, joined, read as seeds 0 and 4 trained together (each seed's
    curves and probes as its own; float-close: vmap's batch size changes the summation order);
    another recipe or a shared seed is one error line, nothing written."""
    from src.sandbox.join import join, main

    cfg = compose(SMALL, tmp_path)
    together, _ = train_seeds(cfg, [0, 4], epochs=3, data_dir=tmp_path, probe_every=1)
    for seed in (4, 0):
        part, _ = train_seeds(cfg, [seed], epochs=3, data_dir=tmp_path, probe_every=1)
        (tmp_path / f"s{seed}").mkdir()
        part.save(tmp_path / f"s{seed}" / "curves.json")
    assert main([str(tmp_path / "both"), str(tmp_path / "s4"), str(tmp_path / "s0")]) == 0
    joined = Curves.load(tmp_path / "both" / "curves.json")
    assert joined.seeds == [0, 4] and len(joined.probe_epochs()) == 3
    for name in ("acc", "loss", "clustering", "focus"):
        for mine, theirs in zip(getattr(joined, name), getattr(together, name), strict=True):
            assert mine == pytest.approx(theirs, rel=1e-4, abs=1e-6), name
    assert [r["seed"] for r in json.loads((tmp_path / "both" / "seeds.json").read_text())] == [0, 4]

    other = Curves.load(tmp_path / "s0" / "curves.json")
    with pytest.raises(ConfigError, match="differ in epochs"):
        join([other, replace(other, seeds=[9], epochs=2)])
    capsys.readouterr()
    assert main([str(tmp_path / "again"), str(tmp_path / "s0"), str(tmp_path / "both")]) == 2
    assert "seeds [0] are in more than one set" in capsys.readouterr().err
    assert not (tmp_path / "again").exists()
