"""The benchmark's work "train_step": its float32 loss is a plain PyTorch training loop's, the
served model is never trained, and the report's figures say what they measured."""

from __future__ import annotations

import copy
import hashlib

import pytest
import torch

from conftest import bench_args
from tpu_worker.bench import train_step
from tpu_worker.bench.train_step import OPTIMIZER_SETTINGS
from tpu_worker.ops import OpContext


def train(worker, **args):
    base = {"work": "train_step", "optimizer": "adamw", "warmup": 1, "iterations": 3}
    return worker.handle("benchmark", bench_args(**{**base, **args}), [], OpContext("t"))[0]


def weights_digest(module: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def plain_loop(model: torch.nn.Module, task: str, batch: dict, optimizer: str, steps: int) -> float:
    """What a reader would write by hand: the same copy, loss, optimizer and steps; the last loss."""
    model = copy.deepcopy(model).float().eval()
    s = OPTIMIZER_SETTINGS[optimizer]
    opt = (
        torch.optim.AdamW(model.parameters(), **s) if optimizer == "adamw" else torch.optim.SGD(model.parameters(), **s)
    )
    loss = None
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        if task == "text-generation":
            ids = batch["input_ids"]
            logits = model(input_ids=ids, use_cache=False).logits
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)
            )
        elif task == "embedding":
            hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).float()
            emb = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=1)
            loss = torch.nn.functional.mse_loss(emb, batch["target"])
        else:
            loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["labels"])
        loss.backward()
        opt.step()
    return float(loss.detach())


@pytest.mark.parametrize(
    ("model", "optimizer", "batch", "seq"),
    [
        ("tiny-gpt2", "adamw", 2, 16),
        ("all-minilm-l6-v2", "sgd", 2, 16),
        ("mnist-cnn", "adamw", 2, None),
        ("mnist-cnn", "sgd", 2, None),
        # Off the plan's buckets: the step runs padded to (4, 32) or 4 rows, the loss unpadded.
        ("tiny-gpt2", "adamw", 3, 20),
        ("all-minilm-l6-v2", "sgd", 3, 20),
        ("mnist-cnn", "adamw", 3, None),
    ],
)
def test_the_fp32_loss_after_n_steps_is_a_plain_pytorch_loops(shared_worker, model, optimizer, batch, seq):
    r = train(shared_worker, model=model, optimizer=optimizer, batch_sizes=[batch], seq_lens=[seq] if seq else None)
    (c,) = r["configs"]
    assert c["error"] is None, c
    adapter = shared_worker.served[model].adapter
    unpadded = train_step.synthetic_batch(adapter, batch, seq, 0)
    expected = plain_loop(adapter.eager_model, adapter.entry.task, unpadded, optimizer, c["train_steps"])
    assert c["train_steps"] == 1 + 3  # warmup + the window
    assert abs(c["loss_final"] - expected) <= 1e-5, (c["loss_final"], expected)
    assert c["loss_final"] != c["loss_first"]  # the steps did train the copy
    # It ran at the plan's buckets, and says how much of that was padding.
    bucket = adapter.plan.batch(batch)
    length = adapter.plan.length(seq) if seq else 0
    assert c["shape_report"]["shapes"] == [["train_step", bucket, length]]
    real, padded = batch * (seq or 1), bucket * (length or 1)
    assert c["shape_report"]["padding_waste"] == pytest.approx(1 - real / padded, abs=1e-4)
    per_s = real / (c["latency_ms"]["mean"] / 1000)  # real tokens, not padded ones
    assert c["tokens_per_s"] is None or c["tokens_per_s"] == pytest.approx(per_s, rel=1e-3)


def test_the_served_model_is_unchanged_after_a_train_step_benchmark(shared_worker):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    before = weights_digest(adapter.eager_model)
    r = train(shared_worker, model="tiny-gpt2", batch_sizes=[2], seq_lens=[8], optimizer="sgd")
    assert r["configs"][0]["error"] is None and r["configs"][0]["loss_final"] != r["configs"][0]["loss_first"]
    assert weights_digest(adapter.eager_model) == before


def test_a_report_says_what_it_measured(shared_worker):
    r = train(shared_worker, model="tiny-gpt2", batch_sizes=[2], seq_lens=[8], dtypes=["float32", "bfloat16"])
    m = r["manifest"]
    assert m["work"] == "train_step" and m["optimizer"]["name"] == "adamw" and m["optimizer"]["lr"] == 1e-4
    assert m["train"]["loss"].startswith("causal LM cross-entropy")
    fp32, bf16 = r["configs"]
    for c in (fp32, bf16):
        lat = c["latency_ms"]
        assert lat["min"] <= lat["p50"] <= lat["p99"] <= lat["max"]
        assert c["throughput_items_per_s"] == pytest.approx(2 / (lat["mean"] / 1000), rel=1e-3)
        assert c["tokens_per_s"] == pytest.approx(2 * 8 / (lat["mean"] / 1000), rel=1e-3)
        split = c["memory_split"]
        params = shared_worker.served["tiny-gpt2"].adapter.parameters()
        assert 4 * params <= split["weights_bytes"] < 6 * params  # float32 weights (and buffers)
        assert split["gradients_bytes"] > 0 and split["optimizer_state_bytes"] >= 2 * split["gradients_bytes"]
        # Forward + backward, counted: about three forwards (the backward of a matmul is two).
        assert 2.5 <= c["flops_per_step"] / c["forward_flops_per_step"] <= 3.5
        assert c["fraction_of_peak"] is None or 0 < c["fraction_of_peak"] <= 1
        assert c["stability"]["iterations_requested"] == 3
        assert len(c["loss_curve"]["values"]) == c["train_steps"]
    assert "loss_drift_vs_fp32" not in fp32
    drift = bf16["loss_drift_vs_fp32"]
    assert drift["steps"] == 4 and 0 < drift["max_abs"] < 0.5  # bf16 strays, a little


