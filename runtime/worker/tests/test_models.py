from __future__ import annotations

import os

import torch

from tpu_worker.ops import OpContext

SENTENCES = [
    "A man is playing a guitar.",
    "A man is playing a musical instrument.",
    "The stock market fell sharply today.",
    "short",
    "A considerably longer sentence, with punctuation; numbers like 42 and 3.14, and UPPER case words "
    "to make sure truncation, padding buckets and lower-casing all behave exactly as in sentence-transformers.",
    "tokens beyond the 256-token window are truncated " * 60,  # ~480 tokens: exercises truncation
]


def infer(w, args, tensors=None, id="i"):
    return w.handle("infer", args, tensors or [], OpContext(id))


def test_minilm_embeddings_match_sentence_transformers(shared_worker, models_dir):
    from sentence_transformers import SentenceTransformer

    result, (emb,) = infer(shared_worker, {"model": "all-minilm-l6-v2", "texts": SENTENCES})
    assert result["task"] == "embedding" and result["shape"] == [len(SENTENCES), 384]
    st = SentenceTransformer(os.path.join(models_dir, "all-minilm-l6-v2"), device="cpu")
    ref = st.encode(SENTENCES, convert_to_tensor=True, normalize_embeddings=False).to(torch.float32)
    assert (emb - ref).abs().max().item() <= 1e-5
    assert torch.allclose(emb.norm(dim=1), torch.ones(len(SENTENCES)), atol=1e-5)


def test_minilm_embeddings_are_semantically_meaningful(shared_worker):
    _, (emb,) = infer(shared_worker, {"model": "all-minilm-l6-v2", "texts": SENTENCES[:3]})
    close = float(emb[0] @ emb[1])
    far = float(emb[0] @ emb[2])
    assert close - far >= 0.3


def test_embedding_is_independent_of_batch_company(shared_worker):
    _, (alone,) = infer(shared_worker, {"model": "all-minilm-l6-v2", "texts": [SENTENCES[3]]})
    _, (mixed,) = infer(shared_worker, {"model": "all-minilm-l6-v2", "texts": SENTENCES})
    assert (alone[0] - mixed[3]).abs().max().item() <= 1e-5


def test_tiny_gpt2_generates_deterministically(shared_worker):
    args = {"model": "tiny-gpt2", "texts": ["hello world", "a"], "max_new_tokens": 5}
    r1, t1 = infer(shared_worker, args)
    r2, _ = infer(shared_worker, args)
    assert r1["task"] == "text-generation" and t1 == []
    assert r1["texts"] == r2["texts"] and len(r1["texts"]) == 2
    assert all(1 <= n <= 5 for n in r1["new_tokens"])


def test_tiny_gpt2_batched_generation_matches_single(shared_worker):
    single, _ = infer(shared_worker, {"model": "tiny-gpt2", "texts": ["the quick brown fox"], "max_new_tokens": 6})
    batched, _ = infer(
        shared_worker, {"model": "tiny-gpt2", "texts": ["x", "the quick brown fox"], "max_new_tokens": 6}
    )
    assert batched["texts"][1] == single["texts"][0]


def test_mnist_cnn_returns_ten_logits_per_item(shared_worker):
    x = torch.randn(5, 1, 28, 28)
    result, (logits,) = infer(shared_worker, {"model": "mnist-cnn"}, [x])
    assert result["outputs"] == [{"name": "logits"}] and logits.shape == (5, 10)
    _, (one,) = infer(shared_worker, {"model": "mnist-cnn"}, [x[2]])  # [1,28,28] gets a batch dim
    assert one.shape == (1, 10) and torch.allclose(one[0], logits[2], atol=1e-5)
