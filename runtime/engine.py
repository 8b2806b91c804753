"""The engine: requests in, streamed tokens out, through a compiled plan on this machine's backend.

Each step asks the scheduler (runtime/scheduler.py) which rows to compute, runs the plan's prefill
phase over all prefill pieces (one chunk of rows across sequences) and one decode phase over all
decoding sequences (the batched-decode phase, or the single-sequence one when only one decodes),
then picks each finished row's next token: the fused tail's argmax when the request is greedy and
nothing reshapes its logits, else its own sampler on the logits row. Text streams out as it is
detokenized, held back only as long as it might still become a stop string.

The backend comes from the plan (a CPU plan runs on the cpu driver, a GPU plan on its GPU's) or from
`device` ("emu": a GPU plan's own kernels on the host); runtime/executor.py drives it.

Constrained requests (Request.grammar: runtime/grammar.py) have a token mask for each row of a step:
their grammar's allowed next tokens, computed on the host while the device runs the step's layers
(the executor's late state: on a worker thread beside a host backend's launches, between a GPU's
queued layers and its tail), and applied by the fused tail's argmax (greedy) or by the sampler on
the logits row (sampled). A free row's mask allows every token, so one batch mixes both, and the
masks cost each step what the records' `mask_s` says.

Pipelined decode (the drivers whose launches overlap the host, or `pipelined=True`): when every
running sequence is greedy and decoding, the step after next is queued before this step's tokens
are read: the fused tail writes each token into the slot the next step's embedding reads, and the
host learns it one step later. A sequence that stops at a token it learns late has had one more row
computed, which is discarded; the tokens are those of the unpipelined engine.

Decode bursts (the drivers that run one in a call: cpu). When nothing waits or prefills and every
decoding row is greedy and free, one step runs as many decode steps as fit in BURST_S at the last
step's speed, in one native call (Driver.replay_steps): the host pays a step's Python once for them, a
fifth of a small model's token. Their tokens stream out together; a sequence that stops inside a burst
had its later rows computed, and they are dropped. Records give each step's `decode_steps`.

    engine = Engine.load("m.plan")
    for ev in engine.generate(["Once upon a time", Request("The capital of France is", max_tokens=8)]):
        print(ev.index, repr(ev.text), ev.finish_reason or "")
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import numpy as np

from llmplan.core.devices import local_cpu
from llmplan.core.errors import InputError
from llmplan.core.numerics import EVERY_TOKEN, NO_TOKEN, PAGE, allowed, mask_words, pages_for
from llmplan.core.plan_records import PlanBody, PlanHeader
from llmplan.core.planfile import read_header, read_plan, recompile_hint
from llmplan.models.gguf import GGUFFile, is_gguf
from llmplan.models.tokenizer import Tokenizer, load_tokenizer

from .driver import driver_for
from .executor import Executor, PendingStep
from .grammar import Grammar, Matcher, Vocabulary
from .kv_blocks import BlockPool
from .requests import Event, Request, RequestError, Result, SamplingParams, StopText
from .sampler import Sampler, token_logprobs
from .scheduler import Scheduler, Sequence, Step
from .trace import MASKS, Trace, span

RECORDS_KEPT = 10_000
# A greedy decode burst runs at most this long (its tokens stream out together at its end, and a request
# that arrives meanwhile waits for it) and at most this many steps
BURST_S, MAX_BURST = 0.03, 64
PLACEHOLDER = -1  # a sequence's last token while it is still on the device (pipelined decode)


@dataclass
class _Run:
    """The engine's state of one request (Sequence.state)."""

    request: Request
    result: Result
    sampler: Sampler
    stream: Any  # the tokenizer's StreamDecoder
    stops: StopText
    submitted: float
    matcher: Matcher | None = None  # a constrained request's place in its grammar
    mask: np.ndarray | None = None  # the mask its next token was chosen under (a sampled row's, applied on the host)
    admitted: float = 0.0
    first: float = 0.0


@dataclass
class _Queued:
    """A pipelined decode step on its way: its sequences (row order) and its outputs' copies."""

    seqs: list[Sequence]
    pending: PendingStep


