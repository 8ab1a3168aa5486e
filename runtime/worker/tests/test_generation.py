"""Generation per the shared contract: parameters, seeds, stop sequences, logprobs, chat
templates, streaming deltas, cancellation and continuous batching (tiny-gpt2 / tiny-chat)."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from conftest import BUILTIN_CATALOG
from tpu_worker.cancel import CancelToken
from tpu_worker.catalog import Limits
from tpu_worker.errors import WorkerError
from tpu_worker.generation import kv, rows
from tpu_worker.generation.chat import load_chat_template
from tpu_worker.generation.loop import DecodeLoop
from tpu_worker.generation.params import GenParams, parse_params
from tpu_worker.generation.sampling import sample, sequence_generator
from tpu_worker.generation.textstream import TextStream
from tpu_worker.ops import OpContext

PROMPT = "the quick brown fox"


def gen(w, args, ctx=None, model="tiny-gpt2"):
    result, tensors = w.handle("infer", {"model": model, **args}, [], ctx or OpContext("g"))
    assert tensors == []
    return result


def refusal(w, args, model="tiny-gpt2") -> str:
    with pytest.raises(WorkerError) as err:
        gen(w, args, model=model)
    assert err.value.code == "invalid_argument"
    return err.value.message


def streamed(w, args, model="tiny-gpt2", on_delta=None):
    """Runs a streaming generation: (result, [(progress, total, delta)])."""
    seen = []

    def progress(p, total=None, message=None, delta=None):
        assert message == delta["text"]
        seen.append((p, total, delta))
        if on_delta:
            on_delta(len(seen))

    ctx = OpContext("s", progress=progress)
    return gen(w, {"stream": True, **args}, ctx, model), seen


# -- arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            {"texts": ["a"], "messages": [{"role": "user", "content": "hi"}]},
            "exactly one of args.texts or args.messages",
        ),
        ({}, "exactly one of args.texts or args.messages"),
        ({"texts": ["a"], "temperature": 2.5}, "args.temperature must be in 0..2"),
        ({"texts": ["a"], "temperature": "hot"}, "args.temperature must be a number"),
        ({"texts": ["a"], "temperature": True}, "args.temperature must be a number"),
        ({"texts": ["a"], "top_p": 0}, "args.top_p must be in (0, 1]"),
        ({"texts": ["a"], "top_p": 1.5}, "args.top_p must be in (0, 1]"),
        ({"texts": ["a"], "top_k": 1001}, "args.top_k must be an integer in 0..1000"),
        ({"texts": ["a"], "top_k": 2.5}, "args.top_k must be an integer in 0..1000"),
        ({"texts": ["a"], "seed": -1}, "args.seed must be an integer in 0..2147483647"),
        ({"texts": ["a"], "seed": 2**31}, "args.seed must be an integer in 0..2147483647"),
        ({"texts": ["a"], "stop": "x"}, "args.stop must be a list of at most 4 strings of 1..64 characters"),
        ({"texts": ["a"], "stop": ["a", "b", "c", "d", "e"]}, "at most 4 strings"),
        ({"texts": ["a"], "stop": [""]}, "1..64 characters"),
        ({"texts": ["a"], "stop": ["x" * 65]}, "1..64 characters"),
        ({"texts": ["a"], "logprobs": 6}, "args.logprobs must be an integer in 0..5"),
        ({"texts": ["a"], "stream": "yes"}, "args.stream must be true or false"),
        ({"texts": ["a"], "max_new_tokens": 0}, "args.max_new_tokens must be an integer in 1..64"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "has no chat template"),
    ],
)
def test_generation_arguments_are_refused_with_a_clear_message(shared_worker, args, fragment):
    assert fragment in refusal(shared_worker, args)


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ([], "args.messages must be a list of 1..256"),
        ("hi", "args.messages must be a list of 1..256"),
        ([{"role": "robot", "content": "x"}], "args.messages[0] must be {role:"),
        # A tool result answers a call an earlier assistant message made.
        ([{"role": "tool", "content": "x"}], "tool_call_id must name a call of an earlier"),
        ([{"role": "user", "content": 3}], "args.messages[0] must be {role:"),
        ([{"role": "user", "content": "x", "name": "bob"}], "unknown field(s) name"),
        ([{"role": "user", "content": "x" * 3000}], "total 3000 characters; the limit is 2048"),
    ],
)
def test_chat_messages_are_checked(shared_worker, messages, fragment):
    assert fragment in refusal(shared_worker, {"messages": messages}, model="tiny-chat")


def test_the_catalog_bounds_logprobs(shared_worker):
    entry = shared_worker.catalog.get("tiny-gpt2")
    lim = vars(entry.limits) | {"max_logprobs": 2}
    narrow = type(entry)(**(vars(entry) | {"limits": Limits(**lim)}))
    assert parse_params(narrow, {"logprobs": 2}).logprobs == 2
    with pytest.raises(WorkerError, match=r"args.logprobs must be an integer in 0..2"):
        parse_params(narrow, {"logprobs": 3})
    off = type(entry)(**(vars(entry) | {"limits": Limits(**(lim | {"max_logprobs": 0}))}))
    with pytest.raises(WorkerError, match="returns no logprobs"):
        parse_params(off, {"logprobs": 1})


def test_greedy_ignores_the_sampling_arguments_and_returns_no_seed(shared_worker):
    entry = shared_worker.catalog.get("tiny-gpt2")
    p = parse_params(entry, {"temperature": 0, "top_p": 0.5, "top_k": 3, "seed": 7})
    assert (p.top_p, p.top_k, p.seed) == (1.0, 0, None)
    r = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 4, "seed": 7})
    assert "seed" not in r


# -- results -----------------------------------------------------------------------------------
def test_a_generation_reports_text_finish_reason_usage_and_timing(shared_worker):
    r = gen(shared_worker, {"texts": [PROMPT, "a"], "max_new_tokens": 5})
    prompt_ids = shared_worker.served["tiny-gpt2"].adapter.tokenizer.encode(PROMPT, add_special_tokens=False).ids
    assert r["task"] == "text-generation" and len(r["generations"]) == 2
    g = r["generations"][0]
    assert g["text"] == r["texts"][0] and g["finish_reason"] == "length"
    assert g["usage"] == {"prompt_tokens": len(prompt_ids), "completion_tokens": 5} and r["new_tokens"] == [5, 5]
    assert "logprobs" not in g
    assert r["ttft_ms"] > 0 and r["tokens_per_s"] > 0


def reference_decode(adapter, prompt: list[int], max_new: int, params: GenParams | None = None) -> list[int]:
    """The reference: one unpadded prompt, a whole forward per token (no cache, no batch), the
    next token by argmax or sampled as a request's prompt 0 is (its seed's generator)."""
    gen = sequence_generator(params.seed, 0) if params is not None else None
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(max_new):
            logits = adapter.eager_model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
            t = sample(logits, params, gen) if gen is not None else int(logits.argmax())
            ids.append(t)
            if t == adapter.eos_id:
                break
    return ids[len(prompt) :]


def test_greedy_generation_equals_the_uncached_reference_decode(shared_worker):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    texts = [PROMPT, "hello", "a much longer prompt than the others, to pad the short ones"]
    r = gen(shared_worker, {"texts": texts, "max_new_tokens": 12})
    prompts = [e.ids for e in adapter.tokenizer.encode_batch(texts, add_special_tokens=False)]
    direct = [reference_decode(adapter, p, 12) for p in prompts]
    assert r["texts"] == [adapter.decode(ids) for ids in direct]
    assert r["new_tokens"] == [len(ids) for ids in direct]


def test_a_seeded_sample_equals_the_reference_decode_sampled_with_that_seed(shared_worker):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    r = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 12, "temperature": 1.3, "seed": 99})
    prompt = adapter.tokenizer.encode(PROMPT, add_special_tokens=False).ids
    direct = reference_decode(adapter, prompt, 12, GenParams(12, 1.3, seed=99))
    assert r["texts"] == [adapter.decode(direct)]
    assert reference_decode(adapter, prompt, 12) != direct


def test_generation_stops_at_eos_with_finish_reason_stop(shared_worker):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    real_eos = adapter.eos_id
    first = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 6, "logprobs": 1})["generations"][0]
    ids = [adapter.tokenizer.token_to_id(lp["token"]) for lp in first["logprobs"]]
    k = ids.index(ids[2])  # the first time the third token is generated
    adapter.eos_id = ids[2]  # pretend it is the model's EOS
    try:
        g = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 6})["generations"][0]
    finally:
        adapter.eos_id = real_eos
    assert g["finish_reason"] == "stop" and g["usage"]["completion_tokens"] == k + 1
    assert g["text"] == adapter.decode(ids[:k])  # EOS itself is not text


# -- sampling and seeds ------------------------------------------------------------------------
def sampled(w, seed, texts=(PROMPT,), **extra):
    return gen(w, {"texts": list(texts), "max_new_tokens": 16, "temperature": 1.0, "seed": seed, **extra})


def test_the_same_seed_gives_the_same_tokens_and_different_seeds_differ(shared_worker):
    a, b, c = sampled(shared_worker, 1), sampled(shared_worker, 1), sampled(shared_worker, 2)
    assert a["texts"] == b["texts"] and a["seed"] == 1
    assert a["texts"] != c["texts"]
    greedy = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 16})
    assert a["texts"] != greedy["texts"]  # temperature 1 over random weights: far from argmax


def test_a_seed_the_worker_picked_is_returned_and_replays_the_generation(shared_worker):
    r = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 12, "temperature": 0.9})
    assert isinstance(r["seed"], int) and 0 <= r["seed"] < 2**31
    again = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 12, "temperature": 0.9, "seed": r["seed"]})
    assert again["texts"] == r["texts"]


def test_a_seeded_sequence_is_independent_of_the_batch_it_runs_in(shared_worker):
    alone = sampled(shared_worker, 5)
    together = sampled(shared_worker, 5, texts=(PROMPT, "other words", "x y z"))
    assert together["texts"][0] == alone["texts"][0]
    # Each prompt of a request has its own generator: the same prompt twice samples differently.
    twice = sampled(shared_worker, 5, texts=(PROMPT, PROMPT))
    assert twice["texts"][0] == alone["texts"][0] and twice["texts"][1] != twice["texts"][0]


def test_top_k_1_and_a_tiny_top_p_are_greedy(shared_worker):
    greedy = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 16})["texts"]
    assert sampled(shared_worker, 3, top_k=1)["texts"] == greedy
    assert sampled(shared_worker, 3, top_p=1e-6)["texts"] == greedy
    assert sampled(shared_worker, 3, top_k=50)["texts"] != greedy


def test_sample_draws_only_from_the_top_k_and_the_top_p_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    g = torch.Generator().manual_seed(0)
    k2 = {sample(logits, GenParams(1, 1.0, 1.0, 2, 0), g) for _ in range(300)}
    assert k2 == {0, 1}
    p = {sample(logits, GenParams(1, 1.0, 0.7, 0, 0), g) for _ in range(300)}  # 0.5 + 0.3 reach 0.7
    assert p == {0, 1}
    every = {sample(logits, GenParams(1, 1.0, 1.0, 0, 0), g) for _ in range(400)}
    assert every == {0, 1, 2, 3}
    cold = {sample(logits, GenParams(1, 0.05, 1.0, 0, 0), g) for _ in range(100)}  # low temperature: peaked
    assert cold == {0}


# -- logprobs ----------------------------------------------------------------------------------
def test_logprobs_give_the_chosen_token_and_its_top_alternatives(shared_worker):
    r = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 6, "logprobs": 3})
    lps = r["generations"][0]["logprobs"]
    assert len(lps) == 6
    for lp in lps:
        top = [t["logprob"] for t in lp["top"]]
        assert len(top) == 3 and top == sorted(top, reverse=True) and all(v <= 0 for v in top)
        assert lp["token"] == lp["top"][0]["token"] and lp["logprob"] == pytest.approx(top[0])  # greedy
    s = sampled(shared_worker, 4, logprobs=2)["generations"][0]["logprobs"]
    assert all(lp["logprob"] <= lp["top"][0]["logprob"] + 1e-6 for lp in s)


def test_logprobs_are_of_the_model_distribution_not_the_tempered_one(shared_worker):
    """The documented contract (sampling.py): logprobs before temperature, top-k and top-p. The
    first token's distribution depends on the prompt only, so greedy and any temperature agree."""
    first = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 1, "logprobs": 5})["generations"][0]
    want = [t["logprob"] for t in first["logprobs"][0]["top"]]
    for temperature in (0.3, 1.7):
        got = sampled(shared_worker, 8, temperature=temperature, top_k=3, logprobs=5)["generations"][0]
        top = got["logprobs"][0]["top"]
        assert [t["token"] for t in top] == [t["token"] for t in first["logprobs"][0]["top"]]
        assert [t["logprob"] for t in top] == pytest.approx(want, abs=1e-5)


