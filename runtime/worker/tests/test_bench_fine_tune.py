"""The benchmark's work "fine_tune": real text from a catalog dataset (its digest checked),
packed to the shape plan, split train / held-out; float32 and bfloat16 trained in lockstep from
the same weights on the same batches, so a stop leaves every configuration at the same step."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import bench_args
from tpu_worker.bench import fine_tune, text_data
from tpu_worker.catalog import load_catalog
from tpu_worker.errors import WorkerError
from tpu_worker.ops import OpContext, Worker

DATASET = "us-founding-texts"


def tune_args(**args) -> dict:
    base = {
        "model": "tiny-gpt2",
        "work": "fine_tune",
        "dataset": DATASET,
        "steps": 6,
        "eval_every": 2,
        "learning_rate": 1e-3,
        "batch_sizes": [2],
        "seq_lens": [32],
        "dtypes": ["float32", "bfloat16"],
        "iterations": None,
    }
    return bench_args(**{**base, **args})


def test_fine_tunes_on_the_datasets_text_in_both_precisions(shared_worker):
    ctx = OpContext("t")
    r = shared_worker.handle("benchmark", tune_args(), [], ctx)[0]
    assert r["cancelled"] is False and "stopped" not in r
    assert r["manifest"]["dataset"]["id"] == DATASET
    data = r["manifest"]["fine_tune"]["data"]
    assert data["heldout_blocks"] >= 2 and data["train_blocks"] > data["heldout_blocks"]
    fp32, bf16 = r["configs"]
    for c in (fp32, bf16):
        assert c["status"] == "completed" and c["error"] is None, c
        assert c["train_steps"] == 6
        assert [h["step"] for h in c["heldout_loss"]] == [0, 2, 4, 6]
        # tiny-gpt2's weights are random: a few steps on English text lower its held-out loss.
        assert c["heldout_final"] < c["heldout_first"]
        assert c["tokens_per_s"] > 0 and c["memory_split"]["optimizer_state_bytes"] > 0
        # Every parameter has a gradient after the last step; the weights add the buffers.
        assert 0 < c["memory_split"]["gradients_bytes"] <= c["memory_split"]["weights_bytes"]
        assert c["mfu_basis"].startswith("host figure")
    assert bf16["loss_drift_vs_fp32"]["steps"] == 6
    assert bf16["heldout_drift_vs_fp32"]["steps"] == 4
    # The first step's float32 loss is the untouched model's on the dataset's first batch: the
    # text, tokenised by the model's tokenizer and packed, is what was trained on.
    adapter = shared_worker.served["tiny-gpt2"].adapter
    ds = text_data.resolve(shared_worker.catalog.path, DATASET)
    split = text_data.pack_and_split(
        text_data.token_stream(text_data.documents(ds), adapter.tokenizer, adapter.eos_id), 32, 2, DATASET
    )
    ids = fine_tune.batch_at(split.train, 0, 2, adapter.device)["input_ids"]
    with torch.no_grad():
        logits = adapter.eager_model.float()(input_ids=ids, use_cache=False).logits
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    assert abs(fp32["loss_first"] - float(expected)) <= 1e-5


@pytest.mark.parametrize("reason", ["budget", "approval", "cancelled"])
def test_a_stopped_run_keeps_every_configurations_steps_and_status(shared_worker, reason):
    ctx = OpContext("t")

    def progress(p, total=None, message=None, delta=None):
        if p == 2 * 3:  # three lockstep steps of both configurations
            ctx.token.cancel(reason)

    ctx.progress = progress
    r = shared_worker.handle("benchmark", tune_args(steps=20), [], ctx)[0]
    want = "cancelled" if reason == "cancelled" else "stopped"
    assert r.get("stopped") == (None if reason == "cancelled" else reason)
    assert r["cancelled"] is (reason == "cancelled")
    assert [c["status"] for c in r["configs"]] == [want, want]
    # Lockstep: both precisions stopped at the same step, with their losses so far.
    assert [c["train_steps"] for c in r["configs"]] == [3, 3]
    assert all(len(c["loss_curve"]["values"]) == 3 for c in r["configs"])
    assert r["configs"][1]["loss_drift_vs_fp32"]["steps"] == 3


def test_a_dataset_whose_file_changed_is_refused(tmp_path, catalog_path, cpu_probe):
    with open(catalog_path, encoding="utf-8") as fh:
        data = json.load(fh)
    shutil.copy(text_data.resolve(catalog_path, DATASET).path, tmp_path / "t.txt")
    with open(tmp_path / "t.txt", "a", encoding="utf-8") as fh:
        fh.write("one more line\n")
    data["dataset_roots"] = [str(tmp_path)]
    data["datasets"][0]["path"] = "t.txt"
    path = tmp_path / "catalog.json"
    path.write_text(json.dumps(data))
    with pytest.raises(WorkerError, match=r"sha256 is [0-9a-f]{64}, the catalog declares"):
        text_data.resolve(str(path), DATASET)
    w = Worker(load_catalog(str(path)), cpu_probe)
    try:
        with pytest.raises(WorkerError, match="not a catalog dataset"):
            w.handle("benchmark", tune_args(dataset="nope"), [], OpContext("t"))
    finally:
        w.close()


def test_fine_tune_arguments_are_checked_in_words(shared_worker):
    bad = [
        ({"iterations": 3}, "omit iterations"),
        ({"batch_sizes": [1, 2]}, "one batch size and one seq_len"),
        ({"eval_every": 7}, "eval_every must be an integer in 1..6"),
        ({"learning_rate": 0}, "learning_rate must be a number"),
        ({"model": "mnist-cnn", "seq_lens": None}, "text-generation models"),
        ({"work": "train_step", "optimizer": "adamw", "iterations": 2}, "only work 'fine_tune' takes it"),
    ]
    for extra, words in bad:
        with pytest.raises(WorkerError, match=words):
            shared_worker.handle("benchmark", tune_args(**extra), [], OpContext("t"))