class Engine:
    def __init__(self, plan_path: str, header: PlanHeader, body: PlanBody, model: GGUFFile, executor: Executor,
                 load_seconds: float, max_seqs: int, kv_blocks: int, pipelined: bool, bursts: bool):
        self.plan_path, self.header, self.body, self.model = plan_path, header, body, model
        self.limits = header.limits
        self.executor = executor
        self.trace = executor.trace
        self.device = executor.driver.name
        self.pipelined, self.bursts = pipelined, bursts
        self._step_s: float | None = None  # the last decode step's seconds (a burst's: per step)
        self._burst = 0  # decode steps of this engine step
        self._queued: _Queued | None = None
        self.tokenizer: Tokenizer = load_tokenizer(model)
        self.load_seconds = load_seconds
        self.pages_per_seq = body.phases["decode"].dims["pages"]  # the page table rows the plan takes
        self.pool = BlockPool(kv_blocks, PAGE)
        self.scheduler = Scheduler(self.pool, max_seqs, self.limits.chunk)
        self.records: deque[dict[str, Any]] = deque(maxlen=RECORDS_KEPT)
        self._seqs: dict[int, Sequence] = {}
        self._events: list[Event] = []
        self._next_id = 0
        self._steps = 0
        self._notes = 0  # executor notes already put in a record
        mask = body.phases["decode"].state.get("mask")
        words = mask.shape[1] if mask is not None else mask_words(body.config["vocab_size"])
        self.grammars = Vocabulary(self.tokenizer, words)
        # whether the fused tail takes masks (a plan whose tail was not fused picks constrained tokens on the host)
        self._masked_tail = mask is not None
        self._masker: ThreadPoolExecutor | None = None  # computes a step's masks beside its launches
        self._mask_s, self._masked = 0.0, 0  # this step's host seconds computing masks, and rows masked

    @classmethod
    def load(cls, plan: str | os.PathLike, device: str | None = None, model_path: str | None = None,
             max_seqs: int | None = None, kv_blocks: int | None = None, pipelined: bool | None = None,
             replay: bool = True, poison: bool = False, trace: Trace | None = None,
             threads: int | None = None, bursts: bool | None = None) -> Engine:
        """An engine for a plan file on `device` (default: the plan's own backend; "emu" runs a GPU
        plan's kernels on the host). `max_seqs` (at most the plan's) bounds the sequences of a batched
        step; `kv_blocks` sizes the K/V pool (default: the plan's, enough for max_seqs sequences of the
        full context). `pipelined` (default: where the driver overlaps the host) queues greedy decode
        steps ahead; `replay` records decode buckets for replay where the driver has graphs; `poison`
        checks that every kernel writes all it should (slow: tests); `trace` records the load and every
        step (runtime/trace.py). `threads` is how many host threads the kernels run on (the cpu driver's
        pool, the emulated GPU's; default every core). `bursts` (default: where the driver runs one in a
        call) lets a step run several greedy decode steps (Driver.replay_steps)."""
        t0 = time.perf_counter()
        plan = os.fspath(plan)
        if is_gguf(plan):
            raise InputError(f"{plan} is a GGUF model, not a plan: compile it first (plan compile {plan} -o M.plan, or "
                             "llmplan.plans.compile.plan_for), or give it to plan run, which compiles on the fly")
        header, _ = read_header(plan)
        backend = header.device.backend
        device = device or backend
        if device == "emu" and backend == "cpu":
            raise InputError(f"{plan} is a CPU plan: the emulated GPU runs GPU plans (plan compile ... --device sm_90)")
        if device not in ("emu", backend):
            raise InputError(f"{plan} was compiled for {backend} ({header.device.arch}), not {device}: "
                             f"run it on {backend}, or recompile with plan compile ... --device {device}")
        path = model_path or header.model.path
        if not os.path.exists(path):
            raise InputError(f"{plan}: the model it was compiled from, {path}, is not there: pass --model PATH")
        with span(trace, "open model", "load"):
            model = GGUFFile(path)
        key = local_cpu().key if device == "cpu" else None  # the GPU drivers check their device at load
        with span(trace, "read plan", "load"):
            header, body = read_plan(plan, key, model)
        limits = header.limits
        max_seqs = limits.max_seqs if max_seqs is None else max_seqs
        if not 1 <= max_seqs <= limits.max_seqs:
            raise InputError(f"{plan} runs at most {limits.max_seqs} sequences per step, asked for {max_seqs}: "
                             f"recompile with plan compile ... --max-seqs {max_seqs}")
        kv_blocks = limits.kv_blocks if kv_blocks is None else kv_blocks
        if kv_blocks < 2:
            raise InputError(f"kv_blocks must be at least 2 (one block and one of headroom), got {kv_blocks}")
        try:
            driver = driver_for(device)
        except InputError as e:
            dev = header.device
            raise InputError(f"{plan}: compiled for {dev.arch} ({dev.key}): {e}; run it on the emulated GPU "
                             f"(--device emu), or {recompile_hint(header, 'cpu')}") from None
        if threads is not None and threads < 1:
            raise InputError(f"--threads must be at least 1, got {threads}")
        driver.threads = threads
        executor = Executor(header, body, driver, model, kv_blocks, poison=poison, replay=replay, trace=trace)
        pipelined = driver.overlaps if pipelined is None else pipelined
        bursts = driver.bursts if bursts is None else bursts
        engine = cls(plan, header, body, model, executor, time.perf_counter() - t0, max_seqs, kv_blocks, pipelined,
                     bursts)
        if trace is not None:
            trace.attach(driver)
            trace.complete("load", "load", t0, time.perf_counter(), plan=plan, device=device)
        return engine

    # --- requests ------------------------------------------------------------------------------

    def submit(self, request: Request) -> int:
        """Queue a request; returns its id. Raises RequestError for a request that cannot run."""
        if not isinstance(request, Request):
            raise RequestError(f"expected a Request, got {type(request).__name__}")
        tok = self.tokenizer
        request.validate(tok.n_tokens)
        ids = (tok.encode(request.prompt, add_special=True, parse_special=True) if isinstance(request.prompt, str)
               else [int(t) for t in request.prompt])
        if not ids:
            raise RequestError("the prompt tokenizes to nothing; give some text")
        ctx = self.limits.ctx
        if len(ids) >= ctx:
            if not request.truncate:
                raise RequestError(f"the prompt has {len(ids)} tokens; the plan's context holds {ctx}: shorten it, "
                                   "truncate it (Request.truncate, plan run --truncate), or compile with a larger --ctx")
            keep = [ids[0]] if ids[0] == tok.bos else []
            ids = keep + ids[len(ids) - (ctx - 1 - len(keep)):]
        matcher = None
        if request.grammar is not None:
            if not isinstance(request.grammar, Grammar):
                raise RequestError(f"grammar must be a runtime.grammar.Grammar, got {type(request.grammar).__name__}")
            matcher = self.grammars.matcher(request.grammar)
        sid = self._next_id
        self._next_id += 1
        run = _Run(request, Result(list(ids)), Sampler(request.params), tok.stream(), StopText(request.stop),
                   time.perf_counter(), matcher)
        seq = Sequence(sid, list(ids), min(len(ids) + request.max_tokens, ctx), state=run)
        self._seqs[sid] = seq
        if request.max_tokens == 0:
            self._finish(seq, "length")
        else:
            self.scheduler.add(seq)
        return sid

    def cancel(self, request_id: int) -> None:
        """Stop a request wherever it is (queued, mid-prefill, decoding); its finish event comes next step."""
        seq = self._seqs.get(request_id)
        if seq is not None:
            self._finish(seq, "cancelled")

    @property
    def idle(self) -> bool:
        return self.scheduler.idle and not self._events

    def generate(self, requests: Iterable[Request | str], params: SamplingParams | None = None) -> Iterator[Event]:
        """Run requests together, yielding their events as they happen (Event.index: the position in
        `requests`). A text is a Request with `params`. A request that cannot run yields one event with
        finish_reason "error"; the others carry on. Closing the iterator early cancels what is left."""
        mine: dict[int, int] = {}
        for i, r in enumerate(requests):
            r = Request(r, params=params or SamplingParams()) if isinstance(r, str) else r
            try:
                mine[self.submit(r)] = i
            except RequestError as e:
                yield Event(-1, index=i, finish_reason="error", result=Result([], finish_reason="error", error=str(e)))
        try:
            while mine:
                for ev in self.step():
                    if ev.request in mine:
                        ev.index = mine[ev.request]
                        if ev.finish_reason:
                            del mine[ev.request]
                        yield ev
        finally:
            for sid in mine:
                self.cancel(sid)

    def run(self, requests: Iterable[Request | str], params: SamplingParams | None = None) -> list[Result]:
        """generate() to the end: one Result per request, in order."""
        requests = list(requests)
        out: list[Result | None] = [None] * len(requests)
        for ev in self.generate(requests, params):
            if ev.finish_reason:
                out[ev.index] = ev.result
        return out

    def chat(self, messages: list[dict[str, Any]], max_tokens: int = 256, params: SamplingParams = SamplingParams(),
             stop: tuple[str, ...] = ()) -> Iterator[Event]:
        """One conversation through the model's chat template (sandboxed), streamed."""
        ids = self.tokenizer.encode_chat(messages)
        return self.generate([Request(ids, max_tokens, params, stop)])

    def kv_ceiling(self) -> dict[str, Any]:
        """How much the K/V pool holds: blocks, tokens, bytes, and how many sequences of a length fit."""
        cache = self.executor.cache
        block_bytes = cache.nbytes // cache.shape[2]
        lengths = sorted({self.limits.ctx, *(n for n in (256, 1024, 4096) if n < self.limits.ctx)})
        return {"blocks": self.pool.total, "block_tokens": PAGE, "tokens": self.pool.total * PAGE,
                "block_bytes": block_bytes, "bytes": cache.nbytes,
                "sequences": {n: self.pool.total // pages_for(n) for n in lengths}}

    # --- one step ------------------------------------------------------------------------------

    def step(self) -> list[Event]:
        """Compute one step (a decode burst: several); returns the events it produced (tokens, finishes)."""
        t0 = time.perf_counter()
        events, self._events = self._events, []
        kernel_s = 0.0
        if self._queued is not None and not self._can_pipeline():
            kernel_s += self._consume()
        with span(self.trace, "schedule", "scheduler"):
            plan = self.scheduler.schedule()
        for seq, why in plan.refused:
            seq.state.result.error = why
            self._finish(seq, "error")
        for sid in plan.admitted:
            run = self._seqs[sid].state
            run.admitted = run.admitted or time.perf_counter()
        if plan.prefill:
            kernel_s += self._prefill(plan)
        if plan.decode:
            kernel_s += self._decode(plan)
        events += self._events
        self._events = []
        wall = time.perf_counter() - t0
        record = {"step": self._steps, "admitted": plan.admitted, "preempted": plan.preempted,
                  "prefill_rows": sum(n for _, n in plan.prefill), "prefill_seqs": len(plan.prefill),
                  "decode_rows": len(plan.decode), "decode_steps": self._burst, "free_blocks": self.pool.free_blocks,
                  "pipelined": self._queued is not None,
                  "host_s": round(wall - kernel_s, 6), "kernel_s": round(kernel_s, 6),
                  "masked_rows": self._masked, "mask_s": round(self._mask_s, 6)}
        self._mask_s, self._masked, self._burst = 0.0, 0, 0
        if len(self.executor.notes) > self._notes:  # said once: e.g. a decode bucket that runs directly
            record["notes"] = self.executor.notes[self._notes:]
            self._notes = len(self.executor.notes)
        self.records.append(record)
        if self.trace is not None:
            self.trace.complete("step", "step", t0, time.perf_counter(), **record)
        self._steps += 1
        return events

    def _table(self, seqs: list[Sequence]) -> np.ndarray:
        pages = np.zeros((len(seqs), self.pages_per_seq), np.int32)
        for j, s in enumerate(seqs):
            pages[j, :len(s.blocks)] = s.blocks
        return pages

    def _head(self, seqs: list[Sequence]) -> str:
        """The output a step needs for these sequences' next tokens: the fused tail's argmax, or logits."""
        wants = any(s.state.request.needs_logits or
                    (s.state.request.keep_prompt_logits and not s.state.result.ids) or
                    (s.state.matcher is not None and not self._masked_tail) for s in seqs)
        return "logits" if wants else "next_token"

    # --- token masks ----------------------------------------------------------------------------

    def _masks(self, rows: list[Sequence | None]) -> np.ndarray:
        """The mask of every row of a step's tail: a constrained sequence's grammar's, else every token."""
        t0 = time.perf_counter()
        out = np.full((len(rows), self.grammars.words), EVERY_TOKEN, np.int32)
        for j, s in enumerate(rows):
            run = s.state if s is not None else None
            if run is not None and run.matcher is not None and s.id in self._seqs:
                run.matcher.fill(out[j])
                run.mask = out[j]
                self._masked += 1
        t1 = time.perf_counter()
        self._mask_s += t1 - t0
        if self.trace is not None:
            self.trace.complete("masks", "masks", t0, t1, MASKS, rows=len(rows))
        return out

    def _late_masks(self, rows: list[Sequence | None]) -> dict[str, Any] | None:
        """The step's masks as late state, computed on a worker thread while the step's first launches
        run (None when no row is constrained; a plan whose tail takes no mask has them made now, for
        the sampler)."""
        if not any(s is not None and s.state.matcher is not None for s in rows):
            return None
        if not self._masked_tail:
            self._masks(rows)
            return None
        if self._masker is None:
            self._masker = ThreadPoolExecutor(1, thread_name_prefix="masks")
        return {"mask": self._masker.submit(self._masks, rows).result}

    def _prefill(self, plan: Step) -> float:
        seqs = [s for s, _ in plan.prefill]
        tokens, pos, last, ending = [], [], [], []
        for s, n in plan.prefill:
            tokens += s.tokens[s.computed:s.computed + n]
            pos += range(s.computed, s.computed + n)
            last.append(len(tokens) - 1)
            if s.computed + n == len(s.tokens):
                ending.append(s)
        row_seq = np.repeat(np.arange(len(seqs), dtype=np.int32), [n for _, n in plan.prefill])
        state = {"tokens": np.asarray(tokens, np.int32), "pos": np.asarray(pos, np.int32), "seq": row_seq,
                 "pages": self._table(seqs), "last": np.asarray(last, np.int32)}
        head = self._head(ending) if ending else None
        late = self._late_masks([s if s in ending else None for s in seqs]) if head else None
        t0 = time.perf_counter()
        with span(self.trace, "prefill", "step", rows=len(tokens), seqs=len(seqs)):
            out = self.executor.run("prefill", state, {"cache", head} if head else {"cache"}, late)
        seconds = time.perf_counter() - t0
        for j, (s, n) in enumerate(plan.prefill):
            self.scheduler.done(s, n)
            if s in ending:
                self._next(s, out[head][j], head)
        return seconds

    def _decode_state(self, seqs: list[Sequence], fed: bool) -> dict[str, np.ndarray]:
        """The decode step state; `fed`: the tokens are already in the device slot (the last step's)."""
        state = {"pos": np.array([s.computed for s in seqs], np.int32),
                 "seq": np.arange(len(seqs), dtype=np.int32), "pages": self._table(seqs)}
        if not fed:
            state["tokens"] = np.array([s.tokens[-1] for s in seqs], np.int32)
        return state

    def _decode(self, plan: Step) -> float:
        seqs = plan.decode
        head = self._head(seqs)
        phase = "decode" if len(seqs) == 1 else "decode-batch"
        if self.pipelined and head == "next_token" and not plan.prefill:
            self._burst = 1
            return self._decode_ahead(phase, seqs)
        steps = self._burst_steps(plan) if head == "next_token" else 1
        if steps > 1:
            return self._decode_burst(phase, seqs, steps)
        self._burst = 1
        late = self._late_masks(list(seqs))
        t0 = time.perf_counter()
        with span(self.trace, "decode", "step", rows=len(seqs), pipelined=False):
            out = self.executor.run(phase, self._decode_state(seqs, fed=False), {"cache", head}, late)
        seconds = self._step_s = time.perf_counter() - t0
        for j, s in enumerate(seqs):
            self.scheduler.done(s, 1)
            self._next(s, out[head][j], head)
        return seconds

    # --- decode bursts ------------------------------------------------------------------------

    def _burst_steps(self, plan: Step) -> int:
        """How many greedy decode steps this step runs in one call: what fits in BURST_S at the last
        step's speed, when bursts are on, nothing waits or prefills, and no row is constrained; never
        past a sequence's limit, nor past the K/V blocks it can have without preempting anyone. A
        sequence that stops inside a burst had its later rows computed, and they are dropped."""
        if not self.bursts or plan.prefill or self.scheduler.waiting or not self._step_s:
            return 1
        if any(s.state.matcher is not None for s in plan.decode):
            return 1
        steps = min(MAX_BURST, int(BURST_S / self._step_s))
        for s in plan.decode:
            steps = self.scheduler.reserve(s, min(steps, s.limit - len(s.tokens)))
        return max(steps, 1)

    def _decode_burst(self, phase: str, seqs: list[Sequence], steps: int) -> float:
        t0 = time.perf_counter()
        with span(self.trace, "decode", "step", rows=len(seqs), steps=steps):
            tokens = self.executor.burst(phase, self._decode_state(seqs, fed=False), steps)
        seconds = time.perf_counter() - t0
        self._step_s, self._burst = seconds / steps, steps
        for row in tokens:
            for j, s in enumerate(seqs):
                if s.id in self._seqs:
                    self.scheduler.done(s, 1)
                    self._next(s, row[j], "next_token")
        return seconds

    # --- pipelined decode ---------------------------------------------------------------------

    def _can_pipeline(self) -> bool:
        """Whether the next schedule() is exactly the queued step's sequences decoding again, in the
        same order, with nothing to admit, nobody at its limit and no preemption: then its tokens can
        stay on the device."""
        q, sch = self._queued, self.scheduler
        if sch.waiting or sch.running != q.seqs:
            return False
        new_blocks = 0
        for s in q.seqs:
            if len(s.tokens) >= s.limit:
                return False
            new_blocks += -(-(s.computed + 1) // self.pool.page) > len(s.blocks)
        return new_blocks <= self.pool.free_blocks

    def _decode_ahead(self, phase: str, seqs: list[Sequence]) -> float:
        """Queue this decode step; then learn the tokens of the one queued before it."""
        fed = self._queued is not None
        if fed and seqs != self._queued.seqs:
            raise AssertionError("a pipelined step must decode the queued step's sequences")  # _can_pipeline's job
        late = None
        if any(s.state.matcher is not None for s in seqs):
            # this step's masks follow from the queued step's tokens: they are read (and the grammars
            # advanced) while this step's layers run, before its tail is queued
            def late_mask() -> np.ndarray:
                if fed:
                    self._consume()
                return self._masks(list(seqs))

            late = {"mask": late_mask}
        t0 = time.perf_counter()
        with span(self.trace, "decode", "step", rows=len(seqs), pipelined=True):
            pending = self.executor.queue(phase, self._decode_state(seqs, fed), {"cache", "next_token"}, late)
        seconds = time.perf_counter() - t0
        for s in seqs:
            if s.id in self._seqs:
                self.scheduler.done(s, 1, known=len(s.tokens) - (s.tokens[-1] == PLACEHOLDER))
        if fed and late is None:
            seconds += self._consume()
        self._queued = _Queued(list(seqs), pending)
        for s in seqs:
            if s.id in self._seqs:
                s.tokens.append(PLACEHOLDER)
        return seconds

    def _consume(self) -> float:
        """The queued step's tokens: each live sequence's placeholder becomes its token (a sequence that
        finished meanwhile had a speculative row: dropped)."""
        q, self._queued = self._queued, None
        t0 = time.perf_counter()
        with span(self.trace, "read tokens", "step", rows=len(q.seqs)):
            tokens = q.pending.result()["next_token"]
        seconds = time.perf_counter() - t0
        for j, s in enumerate(q.seqs):
            if s.id not in self._seqs:
                continue
            s.tokens.pop()  # the placeholder
            self._next(s, tokens[j], "next_token")
            if s.id in self._seqs:
                self.scheduler.publish(s, len(s.tokens))
        return seconds

    def _next(self, seq: Sequence, row: np.ndarray, head: str) -> None:
        """seq's next token from its output row; stream it and check the stops."""
        run = seq.state
        if head == "logits" and run.request.keep_prompt_logits and run.result.prompt_logits is None:
            run.result.prompt_logits = row.copy()
        if head == "next_token":
            token = int(row)
        elif run.matcher is not None:  # the grammar's mask on the host: what it forbids can never be drawn
            token = run.sampler(np.where(allowed(run.mask[None], len(row))[0], row, -np.inf), seq.tokens)
        else:
            token = run.sampler(row, seq.tokens)
        if run.matcher is not None and not self._advance(seq, token):
            return
        if not run.first:
            run.first = time.perf_counter()
        seq.tokens.append(token)
        run.result.ids.append(token)
        text, stopped = run.stops.push(run.stream.push(token))
        run.result.text += text
        want = run.request.logprobs
        self._events.append(Event(seq.id, token=token, text=text,
                                  logprobs=None if want is None else token_logprobs(row, token, want)))
        if stopped or self.tokenizer.is_eog(token) or (run.matcher is not None and run.matcher.finished):
            self._finish(seq, "stop", flush_stream=not stopped)
        elif len(seq.tokens) >= seq.limit:
            self._finish(seq, "length")

    def _advance(self, seq: Sequence, token: int) -> bool:
        """Move a constrained sequence's grammar past its token; False (the request ended in error) if
        its mask allowed no token or the grammar refuses this one."""
        run = seq.state
        why = f"{run.matcher.param}: allows no token here" if token == NO_TOKEN else ""
        if not why:
            try:
                run.matcher.consume(token)
            except RequestError as e:
                why = str(e)
        if why:
            run.result.error, run.result.error_param = why, run.matcher.param
            self._finish(seq, "error")
        return not why

    def _finish(self, seq: Sequence, reason: str, flush_stream: bool = True) -> None:
        run = seq.state
        self.scheduler.remove(seq)
        del self._seqs[seq.id]
        rest = ""
        if flush_stream:
            rest, _ = run.stops.push(run.stream.flush())
            rest += run.stops.flush()
        run.result.text += rest
        run.result.finish_reason = reason
        run.result.timings = self._timings(seq)
        self._events.append(Event(seq.id, text=rest, finish_reason=reason, result=run.result))

    def _timings(self, seq: Sequence) -> dict[str, float]:
        run, now = seq.state, time.perf_counter()
        n, n_prompt = len(run.result.ids), len(run.result.prompt_ids)
        admitted = run.admitted or now
        first = run.first or now
        prefill_s, decode_s = first - admitted, now - first
        return {"load_s": round(self.load_seconds, 4), "queue_s": round(admitted - run.submitted, 4),
                "prefill_s": round(prefill_s, 4), "decode_s": round(decode_s, 4),
                "ttft_s": round(first - run.submitted, 4), "prompt_tokens": n_prompt,
                "cached_tokens": seq.cached_tokens, "generated_tokens": n, "preemptions": seq.preemptions,
                "prefill_tok_s": round((n_prompt - seq.cached_tokens) / max(prefill_s, 1e-9), 2),
                "decode_tok_s": round(max(n - 1, 0) / max(decode_s, 1e-9), 2)}

