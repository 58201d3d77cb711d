"""The loop's options, each checked against what it must equal."""

from __future__ import annotations

import pytest
import torch
from conftest import compose
from smoke.classification import TINY_IMAGENET

from src.engine import train
from src.engine.loop.numerics import flush_denormals, flushing_denormals, run_autocast
from src.engine.loop.trainer import Trainer
from src.engine.record.files import read_metrics


def losses(run_dir) -> list[float]:
    rows = read_metrics(run_dir)
    return [r["train/loss"] for r in rows if r["split"] == "train"]


def run(tmp_path, name, *overrides):
    cfg = compose(
        ["trainer.log_every=1", "trainer.monitor_every=0", "trainer.val_every=0", *overrides], tmp_path
    )
    summary = train(cfg, tmp_path / name)
    return summary, tmp_path / name


def test_accumulating_two_half_batches_equals_one_full_batch(tmp_path):
    _, whole = run(tmp_path, "whole", "trainer.max_steps=10", "task.batch_size=32")
    _, halves = run(tmp_path, "halves", "trainer.max_steps=10", "task.batch_size=16", "trainer.accumulate=2")
    torch.testing.assert_close(
        torch.tensor(losses(halves)), torch.tensor(losses(whole)), rtol=1e-5, atol=1e-6
    )


#: The first 5 losses of the default run, and with half batches accumulated, as the code before the
#: global batch (task.batch_size per process; commit 0573edb) trained them on one CPU thread, on the
#: two-way digits split of then (``task.test_fraction=null``: 1,437 training images).
PER_PROCESS_CODE = {
    (): [2.3433120250701904, 2.2777762413024902, 2.3434247970581055, 2.299839496612549, 2.406007766723633],
    ("task.batch_size=16", "trainer.accumulate=2"): [
        2.3288183212280273,
        2.3575398921966553,
        2.317969799041748,
        2.3892579078674316,
        2.30043625831604,
    ],
}


@pytest.mark.parametrize(
    "overrides, batch, steps_per_epoch",
    [
        ((), "batch 64 = 1 process × 64", 22),
        (("task.batch_size=16", "trainer.accumulate=2"), "batch 32 = 1 process × 16 × 2 accumulated", 44),
    ],
)
def test_one_process_trains_as_the_per_process_code_did(tmp_path, caplog, overrides, batch, steps_per_epoch):
    """The global batch changes nothing for one process: the same batches, the same losses (equal
    here to the bit; the tolerance is for another CPU's kernels), the same epoch; the start line
    states the batch."""
    with caplog.at_level("INFO", logger="src.run"):
        summary, run_dir = run(
            tmp_path,
            "one",
            "trainer.max_steps=5",
            "trainer.device=cpu",
            "trainer.threads=1",
            "task.test_fraction=null",
            *overrides,
        )
    torch.testing.assert_close(
        torch.tensor(losses(run_dir)), torch.tensor(PER_PROCESS_CODE[overrides]), rtol=1e-6, atol=0
    )
    assert summary["steps_per_epoch"] == steps_per_epoch
    assert (
        summary["batch"]["per_process"] * summary["batch"]["accumulate"] == summary["batch"]["global_batch"]
    )
    assert any(f"· fresh · {batch} · " in r.getMessage() for r in caplog.records)


def test_the_same_seed_gives_the_same_metrics_and_another_seed_does_not(tmp_path):
    a, _ = run(tmp_path, "a", "trainer.max_steps=20")
    b, _ = run(tmp_path, "b", "trainer.max_steps=20")
    c, _ = run(tmp_path, "c", "trainer.max_steps=20", "seed=1")
    assert a["final"] == b["final"] and a["final"] != c["final"]


def test_ema_bf16_and_workers_on_the_deit_recipe(tmp_path, image_folder):
    summary, run_dir = run(
        tmp_path,
        "ema",
        "task=imagenet",
        *TINY_IMAGENET,
        "backbone=vit_micro",
        f"paths.data_dir={image_folder}",
        "trainer.max_steps=4",
        "trainer.ema=0.9",
        "trainer.precision=bf16",
        "trainer.num_workers=2",
        "trainer.val_every=4",
    )
    assert {"val/acc", "val_ema/acc", "val_ema/loss"} <= set(summary["final"])
    assert all(torch.isfinite(torch.tensor(losses(run_dir))))


def test_workers_change_nothing(tmp_path, image_folder):
    common = [
        "task=imagenet",
        *TINY_IMAGENET,
        "backbone=vit_micro",
        f"paths.data_dir={image_folder}",
        "trainer.max_steps=4",
    ]
    _, main = run(tmp_path, "main", *common, "trainer.num_workers=0")
    _, workers = run(tmp_path, "workers", *common, "trainer.num_workers=2")
    assert losses(main) == losses(workers)


