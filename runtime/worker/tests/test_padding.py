"""Every forward at the shape plan's buckets: embeddings, tensor models, the check and the
benchmark pad a request's batch (and length) up to a bucket, drop the padding from the answer,
and the answer is the unpadded one. Status, the check and the benchmark report the padding."""

from __future__ import annotations

import contextlib

import pytest
import torch

from conftest import bench_args
from tpu_worker.adapters.text import pooled_embedding
from tpu_worker.errors import WorkerError
from tpu_worker.ops import OpContext
from tpu_worker.shapes import ShapeCounter


def call(w, op, args, tensors=None):
    return w.handle(op, args, tensors or [], OpContext(op))


def served(w, model):
    return w.served[model].adapter


@contextlib.contextmanager
def forward_shapes(module):
    """The shapes of the first input (or input_ids) of every forward `module` runs in the block."""
    seen: list[tuple] = []

    def hook(_, args, kwargs):
        x = args[0] if args else kwargs.get("input_ids")
        seen.append(tuple(x.shape))

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def row(w, model):
    return next(m for m in call(w, "status", {})[0]["loaded"] if m["model"] == model)


def test_embeddings_pad_to_the_plan_and_answer_as_unpadded(worker):
    call(worker, "load", {"model": "all-minilm-l6-v2"})
    texts = ["a short one", "a somewhat longer sentence than the first", "three"]
    a = served(worker, "all-minilm-l6-v2")
    with forward_shapes(a.eager_model) as ran:
        result, (emb,) = call(worker, "infer", {"model": "all-minilm-l6-v2", "texts": texts})
    assert ran == [(4, result["seq_bucket"])]  # the model itself saw the bucket
    assert result["seq_bucket"] in a.plan.lengths and emb.shape == (3, 384)
    # Unpadded: each text alone at its own length, no pad token anywhere.
    for i, t in enumerate(texts):
        ids = torch.tensor([a.tokenizer.encode(t).ids])
        with torch.no_grad():
            alone = pooled_embedding(a.eager_model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)})
        torch.testing.assert_close(emb[i : i + 1], alone, atol=1e-5, rtol=1e-4)
    shapes = row(worker, "all-minilm-l6-v2")["shapes"]
    (seen,) = shapes["shapes"]
    assert (seen["batch"], seen["length"]) == (4, result["seq_bucket"])  # 3 texts: batch bucket 4
    real = sum(len(a.tokenizer.encode(t).ids) for t in texts)
    assert shapes["real_tokens"] == real and shapes["padded_tokens"] == 4 * result["seq_bucket"]
    assert shapes["padding_waste"] == pytest.approx(1 - real / (4 * result["seq_bucket"]), abs=1e-4)