# -- stop sequences ----------------------------------------------------------------------------
def test_a_stop_sequence_cuts_the_text_before_its_first_match_even_across_tokens(shared_worker):
    base, seen = streamed(shared_worker, {"texts": [PROMPT], "max_new_tokens": 20})
    pieces = [d["text"] for _, _, d in seen]
    full = base["texts"][0]
    assert "".join(pieces) == full and len(pieces) >= 6
    boundary = len("".join(pieces[:4]))  # the stop straddles the end of the 4th token's text
    stop = full[boundary - 2 : boundary + 2]
    cut = full.index(stop)
    r, seen = streamed(shared_worker, {"texts": [PROMPT], "max_new_tokens": 20, "stop": ["zzzz-never", stop]})
    g = r["generations"][0]
    assert g["text"] == full[:cut] and g["finish_reason"] == "stop"
    assert "".join(d["text"] for _, _, d in seen) == full[:cut]  # nothing streamed that was cut
    assert g["usage"]["completion_tokens"] < 20


def test_text_stream_holds_back_a_possible_stop_and_releases_it_when_it_does_not_match():
    pieces = {1: "ab", 2: "cd", 3: "ef"}

    def decode(ids):
        return "".join(pieces[i] for i in ids)

    s = TextStream(decode, ("bx", "cdz"))
    assert s.push(1) == "a"  # "b" may start "bx"
    assert s.push(2) == "b"  # "bcd": "cd" may start "cdz"
    assert s.push(3) == "cdef" and not s.stopped
    s = TextStream(decode, ("bc",))
    assert s.push(1) == "a" and s.push(2) == "" and s.stopped and s.text == "a"
    assert s.push(3) == "" and s.finish() == ""
    s = TextStream(decode, ("f",))
    assert s.push(1) + s.push(2) + s.push(3) == "abcde" and s.stopped


