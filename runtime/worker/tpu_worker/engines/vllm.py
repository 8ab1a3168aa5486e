"""vLLM as the engine of a catalog entry (`"engine": "vllm"`): the worker starts and supervises
a vLLM server for the model (vllm_process.py) or reaches an operator-run one, and maps `infer`
and `benchmark` onto its OpenAI-compatible API. The call path is unchanged (MCP -> dispatch ->
gate -> pool -> this worker's op), so scopes, approvals, the budget, the audit trail and
cancellation hold for the engine as for the worker's own models.

Parity with the worker's own generation: the prompt is tokenized here, by the same tokenizer
file and rules as tpu_worker.adapters.text.CausalLM (no special tokens added, the end of a long
prompt kept), and sent as token ids; the generated ids come back (`return_token_ids`) and are
decoded here, so in float32 greedy decoding the same prompt gives the same tokens and text.
The arguments are checked by the torch path's parser (generation/params.py), and the generated
ids go through its TextStream: the same text, the same stop-sequence cut and the same held-back
streaming; the stream is closed as soon as every sequence is done, and the request aborted in
vLLM (VllmEngine.stream).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from .. import logs
from ..adapters.build import read_config
from ..adapters.text import load_tokenizer, model_chat_template, prompt_ids, valid_id
from ..catalog import Catalog, Entry
from ..errors import Cancelled, WorkerError, invalid
from ..generation.chat import no_chat_template
from ..generation.grammar import Constraint, Grammars
from ..generation.params import GenCall, GenParams, parse_generation, parse_prefix_key
from ..generation.textstream import TextStream
from ..loaders import WeightsInfo
from ..protocol import now_us
from ..spans import span
from .http import Endpoint, EngineHttpError
from .settings import VllmSettings
from .vllm_process import VllmProcess

ENGINE = "vllm"
# vLLM's abort by request id (guarded by its API key; served with --enable-scale-out, which the
# worker passes to a server it starts when its vLLM has it: vllm_process.py).
ABORT_PATH = "/inference/v1/abort_requests"


@dataclass
class _Seq:
    """One generated sequence while its stream runs."""

    prompt_tokens: int
    stream: TextStream
    ids: list[int] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)
    finish: str | None = None
    constraint: Constraint | None = None  # the response_format's grammar, followed here too


@dataclass
class Counters:
    requests: int = 0  # requests this worker sent to the engine
    completion_tokens: int = 0
    failures: int = 0
    in_flight: int = 0
    aborts: int = 0  # requests ended early here and aborted in vLLM by id
    abort_refused: int = 0  # of those, aborts the server refused (no abort endpoint)
    prefix_lookups: int = 0  # requests whose usage said how many prompt tokens vLLM had cached
    prefix_hits: int = 0  # of those, requests with at least one
    prefix_cached_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, **deltas: int) -> None:
        """Concurrent calls run on op threads: `+=` on a shared counter is not atomic."""
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)


class VllmEngine:
    def __init__(
        self,
        entry: Entry,
        catalog: Catalog,
        info: WeightsInfo,
        settings: VllmSettings,
        dtype: str,
        mode: str,
    ) -> None:
        self.entry = entry
        self.info = info
        self.dtype = dtype
        self.mode = mode
        self.settings = settings
        self.tokenizer = load_tokenizer(info.model_dir, catalog, entry)
        cfg = read_config(info.model_dir, catalog, entry)
        vocab = int(cfg.get("vocab_size", 0) or 0)
        self.n_positions = int(cfg.get("n_positions") or cfg.get("max_position_embeddings") or 1024)
        self.max_len = min(entry.limits.max_seq_len, self.n_positions)
        self.eos_id = valid_id(cfg.get("eos_token_id"), vocab, None)
        self.bos_id = valid_id(cfg.get("bos_token_id"), vocab, self.eos_id if self.eos_id is not None else 0)
        # vLLM renders the conversation itself, from the same files: this only says whether it can.
        self.chat_template = model_chat_template(info.model_dir, catalog, entry) is not None
        self.max_model_len = min(self.n_positions, entry.limits.max_seq_len + entry.limits.max_new_tokens)
        self.counters = Counters()
        self.grammars = Grammars(self.tokenizer, vocab or self.tokenizer.get_vocab_size(), self.eos_id)
        self.process: VllmProcess | None = None
        self.served_name = entry.id
        self._endpoint: Endpoint | None = None
        self.version: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, token) -> dict:
        t0 = time.perf_counter()
        if self.settings.url:
            self._endpoint = Endpoint(self.settings.url, self.settings.endpoint_key())
            self._connect()
        else:
            self.process = VllmProcess(
                self.settings, self.info.model_dir, self.entry.id, self.dtype, self.max_model_len, self.mode == "eager"
            )
            self.process.start(token)
            self.version = self.process.version
        return {"load_s": round(time.perf_counter() - t0, 6), "compile_s": 0.0, "warmup_s": 0.0}

    def _connect(self) -> None:
        ep = self._endpoint
        assert ep is not None
        try:
            models = ep.get_json("/v1/models").get("data") or []
            self.version = str(ep.get_json("/version").get("version"))
        except (EngineHttpError, ValueError, AttributeError):
            raise WorkerError(
                "engine_unavailable", "the vLLM endpoint (runtime.engines.vllm.url) did not answer; is it running?"
            ) from None
        names = [m.get("id") for m in models if isinstance(m, dict)]
        if self.entry.id not in names:
            if not names:
                raise WorkerError("engine_unavailable", "the vLLM endpoint serves no model")
            self.served_name = str(names[0])  # an operator-run server names its model its own way

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    @property
    def endpoint(self) -> Endpoint:
        if self._endpoint is not None:
            return self._endpoint
        assert self.process is not None
        return self.process.endpoint

    def health(self) -> str:
        """ok | starting | restarting | failed | stopped | unreachable."""
        if self.process is not None and self.process.state != "ready":
            return self.process.state
        try:
            return "ok" if self.endpoint.get("/health", timeout=1.0)[0] == 200 else "unhealthy"
        except EngineHttpError:
            return "unreachable"

    def engine_metrics(self) -> dict | None:
        """vLLM's own counters (its /metrics): requests finished by reason, requests running and
        waiting now, tokens generated. Requests a client abandoned (a cancel) are not "finished"
        there; they leave `running` and stop adding to `generation_tokens`."""
        try:
            status, body = self.endpoint.get("/metrics", timeout=2.0)
        except EngineHttpError:
            return None
        if status != 200:
            return None
        out: dict = {"finished": {}, "running": 0, "waiting": 0, "generation_tokens": 0}
        for line in body.decode("utf-8", "replace").splitlines():
            if not line.startswith("vllm:"):
                continue
            labels, _, raw = line.rpartition(" ")
            try:
                value = int(float(raw))
            except ValueError:
                continue
            name = labels.split("{", 1)[0]
            if name == "vllm:request_success_total":
                reason = labels.split('finished_reason="', 1)[-1].split('"', 1)[0]
                out["finished"][reason] = out["finished"].get(reason, 0) + value
            elif name == "vllm:num_requests_running":
                out["running"] += value
            elif name == "vllm:num_requests_waiting":
                out["waiting"] += value
            elif name == "vllm:generation_tokens_total":
                out["generation_tokens"] += value
        return out

    def prefix_report(self) -> dict:
        """vLLM's prefix caching as its answers report it (the bytes are inside vLLM's own KV
        cache, which it does not report per prefix)."""
        c = self.counters
        if self.settings.url:  # a server started elsewhere: on if its answers carry the count
            enabled = c.prefix_lookups > 0
        else:
            enabled = "--no-enable-prefix-caching" not in self.settings.args
        return {
            "enabled": enabled,
            "engine": ENGINE,
            "lookups": c.prefix_lookups,
            "hits": c.prefix_hits,
            "hit_rate": round(c.prefix_hits / c.prefix_lookups, 4) if c.prefix_lookups else None,
            "cached_tokens": c.prefix_cached_tokens,
        }

    def status(self) -> dict:
        p = self.process
        return {
            "name": ENGINE,
            "version": self.version,
            "health": self.health(),
            "managed": p is not None,
            "pid": p.pid if p else None,
            "restarts": p.restarts if p else 0,
            "last_error": p.last_error if p else None,
            "ready_s": p.ready_s if p else None,
            # Where a started server's internal ports are: "private" (its own network namespace)
            # or "host" (the system refused one). Its HTTP is a Unix socket only this user reaches.
            "network": p.network if p else None,
            "requests_sent": self.counters.requests,
            "failures": self.counters.failures,
            "in_flight": self.counters.in_flight,
            "aborts": self.counters.aborts,
            "abort_refused": self.counters.abort_refused,
            "completion_tokens": self.counters.completion_tokens,
            "engine_metrics": self.engine_metrics(),
        }

    # -- accounting (what `status` and `unload` report for any loaded model) ----------------------
    def parameters(self) -> int:
        return int(self.info.parameters or 0)

    def bytes_on_device(self) -> int:
        # The weights live in the engine's process; their size is what the model occupies there.
        return int(self.info.weight_bytes)

    # -- generation -----------------------------------------------------------------------------
    def encode(self, texts: list[str], max_new: int, seq_len: int) -> list[list[int]]:
        """Prompt token ids, exactly as CausalLM.prepare makes them (parity with the HF path)."""
        return prompt_ids(self.tokenizer, texts, min(seq_len, self.n_positions - max_new), self.bos_id)

    def request(
        self, p: GenParams, prompts: list[list[int]] | None, messages: list[dict] | None = None, *, ignore_eos=False
    ) -> tuple[str, dict]:
        body: dict = {
            "model": self.served_name,
            "max_tokens": p.max_new_tokens,
            "temperature": p.temperature,
            "top_p": p.top_p,
            "top_k": p.top_k if p.top_k > 0 else -1,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "skip_special_tokens": True,
            "ignore_eos": ignore_eos,
        }
        if p.seed is not None:
            body["seed"] = p.seed
        if self.eos_id is not None and not ignore_eos:
            body["stop_token_ids"] = [self.eos_id]
        if messages is not None:
            body["messages"] = messages
            if p.logprobs:
                body["logprobs"] = True
                body["top_logprobs"] = p.logprobs
            return "/v1/chat/completions", body
        body["prompt"] = prompts
        if p.logprobs:
            body["logprobs"] = p.logprobs
            body["return_tokens_as_token_ids"] = True
        return "/v1/completions", body

    def stream(self, path: str, body: dict, token, n: int) -> Iterator[dict]:
        """The events of one request. A request that ends here before vLLM finished it (a cancel,
        a stop sequence vLLM does not know of, an error) is aborted in vLLM by its id as well:
        closing the socket is not enough. vLLM drops a request whose client went away only when
        the disconnect reaches the request's generator; when it arrives while vLLM waits for the
        socket to drain (a reader that fell behind), that generator is left behind and every
        prompt of the request runs to its last token."""
        token.check()  # a call cancelled before it started sends nothing
        rid = f"tpu-mcp-{secrets.token_hex(12)}"
        once = threading.Lock()  # one abort, from the cancel's watcher or from here
        sent = threading.Event()

        def abort() -> None:
            if once.acquire(blocking=False):
                try:
                    self.abort(path, rid, n)
                finally:
                    sent.set()
            else:
                sent.wait(10.0)  # the call ends once vLLM was told (the watcher's abort in flight)

        finished = False
        try:
            yield from self.endpoint.stream(path, body, token, headers={"X-Request-Id": rid}, on_cancel=abort)
            finished = True
        except EngineHttpError as exc:
            finished = exc.status is not None  # refused with a status: vLLM runs nothing of it
            raise
        finally:
            if not finished:
                abort()

    def abort(self, path: str, rid: str, n: int) -> None:
        """Aborts the request `rid` (the X-Request-Id it was sent with) in vLLM: every prompt of
        it, running or queued. A server without the abort endpoint (another vLLM, an operator's
        server without --enable-scale-out) refuses it: the closed socket is then all there is."""
        # vLLM's ids: "cmpl-<rid>-<prompt>" for a completion, "chatcmpl-<rid>" for a chat.
        ids = [f"chatcmpl-{rid}"] if path.endswith("/chat/completions") else [f"cmpl-{rid}-{i}" for i in range(n)]
        try:
            status = self.endpoint.post(ABORT_PATH, {"request_ids": ids}, timeout=5.0)
        except EngineHttpError as exc:
            status = exc.status
        self.counters.add(aborts=1)
        if status != 200:
            self.counters.add(abort_refused=1)
            logs.debug("vllm abort refused", model=self.entry.id, status=status)

    def infer(self, args: dict, ctx) -> dict:
        g = parse_generation(self.entry, args, self.max_len)
        p = g.params
        if g.messages is not None and not self.chat_template:
            raise no_chat_template(self.entry)
        if g.tools is not None or any(m["role"] == "tool" or "tool_calls" in m for m in g.messages or []):
            raise invalid(
                f"args.tools: model {self.entry.id!r} runs on vLLM, which takes no tools here; use a torch model"
            )
        prompts = self.encode(g.texts, p.max_new_tokens, g.seq_len) if g.texts is not None else None
        n = len(prompts) if prompts is not None else 1
        seqs = [_Seq(len(prompts[i]) if prompts else 0, TextStream(self.decode, p.stop)) for i in range(n)]
        path, body = self.request(p, prompts, g.messages)
        compile_ms = None
        if p.response_format is not None:
            # Checked and compiled here as on the torch path (the same bounds and refusals); vLLM
            # constrains the sampling, and the ids it returns are followed by the same grammar
            # here, which says whether each answer completed it.
            compiled = self.grammars.compile(p.response_format)
            compile_ms = round(compiled.compile_s * 1000, 3)
            for s, m in zip(seqs, compiled.matchers(n), strict=True):
                s.constraint = Constraint(compiled.kind, m)
            body["structured_outputs"] = p.response_format.structured_outputs
        salt = parse_prefix_key(args)
        if salt:
            # vLLM's prefix cache partitioned as the worker's own is: by the caller's key.
            body["cache_salt"] = salt
        t0 = time.perf_counter()
        t0_us = now_us()
        first: float | None = None
        first_us: int | None = None
        stopped: str | None = None
        cached: int | None = None  # vLLM's prompt tokens from its prefix cache (one count per request)
        self.counters.add(requests=1, in_flight=1)
        try:
            for event in self.stream(path, body, ctx.token, n):
                usage = event.get("usage")
                if usage and g.messages is not None:
                    seqs[0].prompt_tokens = int(usage.get("prompt_tokens") or 0)
                if usage and _cached_tokens(usage) is not None:
                    cached = _cached_tokens(usage)
                for choice in event.get("choices") or []:
                    i = int(choice.get("index", 0))
                    if not 0 <= i < len(seqs) or seqs[i].finish is not None:
                        continue  # a sequence already done here (a stop sequence matched)
                    ids = [int(t) for t in choice.get("token_ids") or []]
                    if ids and first is None:
                        first = time.perf_counter()
                        first_us = now_us()
                    delta = self._advance(seqs[i], ids, choice, p)
                    if p.stream and delta:
                        self._send_delta(ctx, seqs, i, delta, p)
                if all(s.finish is not None for s in seqs) and any(s.stream.stopped for s in seqs):
                    # A stop sequence matched here, which vLLM does not know of: closing the
                    # stream aborts what it still runs. Otherwise read on to its usage and [DONE].
                    break
        except Cancelled:
            stopped = getattr(ctx.token, "reason", None) or "cancelled"
        except EngineHttpError as exc:
            self.counters.add(failures=1)
            raise self._engine_error(exc) from None
        finally:
            self.counters.add(in_flight=-1)
        elapsed = time.perf_counter() - t0
        for s in seqs:
            if s.finish is None:
                s.finish = stopped or "length"
                s.stream.finish()  # the text held back for a stop that can no longer match
        out = self._result(seqs, g, first, t0, elapsed, cached)
        # The engine's own prefill and decode, as the loop's spans are (queueing in vLLM included
        # in prefill: the engine does not say when it took the request).
        trace = getattr(ctx, "trace", None)
        if first_us is not None:
            span(trace, "prefill", t0_us, first_us, engine="vllm", prompts=n)
            span(trace, "decode", first_us, now_us(), engine="vllm", new_tokens=max(out["new_tokens"], default=0))
        if compile_ms is not None:
            out["grammar_compile_ms"] = compile_ms
        return out

    def _advance(self, s: _Seq, ids: list[int], choice: dict, p: GenParams) -> str:
        """Takes a chunk of generated ids as the decode loop takes tokens (generation/loop.py
        `_accept`): EOS ends the sequence, a stop sequence cuts it (ids after the one that
        completed it are dropped); returns the newly final text."""
        lps = self._logprobs(choice, ids) if p.logprobs else []
        out = ""
        for k, t in enumerate(ids):
            s.ids.append(t)
            if k < len(lps):
                s.logprobs.append(lps[k])
            if t == self.eos_id:
                s.finish = "stop"
                return out + s.stream.finish()
            out += s.stream.push(t)
            if s.constraint is not None:
                s.constraint.advance(t)
            if s.stream.stopped:
                s.finish = "stop"
                return out
        reason = choice.get("finish_reason")
        if reason is not None:
            # vLLM: "stop" = an EOS / stop token, "length" = max_tokens; "abort" cannot reach here.
            s.finish = "stop" if reason == "stop" else "length"
            out += s.stream.finish()
        return out

    def _send_delta(self, ctx, seqs: list[_Seq], i: int, delta: str, p: GenParams) -> None:
        done = sum(len(x.ids) for x in seqs)
        ctx.progress(done, p.max_new_tokens * len(seqs), delta, delta={"index": i, "text": delta})

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _logprobs(self, choice: dict, ids: list[int]) -> list[dict]:
        lp = choice.get("logprobs") or {}
        out = []
        if "content" in lp:  # chat: [{token, logprob, top_logprobs: [{token, logprob}]}]
            for item, tid in zip(lp.get("content") or [], ids, strict=False):
                out.append(
                    {
                        "token": self._token_text(tid),
                        "logprob": item.get("logprob"),
                        "top": [
                            {"token": t.get("token"), "logprob": t.get("logprob")}
                            for t in item.get("top_logprobs") or []
                        ],
                    }
                )
            return out
        for tid, value, top in zip(ids, lp.get("token_logprobs") or [], lp.get("top_logprobs") or [], strict=False):
            alts = sorted(((self._token_text(_id_of(k)), v) for k, v in (top or {}).items()), key=lambda kv: -kv[1])
            out.append(
                {"token": self._token_text(tid), "logprob": value, "top": [{"token": t, "logprob": v} for t, v in alts]}
            )
        return out

    def _token_text(self, tid: int | None) -> str:
        return "" if tid is None else self.tokenizer.decode([tid], skip_special_tokens=False)

    def _result(
        self, seqs: list[_Seq], g: GenCall, first: float | None, t0: float, elapsed: float, cached: int | None
    ) -> dict:
        completion = sum(len(s.ids) for s in seqs)
        self.counters.add(completion_tokens=completion)
        generations = []
        for s in seqs:
            gen: dict = {
                "text": s.stream.text,
                "finish_reason": s.finish,
                "usage": {"prompt_tokens": s.prompt_tokens, "completion_tokens": len(s.ids)},
            }
            if g.params.logprobs:
                gen["logprobs"] = s.logprobs
            if s.constraint is not None:
                gen.update(s.constraint.report(cut=s.stream.stopped))
            if cached is not None and len(seqs) == 1:
                gen["prefix_cached_tokens"] = cached
            generations.append(gen)
        out: dict = {
            "task": "text-generation",
            "texts": [s.stream.text for s in seqs],
            "new_tokens": [len(s.ids) for s in seqs],
            "token_ids": [s.ids for s in seqs],
            "generations": generations,
            "ttft_ms": round((first - t0) * 1000, 3) if first is not None else None,
            "tokens_per_s": round(completion / elapsed, 3) if elapsed > 0 else None,
            "engine": ENGINE,
        }
        if cached is not None:
            # vLLM's streamed usage counts the first prompt's cached tokens (one number a request).
            out["prefix_cached_tokens"] = cached
            self.counters.add(prefix_lookups=1, prefix_hits=int(cached > 0), prefix_cached_tokens=cached)
        if g.params.seed is not None:
            out["seed"] = g.params.seed
        return out

    def _engine_error(self, exc: EngineHttpError) -> WorkerError:
        if exc.status is not None and 400 <= exc.status < 500 and exc.status not in (401, 403):
            logs.warn("vllm refused a request", model=self.entry.id, status=exc.status, error=exc.message)
            return invalid(f"vLLM refused the request: {exc.message[:200]}")
        state = self.process.state if self.process is not None else "external"
        logs.error("vllm request failed", model=self.entry.id, status=exc.status, error=exc.message, state=state)
        if state in ("restarting", "starting"):
            return WorkerError("engine_unavailable", "the vLLM engine is restarting after a crash; call again shortly")
        return WorkerError(
            "engine_unavailable", f"the vLLM engine did not answer ({exc.message[:80]}); see get_runtime_status"
        )


def _cached_tokens(usage: dict) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens` (vLLM with --enable-prompt-tokens-details)."""
    details = usage.get("prompt_tokens_details") or {}
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _id_of(key: str) -> int | None:
    # return_tokens_as_token_ids spells tokens "token_id:123".
    try:
        return int(key.rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None