def test_tensor_models_pad_the_batch_and_drop_the_padded_rows(worker):
    call(worker, "load", {"model": "mnist-cnn"})
    x = torch.randn(5, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    with forward_shapes(served(worker, "mnist-cnn").eager_model) as ran:
        _, (logits,) = call(worker, "infer", {"model": "mnist-cnn"}, [x])
    assert ran == [(8, 1, 28, 28)]
    with torch.no_grad():
        alone = served(worker, "mnist-cnn").eager_model(x)
    assert logits.shape == (5, 10)
    torch.testing.assert_close(logits, alone, atol=1e-5, rtol=1e-4)
    r = row(worker, "mnist-cnn")
    assert r["shape_plan"]["batch_buckets"] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert [(s["batch"], s["length"]) for s in r["shapes"]["shapes"]] == [(8, 0)]
    assert r["shapes"]["real_to_padded"] == pytest.approx(5 / 8)


def test_a_batch_above_the_largest_bucket_is_refused_with_the_limit_and_what_to_do(worker):
    call(worker, "load", {"model": "mnist-cnn"})
    with pytest.raises(WorkerError) as e:
        call(worker, "infer", {"model": "mnist-cnn"}, [torch.zeros(257, 1, 28, 28)])
    assert "max_batch of 256" in e.value.message and "split it into requests of at most 256" in e.value.message


@pytest.mark.parametrize("model,batch,seq", [("tiny-gpt2", 3, 13), ("all-minilm-l6-v2", 5, 20), ("mnist-cnn", 3, None)])
def test_a_planned_forward_equals_the_unpadded_one(shared_worker, model, batch, seq):
    a = served(shared_worker, model)
    inputs = a.example(batch, seq, seed=3)
    counter = ShapeCounter()
    with torch.no_grad():
        with forward_shapes(a.eager_model) as ran:
            padded = a.forward_planned(inputs, counter)
        assert ran[0][0] == a.plan.batch(batch) and ran[0][1:2] == ((a.plan.length(seq),) if seq else (1,))
        plain = a.forward_example(inputs)
    assert padded.shape == plain.shape
    torch.testing.assert_close(padded, plain, atol=1e-5, rtol=1e-4)
    ((kind, b, n),) = counter.seen
    assert kind == "forward" and b == a.plan.batch(batch) and b > batch
    assert n == (a.plan.length(seq) if seq else 0)


def test_the_check_runs_at_the_bucket_and_reports_it(shared_worker):
    with forward_shapes(served(shared_worker, "mnist-cnn").eager_model) as ran:
        r = call(shared_worker, "check", {"model": "mnist-cnn", "batch": 3})[0]
    assert ran == [(4, 1, 28, 28)] and r["output_shape"] == [3, 10]
    rep = r["shape_report"]
    assert rep["distinct_shapes"] == 1 and rep["shapes"] == [[4, 0]]
    assert rep["padding_waste"] == pytest.approx(0.25)
    t = call(shared_worker, "check", {"model": "tiny-gpt2", "batch": 2, "seq_len": 20})[0]
    assert t["output_shape"][:2] == [2, 20] and t["shape_report"]["shapes"] == [[2, 32]]


def test_a_benchmark_reports_each_configurations_shapes_and_padding(shared_worker):
    r = call(shared_worker, "benchmark", bench_args(batch_sizes=[3, 4], iterations=3))[0]
    three, four = r["configs"]
    assert three["error"] is None and three["shape_report"]["shapes"] == [["forward", 4, 0]]
    assert three["shape_report"]["distinct_shapes"] == 1
    assert three["shape_report"]["padding_waste"] == pytest.approx(0.25)
    assert four["shape_report"]["padding_waste"] == 0
    # The padded output compares with the float32 reference as the unpadded one would.
    assert three["max_abs_error_vs_fp32"] == 0
    g = call(
        shared_worker,
        "benchmark",
        bench_args(model="tiny-gpt2", batch_sizes=[3], seq_lens=[10], work="generate", max_new_tokens=3, iterations=2),
    )[0]
    (c,) = g["configs"]
    kinds = {s[0] for s in c["shape_report"]["shapes"]}
    assert c["error"] is None and kinds == {"prefill", "decode"}
    assert 0 < c["shape_report"]["padding_waste"] < 1


def test_describe_reports_the_plan_each_load_warms(shared_worker):
    """describe's plan_shapes (what the server's estimator prices a compiled load by,
    tools/support/estimate.ts) is the loaded adapter's own plan, shape for shape, for every kind
    of model; there is no other copy of the plan."""
    from tpu_worker.ops import OpContext

    result, _ = shared_worker.handle("describe", {}, [], OpContext("d"))
    described = {m["id"]: m for m in result["models"]}
    for model in ("all-minilm-l6-v2", "tiny-gpt2", "tiny-chat", "mnist-cnn"):
        plan = served(shared_worker, model).plan
        got = [(s["kind"], s["batch"], s["length"]) for s in described[model]["plan_shapes"]]
        assert got == plan.forward_shapes() and len(got) == plan.size > 0, model