def test_text_stream_waits_for_a_complete_character():
    parts = {1: b"\xe2\x82", 2: b"\xac!"}  # "€!" split inside the UTF-8 sequence

    def decode(ids):
        return b"".join(parts[i] for i in ids).decode("utf-8", errors="replace")

    s = TextStream(decode, ())
    assert s.push(1) == "" and s.push(2) == "€!" and s.finish() == ""


# -- chat --------------------------------------------------------------------------------------
def test_chat_renders_the_models_template_and_generates_from_it(shared_worker):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    r = gen(shared_worker, {"messages": messages, "max_new_tokens": 8}, model="tiny-chat")
    rendered = "[CLS]system: be brief [SEP] user: hello there [SEP] assistant:"
    assert shared_worker.served["tiny-chat"].adapter.chat.render(messages) == rendered
    same = gen(shared_worker, {"texts": [rendered], "max_new_tokens": 8}, model="tiny-chat")
    assert r["texts"] == same["texts"] and len(r["generations"]) == 1
    ids = shared_worker.served["tiny-chat"].adapter.tokenizer.encode(rendered, add_special_tokens=False).ids
    assert r["generations"][0]["usage"]["prompt_tokens"] == len(ids) and ids[0] == 101  # BOS from the template
    plain = gen(shared_worker, {"texts": ["hello there"], "max_new_tokens": 8}, model="tiny-chat")
    assert plain["texts"] != r["texts"]
    no_prompt = shared_worker.served["tiny-chat"].adapter.chat.render(messages, add_generation_prompt=False)
    assert not no_prompt.endswith("assistant:")


