"""The executor: one walk over a phase's launch list for every backend, on top of a driver.

At load it allocates what the plan describes (one arena; the paged K/V cache; one step-state slot per
input of each phase, sized at the phase's bounds, at a fixed address; every weight in each device
layout its kernels read, made from the mapped GGUF; the rope tables) and loads the kernels. Each step
it writes the step state into its slots, binds every argument reference of every kernel call
(runtime/driver.py Region and Scalar, with the step's rows and sequences), launches the calls that
serve the wanted outputs, and queues the copies of those outputs to the host.

Decode buckets. In a decode phase every argument and grid is fixed for a given batch width: what
changes per step is read from the step-state slots. So a (phase, width, outputs) bucket's calls run
directly the first time (a warm-up: kernels loaded, caches touched), are recorded the second time and
replayed from then on, where the driver has graphs. A bucket whose recording fails says why, once,
in `notes`, and runs directly. Where recording costs no more than binding the calls for a direct run
(Driver.records_free: the cpu driver's graph is one native call) and no trace wants each launch once,
every bucket is recorded at its first visit, and prefill chunks are buckets too (by rows and sequences):
a chunk then costs one call, not a trip through Python per launch.
The decode phases' greedy tokens are written into their own `tokens` slot (the plan's "fed_by"), so
a step whose sequences are the last step's, in the same order, needs no token from the host; a burst
(`burst`) replays such a step several times, advancing the positions, in one driver call where the
driver has one (Driver.replay_steps).

Late state. A step may give some of its state late (`queue(..., late={name: make})`): the launches
that do not read those inputs are queued first, then each make() is called and its value written,
then the rest. The fused tail's token mask is the one: the host computes it (a constrained request's
grammar, given the last token) while the device runs the layers. A bucket queued so is recorded as
two graphs, before and from the first launch that reads a late input. A state input with a "default"
may be left out of a step: its slot then holds the default (written again only after a step that
gave it).

Poison mode (tests): before each launch every byte it writes (outputs, scratch, the K/V cells of its
rows) is set to 0xFF, a NaN in every float format; after it, every float it should have written is
checked not to be NaN (i32 outputs: not -1), so a kernel that skips part of its output fails.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from llmplan.core import layouts
from llmplan.core.errors import InputError
from llmplan.core.formats import ACTIVATION_FORMATS, dequantize, planes, value_bytes
from llmplan.core.numerics import rope_table
from llmplan.core.plan_records import (
    F32,
    I32,
    Buf,
    Cache,
    Launch,
    PlanBody,
    PlanHeader,
    Ref,
    RopeTable,
    Scratch,
    State,
    Weight,
    bound_shape,
)
from llmplan.models.gguf import GGUFFile

from .driver import Call, Driver, Pending, Region, Scalar
from .trace import Trace, span

POISON = 0xFF


class StepError(RuntimeError):
    """A kernel left part of its output unwritten (poison mode), or the step state does not fit the plan."""


@dataclass
class LoadRecord:
    weight_bytes: int = 0  # bytes of the weights the device holds
    copied_bytes: int = 0  # of which copies (relayouts), beyond the mapped file
    relayout_s: float = 0.0
    upload_s: float = 0.0
    tables: int = 0
    kernels_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in vars(self).items()}


@dataclass
class PendingStep:
    """A queued step: its outputs' copies to the host."""

    reads: dict[str, Pending]
    seconds: float = 0.0  # host time spent queuing it

    def result(self) -> dict[str, np.ndarray]:
        return {name: p.result() for name, p in self.reads.items()}


@dataclass
class Bucket:
    visits: int = 0
    graphs: list[Any] | None = None  # one per part of the step (two when it has late state)
    steps: int = 0  # replays
    failed: str = ""  # why it could not be recorded


def _bucket_key(phase: str, dims: dict[str, int], want: set[str], late: dict[str, Any]) -> tuple:
    return phase, dims["rows"], dims["seqs"], tuple(sorted(want)), tuple(sorted(late))


