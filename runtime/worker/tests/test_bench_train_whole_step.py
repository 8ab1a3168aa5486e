"""Issue 42 (item 7): TorchTPU's compile guide says to compile the whole training step with a
capturable optimizer. work "train_step" measures that ("compile_step") beside the split it had
("compile": model and loss compiled, the optimizer eager), each its own configuration."""

from __future__ import annotations

import pytest
import torch

from conftest import bench_args
from tpu_worker.bench import train_step
from tpu_worker.ops import OpContext


@pytest.fixture
def aot_eager(monkeypatch):
    # AOTAutograd's graphs without inductor's C++ build: the same graphs, fast to make.
    monkeypatch.setenv("TPU_WORKER_COMPILE_BACKEND", "aot_eager")


def test_the_whole_step_trains_as_the_split_one_and_both_are_reported(worker, aot_eager):
    worker.handle("load", {"model": "tiny-gpt2"}, [], OpContext("load"))
    args = bench_args(
        model="tiny-gpt2",
        work="train_step",
        optimizer="adamw",
        batch_sizes=[2],
        seq_lens=[8],
        modes=["compile", train_step.WHOLE_STEP],
        warmup=1,
        iterations=3,
    )
    r = worker.handle("benchmark", args, [], OpContext("t"))[0]
    split, whole = r["configs"]
    assert (split["mode"], whole["mode"]) == ("compile", "compile_step")
    for c in (split, whole):
        assert c["error"] is None, c
        assert c["compile_backend"] == "aot_eager" and c["graphs_compiled"] >= 1
        assert c["train_steps"] == 4  # the compiling step and the window
    assert split["compile_scope"].startswith("model and loss") and split["optimizer_capturable"] is False
    assert whole["compile_scope"].startswith("whole step") and whole["optimizer_capturable"] is True
    # The same seed, weights and batch: the whole step's losses are the split step's.
    assert whole["loss_curve"]["values"] == pytest.approx(split["loss_curve"]["values"], abs=1e-5)
    assert whole["loss_final"] != whole["loss_first"]  # it did train
    assert r["manifest"]["compile_backend"] == "aot_eager"


def test_the_whole_step_captures_the_optimizer_inside_the_graph(worker, aot_eager):
    """The capturable AdamW's step count stays a tensor on the device; the update ran compiled."""
    worker.handle("load", {"model": "mnist-cnn"}, [], OpContext("load"))
    adapter = worker.served["mnist-cnn"].adapter
    trainer = train_step.Trainer(adapter, "float32", train_step.WHOLE_STEP, "adamw")
    batch = train_step.planned_batch(adapter, 2, None, 0).batch
    before = [p.detach().clone() for p in trainer.params]
    loss = trainer.step(batch)
    assert torch.isfinite(loss)
    state = trainer.optimizer.state[trainer.params[0]]
    assert trainer.optimizer.defaults["capturable"] is True
    assert isinstance(state["step"], torch.Tensor) and state["step"].device == trainer.params[0].device
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, trainer.params, strict=True))


def test_a_whole_step_outside_train_step_is_refused(shared_worker):
    from tpu_worker.errors import WorkerError

    with pytest.raises(WorkerError) as e:
        shared_worker.handle("benchmark", bench_args(modes=["compile_step"]), [], OpContext("t"))
    assert "'compile_step' not allowed; use eager, compile" in e.value.message