def test_a_model_without_a_chat_template_refuses_messages(shared_worker):
    msg = refusal(shared_worker, {"messages": [{"role": "user", "content": "hi"}]})
    assert "model 'tiny-gpt2' has no chat template" in msg and "send args.texts instead" in msg


def test_a_conversation_longer_than_the_prompt_window_is_refused(shared_worker):
    messages = [{"role": "user", "content": "word " * 400}]
    msg = refusal(shared_worker, {"messages": messages, "max_new_tokens": 8}, model="tiny-chat")
    assert "at most 128 prompt tokens with max_new_tokens=8: shorten it" in msg


def test_chat_templates_come_from_the_config_a_named_list_or_a_jinja_file_and_are_sandboxed():
    def files(**f):
        return lambda name: f.get(name.replace(".", "_"))

    t = load_chat_template(files(tokenizer_config_json='{"chat_template": "{{ messages[0].content }}!"}'))
    assert t.render([{"role": "user", "content": "hi"}]) == "hi!"
    named = '{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}'
    assert load_chat_template(files(tokenizer_config_json=named)).render([]) == "D"
    t = load_chat_template(
        files(tokenizer_config_json='{"eos_token": {"content": "</s>"}}', chat_template_jinja="{{ eos_token }}")
    )
    assert t.render([]) == "</s>"
    assert load_chat_template(files(tokenizer_config_json="{}")) is None
    escape = load_chat_template(files(chat_template_jinja="{{ ''.__class__.__mro__[1].__subclasses__() }}"))
    with pytest.raises(WorkerError, match="chat template refused"):
        escape.render([])
    mutate = load_chat_template(files(chat_template_jinja="{{ messages.append(1) }}"))
    with pytest.raises(WorkerError, match="chat template refused"):
        mutate.render([])
    raising = load_chat_template(files(chat_template_jinja="{{ raise_exception('only user turns') }}"))
    with pytest.raises(WorkerError, match="only user turns"):
        raising.render([])
    broken = load_chat_template(files(chat_template_jinja="{% for %}"))
    with pytest.raises(WorkerError, match="does not compile"):
        broken.render([])


