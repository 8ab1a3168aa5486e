"""Continuous batching: one decode loop per loaded causal LM serves its `infer` requests.

Every prompt of a request is one sequence. Sequences join and leave one running decode batch
at token boundaries: the requests that join at a boundary are prefilled together, one forward
per length bucket in the order they came (generation/rows.py: a static cache with fixed slots,
at the shape plan's buckets, or a dynamic one where the model's cache cannot be static), each
forward's first tokens chosen and sent before the next forward runs, and their keys and values
written into the running batch's cache; a finished sequence (EOS, a stop sequence,
max_new_tokens, or its request's cancel token) leaves at once and frees its row. Each sequence
keeps its own sampling state (parameters, generator, text stream), so its tokens do not depend
on its company. A boundary's joiners are prefilled shortest length bucket first, and the
requests that arrive while they are prefilled join before the next decode step (up to
`ADMIT_ROUNDS` rounds at one boundary), so a new request waits for at most one decode step.
While rows are decoding, the forwards between two decode steps run at most the padded tokens of
one prefill forward at its largest (rows.py `stall_tokens`): the forwards past it wait for the
next boundaries (`_pending`, in order, no new joiner taken before them), so a burst of long
prompts does not stall the running rows for longer than one forward.
Requests wait in FIFO order for room (at most `max_batch` sequences decode
together); a request larger than that runs when the batch is empty. With batching off, or for a
model whose cache cannot be reshaped, a request joins only an empty batch. This thread is the
only place the model's forward runs for `infer`.

A generation request's future always gets a result, never a cancellation: a cancelled request
answers with the text it had, finish_reason = the token's reason (the generation contract).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import logs
from ..adapters.base import Output, Prepared
from ..cancel import CancelToken
from ..errors import WorkerError
from ..inbox import Inbox
from ..protocol import now_us
from ..spans import span_since
from .grammar import Constraint, MaskBuilder
from .params import GenParams, GenRequest
from .repetition import penalize
from .rows import rows_for
from .sampling import RowParams, SeedStream, choose, sequence_generator
from .textstream import TextStream

# Rounds of joiners prefilled at one token boundary: the joiners taken after the last decode step,
# then (only while each round prefilled someone) those that arrived during that round's forwards.
ADMIT_ROUNDS = 3

# progress(tokens so far, total, new text, delta={"index", "text"})
Progress = Callable[..., None]


@dataclass
class LoopStats:
    running: int = 0  # sequences decoding now
    requests: int = 0  # requests answered
    sequences: int = 0  # sequences finished
    joins: int = 0  # requests that joined a batch already decoding
    steps: int = 0  # decode steps (one token for every running sequence)
    prefills: int = 0
    tokens: int = 0  # tokens generated
    largest: int = 0  # most sequences decoded together


class _Request:
    def __init__(self, gen: GenRequest, token: CancelToken, progress: Progress | None, trace: list | None) -> None:
        self.gen = gen
        self.token = token
        self.progress = progress if gen.params.stream else None
        self.trace = trace
        self.future: Future = Future()
        self.future.set_running_or_notify_cancel()  # answered by the loop, even when cancelled
        self.t_submit = time.perf_counter()
        self.t_first: float | None = None
        self.produced = 0  # tokens so far, all sequences: the progress count
        self.open = len(gen.prompts)
        self.batched_with = 1  # most requests sharing a step with this one
        self.batch_items = 0  # most sequences in a step with this one
        self.seqs: list[_Seq] = []
        # Where its time to first token went (`ttft_parts` in the result; the trace's spans).
        self.steps_at_submit = 0  # decode steps run before it was submitted
        self.t_taken: float | None = None  # taken from the queue at a token boundary
        self.steps_taken = 0  # decode steps run before it was taken
        self.t_prefill: float | None = None  # its first prefill forward began
        self.forwards_ahead = 0  # its boundary's prefill forwards that ran before its first
        self.shape: tuple[str, int, int] | None = None  # the (kind, batch, length) of its last forward


class _Seq:
    def __init__(self, req: _Request, index: int, decode, constraint: Constraint | None = None) -> None:
        p = req.gen.params
        self.req = req
        self.index = index
        self.params = p
        self.prompt_len = len(req.gen.prompts[index])
        self.gen = sequence_generator(p.seed, index) if not p.greedy else None
        self.stream = TextStream(decode, p.stop)
        self.tokens: list[int] = []
        self.logprobs: list[dict] | None = [] if p.logprobs else None
        self.finish: str | None = None
        self.constraint = constraint  # its response_format's grammar, or None
        self.prefix_cached: int | None = None  # prompt tokens taken from the prefix cache (None: never prefilled)


class DecodeLoop(Inbox):
    def __init__(
        self,
        name: str,
        adapter,
        *,
        max_batch: int,
        enabled: bool = True,
        reply_scope=None,
    ) -> None:
        super().__init__(reply_scope)
        self.name = name
        self.adapter = adapter
        self.max_batch = max(1, max_batch)
        self.enabled = enabled and self.max_batch > 1
        self.stats = LoopStats()
        # The running batch: its sequences (row order) and their tensors (the KV cache), at the
        # adapter's shape plan.
        self._rows: list[_Seq] = []
        self._batch = rows_for(adapter, max_new_tokens=adapter.entry.limits.max_new_tokens)
        self._last: list[int] = []  # each row's newest token, not yet fed to the model
        # Planned prefill forwards that wait for a later boundary (the stall bound above), in order,
        # with the requests they fail with; and the padded tokens prefilled since the last step.
        self._pending: list[tuple[Callable[[], bool], list[_Request]]] = []
        self._spent = 0
        self._masks: MaskBuilder | None = None  # structured output: built at the first grammar
        # The top logprobs every step computes when a row asks for some: the model's most.
        self._logprobs_k = max(0, min(adapter.entry.limits.max_logprobs, adapter.vocab))
        # reply_scope (Inbox): results are set inside it, after that iteration's progress, so a
        # request's deltas always precede its result on the wire.
        self._thread = threading.Thread(target=self._run, name=f"decode-{name}", daemon=True)
        self._thread.start()

    # -- the Batcher's surface (ops.py, reports.py) -----------------------------------------
    def warm(self, progress, token) -> int:
        """Before the first request: every shape of the plan once (see rows.py)."""
        return self._batch.warm(progress, token)

    @property
    def census(self):
        """The shape census of the step's work around the forward (census.py)."""
        return self._batch.census

    @property
    def mergeable(self) -> bool | None:
        """Can requests join a running batch (None: not known before the first prefill)."""
        return self._batch.mergeable

    def describe(self) -> dict:
        return {
            "kind": "continuous",
            "enabled": self.enabled,
            "max_batch": self.max_batch,
            **self._batch.describe(),
            "op_shapes": self._batch.census.report(),
        }

    def prefix_report(self) -> dict:
        """The prefix cache's size and hit rate (get_runtime_status)."""
        prefix = self._batch.prefix
        return prefix.report() if prefix is not None else {"enabled": False}

    def submit(
        self, prepared: Prepared, token: CancelToken, trace: list | None = None, progress: Progress | None = None
    ) -> Future:
        req = _Request(prepared.payload, token, progress, trace)
        req.steps_at_submit = self.stats.steps
        n = len(req.gen.prompts)
        g = req.gen.grammar
        matchers = g.matchers(n) if g is not None else [None] * n
        req.seqs = [
            _Seq(req, i, self.adapter.decode, Constraint(g.kind, m, g.closer) if m is not None else None)
            for i, m in enumerate(matchers)
        ]
        self._enqueue(req, trace)
        return req.future

    def close(self, reason: str) -> None:
        with self._cond:
            self._closed = reason
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    # -- the loop -----------------------------------------------------------------------------
    def _run(self) -> None:
        joining = self._take()
        while joining is not None:
            self._prefill_pending()  # forwards a budget deferred, before any new joiner
            # One write per prefill forward: each forward's first tokens leave before the next
            # forward or step runs (time to first token), then that step's tokens and answers.
            for round_ in range(1, ADMIT_ROUNDS + 1):
                live: list[_Request] = []
                self._guarded(functools.partial(self._admit, joining, live), joining)
                if not live:
                    break
                self._join(live)
                if round_ == ADMIT_ROUNDS or self._pending:
                    break
                # Those that arrived during these forwards join now, not after a decode step.
                joining = self._take()
                if not joining:
                    break
            if joining is None:
                break
            if self._rows:
                self._guarded(self._step, [])
                self._spent = 0
            joining = self._take()
        with self._cond:
            pending = list(self._queue)
            self._queue.clear()
        planned = {r for _, live in self._pending for r in live}
        self._pending.clear()
        self._fail(
            {s.req for s in self._rows} | set(pending) | planned, WorkerError("model_not_loaded", self._closed or "")
        )
        self._reset()

    def _guarded(self, work: Callable[[], None], joining: list[_Request], prefill: bool = False) -> bool:
        """Runs `work` in one reply pass; False when it failed. A failed prefill fails its
        joiners only; any other failure every request in the batch."""
        with self.replies():
            try:
                work()
                self._compact()
                return True
            except Exception as raised:  # noqa: BLE001 - a failed step fails its requests, not the loop
                exc = _worker_error(raised)
                if prefill:
                    logs.warn("prefill failed", model=self.name, error=f"{type(exc).__name__}: {exc}")
                    self._fail(set(joining), exc)
                    if self._batch.rows != len(self._rows):  # a forward that failed midway: its rows go
                        self._batch.keep(list(range(len(self._rows))))
                    self._compact()
                else:
                    logs.warn("decode step failed", model=self.name, error=f"{type(exc).__name__}: {exc}")
                    self._fail({s.req for s in self._rows} | set(joining), exc)
                    self._reset()
                return False

    def _take(self) -> list[_Request] | None:
        """Blocks while idle; returns the requests that join now (possibly none)."""
        with self._cond:
            while not self._closed and not self._queue and not self._rows and not self._pending:
                self._cond.wait()
            if self._closed:
                return None
            # A cancelled request leaves the queue at once (answered without running), room or not.
            taken = [r for r in self._queue if r.token.cancelled]
            for r in taken:
                self._queue.remove(r)
            rows = len(self._rows)
            if self._pending or (rows and not (self.enabled and self._batch.can_join())):
                return taken
            while self._queue:
                n = len(self._queue[0].gen.prompts)
                if rows and rows + n > self.max_batch:
                    break
                taken.append(self._queue.popleft())
                rows += n
                if not self.enabled:
                    break
            return taken

    def _admit(self, joining: list[_Request], live: list[_Request]) -> None:
        """At a token boundary: cancelled sequences leave, and the joiners not cancelled are
        listed in `live` (in the order they came) to be prefilled."""
        for s in self._rows:
            if s.finish is None and s.req.token.cancelled:
                self._end(s, s.req.token.reason or "cancelled", s.stream.finish())
        now = time.perf_counter()
        for r in joining:
            r.t_taken, r.steps_taken = now, self.stats.steps
            _stamp(r, "w.taken")
            span_since(r.trace, "queue", "w.queued")
            if r.token.cancelled:
                for s in r.seqs:
                    self._end(s, r.token.reason or "cancelled", "")
            else:
                live.append(r)

    def _join(self, live: list[_Request]) -> None:
        """Prefills the joiners one forward at a time (rows.py `forwards`: one per length bucket,
        in the order they came), each forward in a reply pass of its own, so that its sequences'
        first tokens leave before the next forward runs; a failed forward fails the joiners."""
        seqs = [s for r in live for s in r.seqs]
        prompts = [s.req.gen.prompts[s.index] for s in seqs]
        room = max(s.params.max_new_tokens for s in seqs)
        joining = bool(self._rows)
        plan: list = []

        def forwards() -> None:
            with torch.no_grad():
                plan.extend(self._batch.forwards(prompts, [s.req.gen.prefix_key for s in seqs]))

        if not self._guarded(forwards, live, prefill=True):
            return
        waiting = {id(r): len(r.seqs) for r in live}  # sequences not yet prefilled, per request
        for ahead, fwd in enumerate(plan):
            part = [seqs[i] for i in fwd.indices]
            run = functools.partial(self._forward, ahead, fwd, part, prompts, room, waiting, live)
            self._pending.append((run, live))
        self._prefill_pending()
        if joining:
            self.stats.joins += len(live)
        elif not self._batch.can_join():
            logs.info("this model's KV cache cannot be reshaped: requests join an empty batch only", model=self.name)

    def _prefill_pending(self) -> None:
        """Runs the planned forwards in order while the boundary's budget allows: any number
        while the batch is empty, else up to `stall_tokens` padded tokens since the last decode
        step (the first forward of a boundary always runs); the rest wait for the next boundary."""
        while self._pending:
            run, live = self._pending[0]
            cost = self._batch.padded_tokens(run.args[1])
            if self._rows and self._spent and self._spent + cost > self._batch.stall_tokens:
                return
            self._pending.pop(0)
            self._spent += cost
            if not run():
                # A failed forward failed its requests: the rest of their join's forwards go too.
                self._pending = [(r, lv) for r, lv in self._pending if lv is not live]
                return

    def _forward(self, ahead: int, fwd, part: list[_Seq], prompts, room: int, waiting: dict, live) -> bool:
        """One planned forward of a join (`ahead`: the forwards planned before it), in a reply
        pass of its own; False when it failed (its join's requests failed with it)."""
        now = time.perf_counter()
        for s in part:
            if s.req.t_prefill is None:  # its first forward: the others' forwards ran before it
                s.req.t_prefill, s.req.forwards_ahead = now, ahead
                span_since(s.req.trace, "prefill.wait", "w.taken", forwards_ahead=ahead)
                _stamp(s.req, "w.prefill")
        return self._guarded(functools.partial(self._prefill, fwd, prompts, room, part, waiting), live, True)

    def _prefill(self, fwd, prompts: list[list[int]], room: int, part: list[_Seq], waiting: dict) -> None:
        """One prefill forward: its sequences join the batch with their first tokens chosen."""
        with torch.no_grad():
            logits = self._batch.prefill(fwd, prompts, room)
        for s, cached in zip(part, fwd.cached, strict=True):
            s.prefix_cached = cached
        self.stats.prefills += 1
        ids = self._choose(part, logits)
        now = time.perf_counter()
        for s in part:
            r = s.req
            r.shape = fwd.shape
            waiting[id(r)] -= 1
            if waiting[id(r)] == 0:  # its last sequence prefilled: its first tokens are all out
                r.t_first = now
                span_since(r.trace, "prefill.forward", "w.prefill", shape=_shape_text(fwd.shape))
                span_since(r.trace, "prefill", "w.taken", batched_with=len({id(q.req) for q in part}))
                _stamp(r, "w.first_token")
        self._rows.extend(part)
        self._last.extend(ids)
        self.stats.running = sum(1 for s in self._rows if s.finish is None)
        self._accept(part, ids)

    def _step(self) -> None:
        fed = [t if s.finish is None else self.adapter.pad_id for s, t in zip(self._rows, self._last, strict=True)]
        with torch.no_grad():
            logits = self._batch.step(fed)
        st = self.stats
        st.steps += 1
        st.largest = max(st.largest, len(self._rows))
        reqs = {s.req for s in self._rows if s.finish is None}
        for r in reqs:
            r.batched_with = max(r.batched_with, len(reqs))
            r.batch_items = max(r.batch_items, len(self._rows))
        self._last = self._choose(self._rows, logits)
        self._accept(self._rows, self._last)

    def _choose(self, seqs: list[_Seq], logits: torch.Tensor) -> list[int]:
        """The next token of every row (generation/sampling.py `choose`): on the device, over
        the whole bucket of `logits` [B, V] (rows past `seqs` and finished rows are padding),
        with per-row parameters as tensors; the host reads one small tensor. Rows with a grammar
        first have every token it forbids masked, on the device, and then keep room for their
        text's closing (grammar.Constraint.fit)."""
        with self._batch.census.watch():
            return self._pick(seqs, logits)

    def _pick(self, seqs: list[_Seq], logits: torch.Tensor) -> list[int]:
        live = [(i, s) for i, s in enumerate(seqs) if s.finish is None]
        constrained = [(i, s.constraint) for i, s in live if s.constraint is not None]
        if constrained:
            if self._masks is None:
                self._masks = MaskBuilder(logits.shape[-1])
            logits = self._masks.apply(logits, constrained)
        draws: list = [None] * logits.shape[0]
        for i, s in live:
            if s.gen is not None:
                draws[i] = (s.params, s.gen)
        params = RowParams.build(draws, logits.device) if any(d is not None for d in draws) else None
        k = self._logprobs_k if any(s.logprobs is not None for _, s in live) else None
        out, lp = choose(logits, params, k)
        read = out.tolist()  # the step's one device -> host read
        ids = [int(r[0]) for r in read] if k is not None else read
        for _, s in live:
            if s.gen is not None:
                s.gen.step += 1
        for i, c in constrained:
            ids[i] = c.fit(ids[i], seqs[i].params.max_new_tokens - len(seqs[i].tokens))
        text = self.adapter.token_text
        for i, s in live:
            if s.logprobs is None:
                continue
            assert k is not None and lp is not None
            row, n = read[i], s.params.logprobs
            # A grammar's closing may replace the chosen token: its own logprob then.
            chosen = row[1] if ids[i] == int(row[0]) else float(lp[i, ids[i]])
            top = zip(row[2 + k : 2 + k + n], row[2 : 2 + n], strict=True)
            s.logprobs.append(
                {
                    "token": text(ids[i]),
                    "logprob": chosen,
                    "top": [{"token": text(int(t)), "logprob": v} for t, v in top],
                }
            )
        return ids[: len(seqs)]  # a host list: the padding rows' choices are dropped here

    def seal(self) -> None:
        """After the load: the step's work around the forward once at every batch bucket (every
        kind of choice: greedy, sampled, with logprobs, structured), then the census counts any
        op shape it sees as new (census.py)."""
        rows = self._batch
        if not hasattr(rows, "warm_steps"):
            return  # a dynamic cache: a new shape every step, nothing to seal
        with torch.no_grad():
            rows.warm_steps()
            for b in sorted(set(rows.plan.batches) | set(rows.plan.prefill_batches)):
                self._warm_choice(b)
        rows.census.seal()

    def _warm_choice(self, batch: int) -> None:
        a = self.adapter
        logits = torch.zeros((batch, a.vocab), dtype=a.torch_dtype, device=a.device)
        drawn = [(GenParams(1, 1.0, 0.9, 5, 0), SeedStream(0))] + [None] * (batch - 1)
        with self._batch.census.watch():
            variants = [logits]
            try:
                masks = self._masks if self._masks is not None else MaskBuilder(a.vocab)
                self._masks = masks
                torch.from_numpy(np.zeros(a.vocab, dtype=np.bool_)).to(a.device)  # as MaskBuilder._digits
                masked = masks.apply(logits, [])
                variants.append(penalize(masked, [], torch.zeros(a.vocab, dtype=torch.bool, device=a.device)))
            except ImportError:  # no structured output in this environment
                pass
            for x in variants:
                for params in (None, RowParams.build(drawn, a.device)):
                    for k in (None, self._logprobs_k):
                        out, lp = choose(x, params, k)
                        out.tolist()
                        if lp is not None:
                            float(lp[0, 0])  # a grammar's closing token's logprob

    def _accept(self, seqs: list[_Seq], ids: list[int]) -> None:
        eos = self.adapter.eos_id
        for s, t in zip(seqs, ids, strict=True):
            if s.finish is not None:
                continue
            s.tokens.append(t)
            s.req.produced += 1
            self.stats.tokens += 1
            if t == eos:
                self._end(s, "stop", s.stream.finish())
                continue
            delta = s.stream.push(t)
            c = s.constraint
            if c is not None:
                c.advance(t)
            if c is not None and c.done:
                # The grammar is complete (only its end can follow) or failed: the sequence ends.
                self._end(s, "stop", delta + s.stream.finish())
            elif s.stream.stopped:
                self._end(s, "stop", delta)
            elif len(s.tokens) >= s.params.max_new_tokens:
                self._end(s, "length", delta + s.stream.finish())
            else:
                self._emit(s, delta)

    def _emit(self, s: _Seq, text: str) -> None:
        r = s.req
        if text and r.progress is not None:
            total = r.gen.params.max_new_tokens * len(r.gen.prompts)
            try:
                r.progress(r.produced, total, text, delta={"index": s.index, "text": text})
            except Exception as exc:  # noqa: BLE001 - a lost progress message must not stop decoding
                logs.warn("progress could not be sent", model=self.name, error=f"{type(exc).__name__}: {exc}")

    def _end(self, s: _Seq, reason: str, text: str) -> None:
        self._emit(s, text)
        s.finish = reason
        self.stats.sequences += 1
        self.stats.running = sum(1 for q in self._rows if q.finish is None)  # before the answer wakes anyone
        r = s.req
        r.open -= 1
        if r.open == 0:
            self._answer(r)

    def _answer(self, r: _Request) -> None:
        done = time.perf_counter()
        p = r.gen.params
        gens = []
        for s in r.seqs:
            g: dict[str, Any] = {
                "text": s.stream.text,
                "finish_reason": s.finish,
                "usage": {"prompt_tokens": s.prompt_len, "completion_tokens": len(s.tokens)},
            }
            if s.prefix_cached is not None:
                g["prefix_cached_tokens"] = s.prefix_cached
            if s.logprobs is not None:
                g["logprobs"] = s.logprobs
            if s.constraint is not None:
                g.update(s.constraint.report(cut=s.stream.stopped))
            gens.append(g)
        completion = sum(len(s.tokens) for s in r.seqs)
        elapsed = done - r.t_submit
        result: dict[str, Any] = {
            "task": "text-generation",
            "texts": [g["text"] for g in gens],
            "new_tokens": [len(s.tokens) for s in r.seqs],
            "generations": gens,
            # Time to first token and tokens/s are measured from submission (queueing included).
            "ttft_ms": round(((r.t_first or done) - r.t_submit) * 1000, 3),
            "tokens_per_s": round(completion / elapsed, 3) if elapsed > 0 else None,
            "prefix_cached_tokens": sum(s.prefix_cached or 0 for s in r.seqs),
            "batched_with": r.batched_with,
            "batch_items": max(r.batch_items, len(r.seqs)),
        }
        if r.t_first is not None and r.t_taken is not None and r.t_prefill is not None:
            result["ttft_parts"] = _ttft_parts(r)
        if p.seed is not None:
            result["seed"] = p.seed
        if r.gen.grammar is not None:
            result["grammar_compile_ms"] = round(r.gen.grammar.compile_s * 1000, 3)
        self.stats.requests += 1
        span_since(r.trace, "decode", "w.first_token", new_tokens=completion)
        _stamp(r, "w.forward_done")
        r.future.set_result(Output(result, []))

    def _compact(self) -> None:
        """Drops finished rows (and the cache columns nobody needs any more)."""
        keep = [i for i, s in enumerate(self._rows) if s.finish is None]
        if len(keep) == len(self._rows):
            self.stats.running = len(self._rows)
            return
        if not keep:
            self._reset()
            return
        if self._batch.keep(keep):
            self._rows = [self._rows[i] for i in keep]
            self._last = [self._last[i] for i in keep]
        # else: finished rows ride along (fed padding) until the whole batch is done
        self.stats.running = len(keep)

    def _reset(self) -> None:
        self._rows, self._last = [], []
        self._batch.reset()
        self.stats.running = 0

    def _fail(self, reqs: set[_Request], exc: BaseException) -> None:
        for r in reqs:
            for s in r.seqs:
                s.finish = s.finish or "error"  # leaves the batch at the next compaction
            if not r.future.done():
                r.future.set_exception(exc)