def test_a_fraction_of_peak_above_one_is_flagged_not_printed(shared_worker, monkeypatch):
    from tpu_worker.bench import train_bench

    monkeypatch.setattr(train_bench.flops, "peak_flops", lambda *a: (1.0, "a test's peak of 1 FLOP/s"))
    (c,) = train(shared_worker, batch_sizes=[2])["configs"]
    assert c["fraction_of_peak"] is None
    assert "exceeds the peak" in c["fraction_of_peak_fault"] and "fault" in c["fraction_of_peak_fault"]


def test_compile_mode_compiles_the_step_apart(worker, monkeypatch):
    # AOTAutograd's forward and backward graphs, without inductor's C++ build: fast.
    monkeypatch.setenv("TPU_WORKER_COMPILE_BACKEND", "aot_eager")
    r = train(worker, batch_sizes=[4], modes=["eager", "compile"], warmup=0)
    eager, compiled = r["configs"]
    assert compiled["compile_backend"] == "aot_eager" and compiled["graphs_compiled"] >= 1
    assert compiled["compile_s"] > 0 and compiled["recompiled"] is False
    assert eager["compile_s"] == 0 and eager["train_steps"] == 3 and compiled["train_steps"] == 4
    # The same steps from the same weights: compiled and eager train alike.
    assert compiled["loss_curve"]["values"][:3] == pytest.approx(eager["loss_curve"]["values"], abs=1e-5)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"optimizer": "lamb"}, "args.optimizer must be one of adamw, sgd"),
        ({"optimizer": None}, "args.optimizer is required"),
        ({"dtypes": ["float16"]}, "'float16' not allowed; use float32, bfloat16"),
        ({"scenario": "offline"}, "single-stream scenario only"),
    ],
)
def test_bad_train_step_requests_are_refused_in_words(shared_worker, args, words):
    from tpu_worker.errors import WorkerError

    with pytest.raises(WorkerError) as e:
        train(shared_worker, **args)
    assert words in e.value.message


def test_an_optimizer_outside_train_step_is_refused(shared_worker):
    from tpu_worker.errors import WorkerError

    with pytest.raises(WorkerError, match="only work 'train_step' takes an optimizer"):
        shared_worker.handle("benchmark", bench_args(optimizer="sgd"), [], OpContext("t"))


def test_status_gives_a_weights_checksum_only_when_asked(shared_worker):
    from tpu_worker.errors import WorkerError

    def rows(args):
        return {r["model"]: r for r in shared_worker.handle("status", args, [], OpContext("s"))[0]["loaded"]}

    assert "weights_checksum" not in rows({})["mnist-cnn"]
    first, again = rows({"weights_checksum": True}), rows({"weights_checksum": True})
    assert first["mnist-cnn"]["weights_checksum"].startswith("sha256:")
    assert first["mnist-cnn"]["weights_checksum"] == again["mnist-cnn"]["weights_checksum"]
    assert first["mnist-cnn"]["weights_checksum"] != first["tiny-gpt2"]["weights_checksum"]
    with pytest.raises(WorkerError, match="weights_checksum must be true or false"):
        rows({"weights_checksum": "yes"})


def _cancel_after(monkeypatch, token, steps: int, reason: str):
    """Cancels `token` with `reason` once the training copy has taken `steps` steps."""
    real = train_step.Trainer.step
    taken = {"n": 0}

    def step(self, batch):
        taken["n"] += 1
        if taken["n"] == steps:
            token.cancel(reason)
        return real(self, batch)

    monkeypatch.setattr(train_step.Trainer, "step", step)
    return taken


def test_a_cancel_ends_the_grid_at_the_next_step(shared_worker, monkeypatch):
    ctx = OpContext("c")
    taken = _cancel_after(monkeypatch, ctx.token, 3, "cancelled")
    args = bench_args(work="train_step", optimizer="sgd", batch_sizes=[1, 2], iterations=50, warmup=1)
    r = shared_worker.handle("benchmark", args, [], ctx)[0]
    assert r["cancelled"] is True and "stopped" not in r
    assert r["configs"] == [] and taken["n"] == 3  # no step after the one that saw the cancel


def test_a_budget_stop_keeps_the_steps_measured(shared_worker, monkeypatch):
    ctx = OpContext("b")
    _cancel_after(monkeypatch, ctx.token, 4, "budget")
    args = bench_args(work="train_step", optimizer="sgd", batch_sizes=[1, 2], iterations=50, warmup=1)
    r = shared_worker.handle("benchmark", args, [], ctx)[0]
    assert r["stopped"] == "budget" and r["cancelled"] is False
    (c,) = r["configs"]  # the grid ended with the configuration in progress
    assert c["batch"] == 1 and c["iterations"] == 3 and c["train_steps"] == 4 and c["error"] is None