# -- streaming ---------------------------------------------------------------------------------
def test_streaming_sends_the_text_in_order_and_it_equals_the_final_text(shared_worker):
    texts = [PROMPT, "hello"]
    r, seen = streamed(shared_worker, {"texts": texts, "max_new_tokens": 10})
    progress = [p for p, _, _ in seen]
    assert progress == sorted(set(progress)) and all(total == 20 for _, total, _ in seen)
    for i in range(2):
        assert "".join(d["text"] for _, _, d in seen if d["index"] == i) == r["texts"][i]
    plain = gen(shared_worker, {"texts": texts, "max_new_tokens": 10})
    assert plain["texts"] == r["texts"]


def test_a_request_without_stream_sends_no_progress(shared_worker):
    _, seen = streamed(shared_worker, {"texts": [PROMPT], "max_new_tokens": 4, "stream": False})
    assert seen == []


# -- cancellation ------------------------------------------------------------------------------
def test_a_cancel_mid_generation_finishes_with_the_partial_text(shared_worker):
    token = CancelToken()
    seen = []

    def progress(p, total=None, message=None, delta=None):
        seen.append(delta["text"])
        if len(seen) == 3:
            token.cancel()

    ctx = OpContext("c", token=token, progress=progress)
    r = gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 64, "stream": True}, ctx)
    g = r["generations"][0]
    assert g["finish_reason"] == "cancelled" and g["usage"]["completion_tokens"] == 3
    assert g["text"] == "".join(seen)


@pytest.mark.parametrize("reason", ["budget", "timeout"])
def test_a_budget_or_timeout_stop_is_the_finish_reason(shared_worker, reason):
    token = CancelToken()
    token.cancel(reason)
    assert token.reason == reason
    loop = shared_worker.served["tiny-gpt2"].batcher
    adapter = shared_worker.served["tiny-gpt2"].adapter
    r = loop.submit(adapter.prepare({"texts": [PROMPT]}, []), token).result(timeout=60).result
    assert r["generations"][0] == {
        "text": "",
        "finish_reason": reason,
        "usage": {"prompt_tokens": 4, "completion_tokens": 0},
    }