def _worker_error(exc: BaseException) -> BaseException:
    """The WorkerError a failure carries (a compile backend's refusal comes wrapped by dynamo),
    else the failure itself."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, WorkerError):
            return seen
        seen = getattr(seen, "inner_exception", None) or seen.__cause__
    return exc


def _shape_text(shape: tuple[str, int, int] | None) -> str | None:
    return f"{shape[0]} {shape[1]}x{shape[2]}" if shape is not None else None


def _ttft_parts(r: _Request) -> dict[str, Any]:
    """Where its time to first token went, from submission: `queue_ms` waiting to be taken at a
    token boundary (the decode step in progress, `steps_waited` steps in all when it waited for
    room), `behind_ms` behind the prefill forwards of requests taken with it
    (`forwards_ahead` of them), `prefill_ms` its own forward(s) and the first tokens' choice, at
    `prefill_shape`. The three add up to ttft_ms."""
    assert r.t_taken is not None and r.t_prefill is not None and r.t_first is not None
    ms = lambda a, b: round((b - a) * 1000, 3)  # noqa: E731
    return {
        "queue_ms": ms(r.t_submit, r.t_taken),
        "behind_ms": ms(r.t_taken, r.t_prefill),
        "prefill_ms": ms(r.t_prefill, r.t_first),
        "steps_waited": r.steps_taken - r.steps_at_submit,
        "forwards_ahead": r.forwards_ahead,
        "prefill_shape": _shape_text(r.shape),
    }


def _stamp(r: _Request, stage: str) -> None:
    if r.trace is not None:
        r.trace.append([stage, now_us()])