@pytest.mark.slow
@pytest.mark.minutes(0.7)
def test_compiled_model_trains_like_the_eager_one(tmp_path):
    _, eager = run(tmp_path, "eager", "trainer.max_steps=5", "attn=standard")
    _, compiled = run(tmp_path, "compiled", "trainer.max_steps=5", "attn=standard", "trainer.compile=true")
    torch.testing.assert_close(
        torch.tensor(losses(compiled)), torch.tensor(losses(eager)), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_the_runs_autocast_computes_in_its_precision_each_time_it_is_entered(precision, dtype):
    """The trainer and ``python -m src.eval`` share one autocast: a matmul inside it comes out in the
    precision's dtype on every entry (the trainer enters the same object each step), fp32 after."""
    layer, x = torch.nn.Linear(4, 3), torch.randn(2, 4)
    autocast = run_autocast(torch.device("cpu"), precision)
    for _ in range(2):
        with autocast:
            assert layer(x).dtype == dtype  # (2, 3)
        assert layer(x).dtype == torch.float32


def test_a_cpu_run_flushes_denormals_unless_told_not_and_restores_the_mode_after(tmp_path, monkeypatch):
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals (torch.set_flush_denormal needs x86 SSE3)")
    torch.set_flush_denormal(False)
    seen, fit = [], Trainer.fit
    monkeypatch.setattr(Trainer, "fit", lambda self: seen.append(flushing_denormals()) or fit(self))
    run(tmp_path, "flushed", "trainer.max_steps=1")
    assert not flushing_denormals()
    run(tmp_path, "kept", "trainer.max_steps=1", "trainer.flush_denormal=false")
    previous = flush_denormals(True)
    run(tmp_path, "kept_while_flushing", "trainer.max_steps=1", "trainer.flush_denormal=false")
    restored = flushing_denormals()
    flush_denormals(previous)
    assert restored
    assert seen == [True, False, False]


@pytest.mark.parametrize("device, inside", [("cuda", ("high", True)), ("cpu", ("highest", False))])
def test_tf32_is_on_where_a_run_takes_a_cuda_device_and_restored_after(tmp_path, monkeypatch, device, inside):
    """Where the run picks its device (``processes``, as training and ``python -m src.eval`` do): a
    CUDA device gets TF32 matmuls and convolutions (the device stubbed: no GPU is touched); a CPU
    leaves the switches as they were; both are put back after the run."""
    from src.engine.distributed import Dist
    from src.engine.experiment import processes

    monkeypatch.setattr(Dist, "setup", classmethod(lambda cls, _: cls(0, 1, torch.device(device))))
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    try:
        with processes(compose([], tmp_path)) as dist:
            assert dist.device.type == device
            assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == inside
        assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == ("highest", False)
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.allow_tf32 = before[1]


def test_a_finished_run_leaves_no_model_behind_for_the_next_run_of_the_process(tmp_path):
    """A local multirun, the bench and the sweep tests train many runs in one process: each run's
    model (held in reference cycles) must be freed when it ends, not when the collector next runs."""
    import gc

    from timm.models.vision_transformer import VisionTransformer

    gc.collect()
    gc.disable()
    try:
        for name in ("a", "b"):
            cfg = compose(["trainer.max_steps=2", "trainer.val_every=2", "trainer.monitor_every=2"], tmp_path)
            train(cfg, tmp_path / name)
        alive = [o for o in gc.get_objects() if isinstance(o, VisionTransformer)]
    finally:
        gc.enable()
    assert alive == []


def test_the_validation_at_start_is_the_initial_weights_and_leaves_training_as_it_was(tmp_path):
    """``trainer.val_at_start``: a val row at step 0 equal to the initial model's own evaluation;
    with drop path drawing from the RNG during training, the losses are the same to the bit with
    it and without (the validation's loader draws its seed from the global generator: restored)."""
    from src.engine.distributed import Dist
    from src.engine.loop import evaluation
    from src.engine.loop.prepared import prepared

    steps = ("trainer.max_steps=6", "trainer.val_every=3", "+backbone.model.drop_path_rate=0.2")
    _, with_it = run(tmp_path, "with", *steps, "trainer.val_at_start=true")
    _, without = run(tmp_path, "without", *steps, "trainer.val_at_start=false")
    assert losses(with_it) == losses(without)
    rows = {d: [r for r in read_metrics(d) if r["split"] == "val"] for d in (with_it, without)}
    assert [r["step"] for r in rows[with_it]] == [0, 3, 6] and [r["step"] for r in rows[without]] == [3, 6]
    assert rows[with_it][1:] == rows[without]
    task, (_, val_set), model = prepared(compose(["+backbone.model.drop_path_rate=0.2"], tmp_path))
    metrics, _ = evaluation.evaluate(task, model, val_set, Dist(), run_autocast(torch.device("cpu"), "fp32"))
    assert {k: rows[with_it][0][k] for k in metrics} == metrics