# -- continuous batching -----------------------------------------------------------------------
@pytest.fixture
def loop_of(shared_worker):
    loops = []

    def make(model="tiny-gpt2", **kw):
        loop = DecodeLoop(f"test-{model}", shared_worker.served[model].adapter, max_batch=kw.pop("max_batch", 16), **kw)
        loops.append(loop)
        return loop

    yield make
    for loop in loops:
        loop.close("test over")


def run_alone(loop, adapter, args):
    return loop.submit(adapter.prepare(args, []), CancelToken()).result(timeout=60).result


JOINERS = [
    {"texts": ["a prompt that is longer than the first one, by quite a few tokens"], "max_new_tokens": 5},
    {"texts": ["x", "two prompts in one request"], "max_new_tokens": 30},
    {"texts": ["sampled while others decode"], "max_new_tokens": 12, "temperature": 0.8, "seed": 11},
    {"texts": ["with a stop and logprobs"], "max_new_tokens": 12, "logprobs": 2, "stop": ["zz"]},
]


def test_requests_joining_a_running_batch_get_the_same_tokens_as_alone(shared_worker, loop_of):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    loop = loop_of()
    first = {"texts": ["hi"], "max_new_tokens": 40, "stream": True}
    expected = [run_alone(loop, adapter, a) for a in [first, *JOINERS]]
    steps_before, joins_before = loop.stats.steps, loop.stats.joins
    futures = []

    calls = []

    def join_mid_generation(p, total=None, message=None, delta=None):
        calls.append(p)
        if len(calls) == 4:  # the first request is decoding: the others join at the next token boundary
            futures.extend(loop.submit(adapter.prepare(a, []), CancelToken()) for a in JOINERS)

    head = loop.submit(adapter.prepare(first, []), CancelToken(), progress=join_mid_generation)
    results = [head.result(timeout=60).result] + [f.result(timeout=60).result for f in futures]
    for got, want in zip(results, expected, strict=True):
        assert got["texts"] == want["texts"] and got["new_tokens"] == want["new_tokens"]
        for g, w in zip(got["generations"], want["generations"], strict=True):
            assert (g["finish_reason"], g["usage"]) == (w["finish_reason"], w["usage"])
            if "logprobs" in w:  # the same tokens; log-probabilities equal up to float rounding
                assert [t["token"] for t in g["logprobs"]] == [t["token"] for t in w["logprobs"]]
                got_lp = [t["logprob"] for t in g["logprobs"]]
                assert got_lp == pytest.approx([t["logprob"] for t in w["logprobs"]], abs=1e-4)
    assert loop.stats.joins - joins_before == len(JOINERS)
    assert results[0]["batched_with"] == 1 + len(JOINERS) and results[0]["batch_items"] == 6
    # Everything decoded together: far fewer steps than running the five requests one by one.
    assert loop.stats.steps - steps_before < sum(r["new_tokens"][0] for r in expected)
    assert loop.stats.running == 0 and loop.stats.largest == 6


def test_finished_sequences_leave_and_free_their_rows(shared_worker, loop_of):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    loop = loop_of(max_batch=2)
    rows = []

    calls = []

    def watch(p, total=None, message=None, delta=None):
        calls.append(p)
        rows.append(loop.stats.running)
        if len(calls) == 2:
            loop.submit(adapter.prepare({"texts": ["short"], "max_new_tokens": 3}, []), CancelToken())
            late.append(loop.submit(adapter.prepare({"texts": ["late"], "max_new_tokens": 3}, []), CancelToken()))

    late = []
    long = loop.submit(
        adapter.prepare({"texts": ["long"], "max_new_tokens": 30, "stream": True}, []), CancelToken(), progress=watch
    )
    long.result(timeout=60)
    late[0].result(timeout=60)
    # max_batch 2: "late" waited for "short" to leave, then took its row while "long" ran on.
    assert max(rows) == 2 and loop.stats.joins >= 2 and loop.stats.largest == 2