def _grid(grid: tuple, dims: dict[str, int]) -> tuple[int, int, int]:
    g = [d if isinstance(d, int) else -(-dims[d[0]] // d[1]) for d in grid]
    return tuple(g + [1] * (3 - len(g)))  # type: ignore[return-value]


class Executor:
    def __init__(self, header: PlanHeader, body: PlanBody, driver: Driver, model: GGUFFile, kv_blocks: int,
                 poison: bool = False, replay: bool = True, trace: Trace | None = None):
        self.header, self.body, self.driver, self.model = header, body, driver, model
        self.trace = trace
        self.phases = body.phases
        self.poison, self.replay = poison, replay and driver.graphs and not poison
        self.kv_blocks = kv_blocks
        self.load = LoadRecord()
        t0 = time.perf_counter()
        with span(trace, "kernels", "load"):
            driver.load(body, header)
        self.load.kernels_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.arena = driver.alloc(body.arena_bytes)
        shape = bound_shape(body.cache.shape, {"blocks": kv_blocks})
        self.cache = Region(driver.alloc(value_bytes("f16", shape)), 0, value_bytes("f16", shape), "f16", shape)
        self.slots = {ph: {name: driver.alloc(value_bytes(s.dtype, bound_shape(s.shape, p.dims)))
                           for name, s in p.state.items()} for ph, p in self.phases.items()}
        self._given: set[tuple[str, str]] = set()  # (phase, input) slots that hold a step's value, not the default
        for ph, p in self.phases.items():
            for name, s in p.state.items():
                if s.default is not None:
                    self._fill_default(ph, name)
        self.weights: dict[tuple[str, str], Region] = {}
        self.tables: dict[RopeTable, Region] = {}
        self._keep: list[np.ndarray] = []  # host arrays the host drivers use in place
        for p in self.phases.values():
            for launch in p.launches:
                for k in launch.kernels:
                    for ref in k.args:
                        if isinstance(ref, Weight):
                            self._weight(ref.name, ref.layout)
                        elif isinstance(ref, RopeTable):
                            self._rope_table(ref, p.dims)
        t1 = time.perf_counter()
        driver.sync()  # the uploads a GPU driver queued count as upload time
        self.load.upload_s += time.perf_counter() - t1
        if trace is not None:
            trace.complete("buffers, weights and tables", "load", t0, time.perf_counter(), **self.load.as_dict())
        self.buckets: dict[tuple, Bucket] = {}
        self._regions: dict[tuple, Region] = {}  # (phase, buf or state, which, dims) -> its memory
        self.notes: list[str] = []  # what a caller should know once (a bucket that runs directly, and why)

    # --- load ---------------------------------------------------------------------------------

    def _hold(self, host: np.ndarray) -> Any:
        t0 = time.perf_counter()
        if self.driver.host_memory:  # a GPU driver copies it to the device: the host keeps no copy
            self._keep.append(host)
        buf = self.driver.put(host)
        self.load.upload_s += time.perf_counter() - t0
        return buf

    def _weight(self, name: str, layout: str) -> None:
        if (name, layout) in self.weights:
            return
        w = self.body.weights[name]
        held = self.model.weight(name).type.name  # a tensor, or a view of its rows (core/weight_views.py)
        if held != w.format:
            raise InputError(f"weight {name}: the plan has it as {w.format}, the model file as {held}: "
                             "recompile the plan")
        t0 = time.perf_counter()
        # a copy stands for the file's pages: they are released as its making is done with them
        release = lambda lo, hi: self.model.release(name, lo, hi)  # noqa: E731
        raw, fmt, shape = self.model.tensor_bytes(name), w.format, tuple(w.shape)
        data = self.driver.make_layout(layout, raw, fmt, shape, release)
        if data is None:
            data = layouts.make(layout, raw, fmt, shape, release)
        self.load.relayout_s += time.perf_counter() - t0
        info = w.layouts[layout]
        if data.nbytes != info.bytes:
            raise InputError(f"weight {name} in layout {layout}: {data.nbytes} bytes, the plan says {info.bytes}")
        self.load.weight_bytes += data.nbytes
        if layouts.LAYOUTS[layout].copies:
            self.load.copied_bytes += data.nbytes
        dtype = "f32" if layout == "f32" else "u8" if layout in ("planar", "rows16") else w.format.lower()
        self.weights[(name, layout)] = Region(self._hold(data), 0, data.nbytes, dtype, tuple(w.shape), layout)

    def _rope_table(self, spec: RopeTable, dims: dict[str, int]) -> None:
        if spec in self.tables:
            return
        positions = spec.positions if isinstance(spec.positions, int) else dims[spec.positions]
        factors = None
        if spec.factors is not None:
            factors = dequantize(self.model.tensor_bytes(spec.factors), self.model.weight(spec.factors).type)
        table = np.ascontiguousarray(rope_table(positions, spec.dims, spec.base, spec.scale, factors, spec.mscale))
        self.tables[spec] = Region(self._hold(table), 0, table.nbytes, "f32", table.shape)
        self.load.tables += 1

    # --- binding --------------------------------------------------------------------------------

    def step_dims(self, phase: str, rows: int, seqs: int) -> dict[str, int]:
        bounds = self.phases[phase].dims
        for name, n in (("rows", rows), ("seqs", seqs)):
            if name in bounds and not 1 <= n <= bounds[name]:
                raise StepError(f"{phase}: {n} {name}, the plan's bound is {bounds[name]}")
        return dict(bounds, rows=rows, seqs=seqs, blocks=self.kv_blocks)

    def region(self, phase: str, ref: Ref, dims: dict[str, int]) -> Region:
        """The memory an argument reference names in a step with these dims (a buffer's or a state slot's
        kept per dims: every step asks for its state and outputs anew)."""
        if not isinstance(ref, (Buf, State)):
            return self._region(phase, ref, dims)
        key = (phase, ref, *dims.items())
        r = self._regions.get(key)
        if r is None:
            r = self._regions[key] = self._region(phase, ref, dims)
        return r

    def _region(self, phase: str, ref: Ref, dims: dict[str, int]) -> Region:
        p = self.phases[phase]
        if isinstance(ref, Buf):
            b = p.buffers[ref.index]
            shape = bound_shape(b.shape, dims)
            return Region(self.arena, b.offset, value_bytes(b.dtype, shape), b.dtype, shape)
        if isinstance(ref, Scratch):
            shape = bound_shape(ref.shape, dims)
            return Region(self.arena, ref.offset, value_bytes(ref.dtype, shape), ref.dtype, shape)
        if isinstance(ref, State):
            s = p.state[ref.name]
            shape = bound_shape(s.shape, dims)
            return Region(self.slots[phase][ref.name], 0, value_bytes(s.dtype, shape), s.dtype, shape)
        if isinstance(ref, Cache):
            return self.cache
        if isinstance(ref, Weight):
            return self.weights[(ref.name, ref.layout)]
        if isinstance(ref, RopeTable):
            return self.tables[ref]
        raise StepError(f"argument {ref} names no memory")  # the schema check makes this unreachable

    def _arg(self, phase: str, ref: Ref, dims: dict[str, int]) -> Region | Scalar:
        if isinstance(ref, (I32, F32)):
            v = ref.value
            return Scalar(ref.KIND, dims[v] if isinstance(v, str) else v)
        return self.region(phase, ref, dims)

    def calls(self, phase: str, dims: dict[str, int], want: set[str]) -> list[tuple[int, Call]]:
        """The bound kernel calls of the launches that serve `want`, with their launch index."""
        return [(i, call) for i, launch in enumerate(self.phases[phase].launches)
                if want.intersection(launch.serves) for call in self._launch_calls(phase, launch, dims)]

    def _launch_calls(self, phase: str, launch: Launch, dims: dict[str, int]) -> list[Call]:
        return [Call(k.name, _grid(k.grid, dims), k.block, k.smem, [self._arg(phase, r, dims) for r in k.args],
                     launch.op, launch.attrs, len(launch.outs))
                for k in launch.kernels]

    # --- a step ---------------------------------------------------------------------------------

    def write_state(self, phase: str, state: dict[str, np.ndarray], dims: dict[str, int]) -> None:
        """Copy the step state into its slots. A fed input (the decode phases' tokens) may be left out,
        and then keeps what the last step of this phase wrote into it; an input with a default, and then
        holds its default."""
        for name, s in self.phases[phase].state.items():
            if name in state:
                self._write(phase, name, state[name], dims)
            elif s.default is not None:
                if (phase, name) in self._given:
                    self._fill_default(phase, name)
            elif not s.fed_by:
                raise StepError(f"{phase}: the step state lacks {name!r}")

    def _write(self, phase: str, name: str, value: np.ndarray, dims: dict[str, int]) -> None:
        s = self.phases[phase].state[name]
        want = bound_shape(s.shape, dims)
        arr = np.ascontiguousarray(value, np.int32)
        if arr.shape != want:
            raise StepError(f"{phase}: step state {name} has shape {arr.shape}, the step needs {want}")
        self.driver.write(self.region(phase, State(name), dims), arr)
        if s.default is not None:
            self._given.add((phase, name))

    def _fill_default(self, phase: str, name: str) -> None:
        s = self.phases[phase].state[name]
        full = np.full(bound_shape(s.shape, self.phases[phase].dims), s.default, np.int32)
        self.driver.write(Region(self.slots[phase][name], 0, full.nbytes, "i32", full.shape), full)
        self._given.discard((phase, name))

    def queue(self, phase: str, state: dict[str, np.ndarray], want: set[str],
              late: dict[str, Callable[[], np.ndarray]] | None = None) -> PendingStep:
        """Queue one step of `phase` computing the outputs in `want` (and the K/V writes of the launches
        that serve them); their host copies come with result(). `late`: state inputs whose values are
        made (each make() called once) after the launches that do not read them are queued."""
        t0 = time.perf_counter()
        p = self.phases[phase]
        late = late or {}
        rows = len(state["pos"])
        dims = self.step_dims(phase, rows, len(state["pages"]))
        self.write_state(phase, state, dims)
        graphs = None
        at_once = self.driver.records_free and self.trace is None  # a trace shows a bucket's launches once
        if self.replay and (phase != "prefill" or at_once):
            bucket = self.buckets.setdefault(_bucket_key(phase, dims, want, late), Bucket())
            bucket.visits += 1
            if bucket.visits == (1 if at_once else 2):
                self._record(bucket, phase, dims, self._parts(phase, self.calls(phase, dims, want), set(late)))
            if bucket.graphs is not None:
                graphs = bucket.graphs
                bucket.steps += 1
        # a replayed step binds no call: its graphs hold them
        parts = graphs or self._parts(phase, self.calls(phase, dims, want), set(late))
        for j, part in enumerate(parts):
            if j == 1:
                for name, make in late.items():
                    self._write(phase, name, make(), dims)
            if graphs is None:
                self._launch(phase, part, dims, state)
            elif part is not None:
                with self._traced(f"replay {phase} x{dims['seqs']}", "graph"):
                    part.replay()
        reads = {name: self.driver.read(self.region(phase, ref, dims))
                 for name, ref in p.outputs.items() if name in want and not isinstance(ref, Cache)}
        return PendingStep(reads, time.perf_counter() - t0)

    def burst(self, phase: str, state: dict[str, np.ndarray], steps: int) -> np.ndarray:
        """`steps` greedy decode steps of `phase` from `state`, each one position further on than the one
        before and fed its tokens: their tokens (steps x rows). The first is an ordinary step (a bucket's
        warm-up and recording happen there); the rest are one native call where the driver has it and the
        bucket is recorded (Driver.replay_steps), else steps through queue()."""
        want = {"cache", "next_token"}
        tokens = [self.run(phase, state, want)["next_token"]]
        if steps == 1:
            return np.stack(tokens)
        dims = self.step_dims(phase, len(state["pos"]), len(state["pages"]))
        bucket = self.buckets.get(_bucket_key(phase, dims, want, {}))
        if bucket is not None and bucket.graphs and len(bucket.graphs) == 1 \
                and self.phases[phase].state["tokens"].fed_by == "next_token":
            with self._traced(f"replay {phase} x{dims['seqs']}, {steps - 1} steps", "graph"):
                rest = self.driver.replay_steps(bucket.graphs[0], steps - 1, self.region(phase, State("pos"), dims),
                                                self.region(phase, State("tokens"), dims))
            if rest is not None:
                bucket.steps += steps - 1
                return np.concatenate([np.stack(tokens), rest])
        for k in range(1, steps):
            tokens.append(self.run(phase, dict(state, tokens=tokens[-1], pos=state["pos"] + k), want)["next_token"])
        return np.stack(tokens)

    def _parts(self, phase: str, calls: list[tuple[int, Call]], late: set[str]) -> list[list[tuple[int, Call]]]:
        """The step's calls as one part, or with late state two: before and from the first launch that
        reads a late input."""
        if not late:
            return [calls]
        launches = self.phases[phase].launches
        split = next((n for n, (i, _) in enumerate(calls)
                      if any(isinstance(r, State) and r.name in late for r in launches[i].args)), len(calls))
        return [calls[:split], calls[split:]]

    def _launch(self, phase: str, calls: list[tuple[int, Call]], dims: dict[str, int],
                state: dict[str, np.ndarray]) -> None:
        launches = self.phases[phase].launches
        for n, (i, call) in enumerate(calls):
            if self.poison and (n == 0 or calls[n - 1][0] != i):
                self._poison(phase, launches[i], dims, state)
            with self._traced(call.name, "launch", grid=call.grid):
                self.driver.launch(call)
            if self.poison and (n + 1 == len(calls) or calls[n + 1][0] != i):
                self._check(phase, launches[i], dims, state)

    def run(self, phase: str, state: dict[str, np.ndarray], want: set[str],
            late: dict[str, Callable[[], np.ndarray]] | None = None) -> dict[str, np.ndarray]:
        return self.queue(phase, state, want, late).result()

    def _traced(self, name: str, cat: str, **args):
        """A launch or replay on the trace's host and device tracks, when tracing."""
        return nullcontext() if self.trace is None else self.trace.on_device(name, cat, **args)

    def _record(self, bucket: Bucket, phase: str, dims: dict[str, int], parts: list[list[tuple[int, Call]]]) -> None:
        try:
            with span(self.trace, f"record {phase} x{dims['seqs']}", "graph"):
                bucket.graphs = [self.driver.record([c for _, c in part]) if part else None for part in parts]
        except Exception as e:  # the backend's capture failed: this bucket runs directly, and says so once
            bucket.failed = f"{type(e).__name__}: {e}"
            note = f"{phase} at {dims['seqs']} sequences runs directly: recording failed ({bucket.failed})"
            if note not in self.notes:  # prefill buckets differ by rows: one note for them all
                self.notes.append(note)

    def run_launch(self, phase: str, index: int, state: dict[str, np.ndarray]) -> None:
        """Launch i of `phase` alone (all its kernel calls) on the step state: a differential test feeds
        two backends the same inputs launch by launch."""
        dims = self.step_dims(phase, len(state["pos"]), len(state["pages"]))
        self.write_state(phase, state, dims)
        for call in self._launch_calls(phase, self.phases[phase].launches[index], dims):
            self.driver.launch(call)

    # --- poison mode ----------------------------------------------------------------------------

    def written(self, phase: str, launch: Launch, dims: dict[str, int],
                 state: dict[str, np.ndarray]) -> list[tuple[str, Region]]:
        """(what, region) for every range a launch writes: its outputs, the scratch of its kernel calls
        (which carries values from one call of the launch to the next), and the K/V cells of its rows."""
        out = []
        for j, ref in enumerate(launch.outs):
            if isinstance(ref, Cache):
                out += [("K/V cache", r) for r in self._cache_cells(launch, state)]
            else:
                out.append((f"output {j} ({ref})", self.region(phase, ref, dims)))
        scratch = {r.name: r for k in launch.kernels for r in k.args if isinstance(r, Scratch)}
        return out + [(f"scratch {name}", self.region(phase, r, dims)) for name, r in scratch.items()]

    def _cache_cells(self, launch: Launch, state: dict[str, np.ndarray]) -> list[Region]:
        """The K and V rows this launch stores: position pos[r] of sequence seq[r] in layer `layer`."""
        layers, _, blocks, page, kv = self.cache.shape
        cells = []
        for s, pos in zip(state["seq"], state["pos"]):
            block = int(state["pages"][s][pos // page])
            for half in (0, 1):
                at = ((((launch.attrs["layer"] * 2 + half) * blocks + block) * page + pos % page) * kv) * 2
                cells.append(Region(self.cache.buffer, at, kv * 2, "f16", (kv,)))
        return cells

    def _poison(self, phase, launch, dims, state) -> None:
        for _, r in self.written(phase, launch, dims, state):
            self.driver.fill(r, POISON)

    def _check(self, phase, launch, dims, state) -> None:
        for what, r in self.written(phase, launch, dims, state):
            bad = _unwritten(r, self.driver.read(r).result())
            if bad:
                names = ", ".join(k.name for k in launch.kernels)
                raise StepError(f"{phase}: launch {launch.op} ({names}) left {bad} values of {what} unwritten")


def _unwritten(r: Region, data: np.ndarray) -> int:
    """How many values of the region still hold the poison: NaN floats (every float plane of a packed
    format), -1 ints."""
    if r.dtype in ("f32", "f16"):
        return int(np.isnan(data).sum())
    if r.dtype == "bf16":
        return int(((data & 0x7FFF) > 0x7F80).sum())
    if r.dtype == "i32":
        return int((data == -1).sum())
    fmt = ACTIVATION_FORMATS[r.dtype.upper()]
    ps, _ = planes(fmt, math.prod(r.shape[:-1]), r.shape[-1])
    raw = data.view(np.uint8)
    return sum(int(np.isnan(raw[p.offset:p.offset + p.nbytes].view(p.dtype)).sum()) for p in ps if p.dtype.kind == "f")