def test_a_cancelled_sequence_leaves_without_disturbing_the_others(shared_worker, loop_of):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    loop = loop_of()
    other_args = {"texts": ["the other request"], "max_new_tokens": 20}
    want = run_alone(loop, adapter, other_args)
    token = CancelToken()
    other = []

    calls = []

    def cancel_later(p, total=None, message=None, delta=None):
        calls.append(p)
        if len(calls) == 2:
            other.append(loop.submit(adapter.prepare(other_args, []), CancelToken()))
        if len(calls) == 5:
            token.cancel()

    r = loop.submit(
        adapter.prepare({"texts": [PROMPT], "max_new_tokens": 60, "stream": True}, []), token, progress=cancel_later
    )
    g = r.result(timeout=60).result["generations"][0]
    assert g["finish_reason"] == "cancelled" and g["usage"]["completion_tokens"] == calls[4]
    assert other[0].result(timeout=60).result["texts"] == want["texts"]


def test_a_request_cancelled_while_queued_is_answered_without_running(shared_worker, loop_of):
    adapter = shared_worker.served["tiny-gpt2"].adapter
    loop = loop_of(max_batch=1)
    token = CancelToken()
    queued, answered_early = [], []

    calls = []

    def cancel_queued(p, total=None, message=None, delta=None):
        calls.append(p)
        if len(calls) == 1:
            queued.append(loop.submit(adapter.prepare({"texts": ["queued"]}, []), token))
        if len(calls) == 2:
            token.cancel()
        if len(calls) == 4:  # two token boundaries later, the head still decoding
            answered_early.append(queued[0].done())

    head = loop.submit(
        adapter.prepare({"texts": ["hi"], "max_new_tokens": 50, "stream": True}, []),
        CancelToken(),
        progress=cancel_queued,
    )
    head.result(timeout=60)
    assert answered_early == [True]  # max_batch 1: it never joined, and did not wait for the head
    g = queued[0].result(timeout=60).result["generations"][0]
    assert g["finish_reason"] == "cancelled" and g["usage"]["completion_tokens"] == 0


def test_a_model_whose_cache_cannot_be_reshaped_runs_one_batch_at_a_time(shared_worker, loop_of, monkeypatch):
    # The dynamic loop (a model whose cache cannot be static either: generation/rows.py).
    monkeypatch.setattr(rows, "static_cache_problem", lambda model: "not static")
    monkeypatch.setattr(kv, "tensors_of", lambda cache: None)
    adapter = shared_worker.served["tiny-gpt2"].adapter
    loop = loop_of()
    joiner = {"texts": ["joins only an empty batch"], "max_new_tokens": 6}
    first = {"texts": ["hi", "a longer second prompt"], "max_new_tokens": 20, "stream": True}
    want = [run_alone(loop, adapter, a) for a in (first, joiner)]
    later = []

    calls = []

    def submit_joiner(p, total=None, message=None, delta=None):
        calls.append(p)
        if len(calls) == 3:
            later.append(loop.submit(adapter.prepare(joiner, []), CancelToken()))

    head = loop.submit(adapter.prepare(first, []), CancelToken(), progress=submit_joiner).result(timeout=60).result
    assert head["texts"] == want[0]["texts"]
    assert later[0].result(timeout=60).result["texts"] == want[1]["texts"]
    assert loop.mergeable is False and loop.stats.joins == 0


def test_status_reports_the_decode_loops_counters(shared_worker):
    gen(shared_worker, {"texts": [PROMPT], "max_new_tokens": 3})
    status, _ = shared_worker.handle("status", {}, [], OpContext("st"))
    (m,) = [m for m in status["loaded"] if m["model"] == "tiny-gpt2"]
    b = m["batching"]
    assert b["kind"] == "continuous" and b["enabled"] is True and b["max_batch"] == 16
    assert b["running"] == 0 and b["tokens"] >= 3 and b["steps"] >= 2 and b["requests"] >= 1 and "joins" in b
    (mnist,) = [m for m in status["loaded"] if m["model"] == "mnist-cnn"]
    assert "max_wait_ms" in mnist["batching"]  # forward models keep the dynamic batcher


def test_with_batching_off_requests_do_not_share_a_decode_batch(worker):
    worker.handle("load", {"model": "tiny-gpt2", "batching": False}, [], OpContext("l"))
    loop = worker.served["tiny-gpt2"].batcher
    adapter = worker.served["tiny-gpt2"].adapter
    later = []

    calls = []

    def submit_more(p, total=None, message=None, delta=None):
        calls.append(p)
        if len(calls) == 2:
            later.append(loop.submit(adapter.prepare({"texts": ["b"], "max_new_tokens": 4}, []), CancelToken()))

    r = loop.submit(
        adapter.prepare({"texts": ["a"], "max_new_tokens": 8, "stream": True}, []), CancelToken(), progress=submit_more
    )
    assert r.result(timeout=60).result["batched_with"] == 1
    assert later[0].result(timeout=60).result["batched_with"] == 1 and loop.stats.joins == 0


def test_unload_answers_the_requests_of_a_running_decode_batch(worker):
    worker.handle("load", {"model": "tiny-gpt2"}, [], OpContext("l"))
    loop = worker.served["tiny-gpt2"].batcher
    adapter = worker.served["tiny-gpt2"].adapter
    started = threading.Event()
    release = threading.Event()

    calls = []

    def hold(p, total=None, message=None, delta=None):
        calls.append(p)
        started.set()
        release.wait(10)

    fut = loop.submit(
        adapter.prepare({"texts": ["a"], "max_new_tokens": 60, "stream": True}, []), CancelToken(), progress=hold
    )
    assert started.wait(30)
    threading.Timer(0.2, release.set).start()
    worker.handle("unload", {"model": "tiny-gpt2"}, [], OpContext("u"))
    with pytest.raises(WorkerError) as err:
        fut.result(timeout=30)
    assert err.value.code == "model_not_loaded"


def test_concurrent_callers_each_get_what_they_would_get_alone(shared_worker):
    requests = [
        {"texts": [f"caller {i} says " + "word " * i], "max_new_tokens": 6 + i}
        | ({"temperature": 0.9, "seed": i} if i % 2 else {})
        for i in range(8)
    ]
    alone = [gen(shared_worker, r)["texts"] for r in requests]
    together: dict[int, list[str]] = {}
    start = threading.Barrier(len(requests))

    def call(i: int) -> None:
        start.wait()
        together[i] = gen(shared_worker, requests[i])["texts"]

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [together[i] for i in range(len(requests))] == alone


def _copied_model(models_dir, tmp_path, name="tiny-gpt2"):
    """A catalog whose one causal LM is a copy of tiny-gpt2 under a fresh model root."""
    import json
    import shutil

    from tpu_worker.catalog import parse_catalog

    root = tmp_path / "root"
    shutil.copytree(os.path.realpath(os.path.join(models_dir, name)), root / "m")
    with open(BUILTIN_CATALOG, encoding="utf-8") as fh:
        data = json.load(fh)
    entry = next(m for m in data["models"] if m["id"] == name) | {"id": "copy", "source": {"path": "m"}}
    catalog = parse_catalog({"model_roots": [str(root)], "models": [entry]}, str(tmp_path / "catalog.json"))
    return catalog, root / "m"


def test_a_chat_template_jinja_file_beside_the_model_serves_chat(models_dir, cpu_probe, tmp_path):
    from tpu_worker.ops import Worker

    catalog, model = _copied_model(models_dir, tmp_path)
    (model / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }} {% endfor %}")
    w = Worker(catalog, cpu_probe)
    try:
        w.handle("load", {"model": "copy"}, [], OpContext("l"))
        chat = gen(w, {"messages": [{"role": "user", "content": PROMPT}], "max_new_tokens": 5}, model="copy")
        plain = gen(w, {"texts": [PROMPT + " "], "max_new_tokens": 5}, model="copy")
        assert chat["texts"] == plain["texts"]
    finally:
        w.close()


def test_a_chat_template_linked_from_outside_the_model_roots_is_refused(models_dir, cpu_probe, tmp_path):
    from tpu_worker.ops import Worker

    catalog, model = _copied_model(models_dir, tmp_path)
    outside = tmp_path / "outside.jinja"
    outside.write_text("{{ messages }}")
    (model / "chat_template.jinja").symlink_to(outside)
    w = Worker(catalog, cpu_probe)
    try:
        with pytest.raises(WorkerError) as err:
            w.handle("load", {"model": "copy"}, [], OpContext("l"))
        assert err.value.code == "path_outside_roots" and "chat_template.jinja" in err.value.message
    finally:
        w.close()
