"""Running catalog kernels on the CPU, for tests on machines without a GPU.

The kernel sources are rendered as build.render does, except that vendor.h's vendor-specific half is
replaced by a host implementation: every GPU thread of a block is an OS thread, lp_sync is a
std::barrier (a thread that returns drops out of it, as on the GPU), shuffles are pairwise
rendezvous through per-thread mailboxes, shared memory is a function-local static (blocks run one
after another), and lp_half is _Float16 with round-to-nearest-even conversions. vendor.h's portable
half (wave reductions, math through builtins) is used as it is. The translation unit is compiled
with the host clang++-19 into a shared library, with one `emu_<kernel>(gx, gy, gz, threads, args...)`
launcher per kernel, and called through ctypes.

What this checks: the kernel's indexing, its synchronisation and shuffle structure (a missing
barrier or a shuffle some lanes skip shows as a wrong result or a hang), and its float32 arithmetic
as written. What it does not: the GPUs' own exp (host libm here), FMA contraction choices of nvcc and
the AMDGPU backend, memory-model subtleties beyond barriers, and speed.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from llmplan.codegen.build import KERNEL_DIR
from llmplan.codegen.kernel import Kernel

_HOST_VENDOR = r"""
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <atomic>
#include <barrier>
#include <functional>
#include <thread>
#include <vector>
#define LP_EMU 1
#define WAVE @WAVE@
#define __global__
#define __device__
#define __shared__ static
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)

namespace lp_emu {
thread_local int tid, bx, by, bz;
inline int bdim;
inline std::barrier<>* bar;
// a lane's posts: a ring deep enough that no lane laps a slot its partner has yet to read (a lane
// can run ahead of a partner by the shuffles between their exchanges); tags catch it if one ever does
constexpr unsigned RING = 1024;
struct Mail { std::atomic<unsigned> n{0}; uint64_t v[RING]; std::atomic<unsigned> tag[RING]; };
inline Mail mail[1024];

inline void launch(int gx, int gy, int gz, int nt, const std::function<void()>& body) {
  for (int z = 0; z < gz; ++z)
    for (int y = 0; y < gy; ++y)
      for (int x = 0; x < gx; ++x) {
        std::barrier<> b(nt);
        bar = &b;
        bdim = nt;
        for (int t = 0; t < nt; ++t) mail[t].n.store(0);
        std::vector<std::thread> ts;
        for (int t = 0; t < nt; ++t)
          ts.emplace_back([&, t, x, y, z] {
            tid = t; bx = x; by = y; bz = z;
            body();
            b.arrive_and_drop();
          });
        for (auto& th : ts) th.join();
      }
}
}  // namespace lp_emu

inline int lp_tid() { return lp_emu::tid; }
inline int lp_bid() { return lp_emu::bx; }
inline int lp_bid_y() { return lp_emu::by; }
inline int lp_bid_z() { return lp_emu::bz; }
inline int lp_bdim() { return lp_emu::bdim; }
inline void lp_sync() { lp_emu::bar->arrive_and_wait(); }

typedef _Float16 lp_half;
inline float lp_h2f(lp_half h) { return (float)h; }
inline lp_half lp_f2h(float f) { return (lp_half)f; }

// every lane of a shuffle posts its value, then reads its source lane's post of the same shuffle
template <typename T> inline T lp_shfl(T v, int src) {
  static_assert(sizeof(T) <= 8, "32- or 64-bit values");
  using namespace lp_emu;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  Mail& me = mail[tid];
  const unsigned c = me.n.load(std::memory_order_relaxed);
  me.v[c % RING] = bits;
  me.tag[c % RING].store(c, std::memory_order_release);
  me.n.store(c + 1, std::memory_order_release);
  Mail& o = mail[(tid / WAVE) * WAVE + src];
  while (o.n.load(std::memory_order_acquire) < c + 1) std::this_thread::yield();
  const uint64_t ob = o.v[c % RING];
  if (o.tag[c % RING].load(std::memory_order_acquire) != c) {
    fprintf(stderr, "emulator: lane %d lapped by lane %d at shuffle %u\n", tid, src, c);
    abort();
  }
  T out;
  memcpy(&out, &ob, sizeof(T));
  return out;
}
template <typename T> inline T lp_shfl_xor(T v, int mask) { return lp_shfl(v, (lp_emu::tid % WAVE) ^ mask); }

inline int lp_dot4(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
  return c;
}
inline int lp_atomic_add(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
"""

_TYPES = {"int": ctypes.c_int, "float": ctypes.c_float}


def _host_vendor(wave: int) -> list[str]:
    """The host half written above, then vendor.h's portable half (from LP_KERNEL on)."""
    text = (KERNEL_DIR / "vendor.h").read_text()
    at = text.index("#define LP_KERNEL")
    return [_HOST_VENDOR.replace("@WAVE@", str(wave)), text[at:].replace("#pragma once", "")]


def _inline(name: str, seen: set[str], out: list[str], wave: int) -> None:
    if name in seen:
        return
    seen.add(name)
    if name == "vendor.h":
        out += _host_vendor(wave)
        return
    for line in (KERNEL_DIR / name).read_text().splitlines():
        m = re.match(r'\s*#include\s+"([^"]+)"', line)
        if m:
            _inline(m.group(1), seen, out, wave)
        elif line.strip() != "#pragma once":
            out.append(line)


def _signature(k: Kernel) -> tuple[str, list[tuple[str, str]]]:
    m = re.match(r"LP_KERNEL void (?:__launch_bounds__\(\d+\) )?(\w+)\((.*?)\)\s*\{", k.entry, re.S)
    assert m and m.group(1) == k.name, k.entry
    params = []
    for p in m.group(2).split(","):
        p = p.strip()
        name = re.search(r"(\w+)$", p).group(1)
        params.append((p[: -len(name)].strip(), name))
    return k.name, params


def render_host(kernels: list[Kernel], wave: int) -> str:
    out, seen = ["// host emulation of llmplan kernels"], set()
    for src in dict.fromkeys(k.source for k in kernels):
        _inline(src, seen, out, wave)
    for k in {k.name: k for k in kernels}.values():
        out.append(k.entry)
        name, params = _signature(k)
        decl = ", ".join(f"{t} {n}" for t, n in params)
        call = ", ".join(n for _, n in params)
        out.append(f'extern "C" void emu_{name}(int gx, int gy, int gz, int nt, {decl}) '
                   f"{{ lp_emu::launch(gx, gy, gz, nt, [=] {{ {name}({call}); }}); }}")
    return "\n".join(out) + "\n"


class Emulated:
    """The kernels compiled for the host; launch(kernel, grid, *args) with NumPy arrays and scalars."""

    def __init__(self, kernels: list[Kernel], wave: int = 32, workdir: str | Path | None = None):
        self.kernels = {k.name: k for k in kernels}
        source = render_host(list(self.kernels.values()), wave)
        key = hashlib.sha256(source.encode()).hexdigest()[:16]
        work = Path(workdir or tempfile.mkdtemp(prefix="llmplan-emu-"))
        lib = work / f"emu_{key}.so"
        if not lib.exists():
            cpp = work / f"emu_{key}.cpp"
            cpp.write_text(source)
            r = subprocess.run(["clang++-19", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread",
                                "-Wno-unknown-pragmas", "-o", str(lib), str(cpp)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"host build failed:\n{r.stderr[:4000]}")
        self.lib = ctypes.CDLL(str(lib))
        self.wave = wave

    def launch(self, name: str, grid: tuple[int, ...], *args) -> None:
        k = self.kernels[name]
        _, params = _signature(k)
        assert len(args) == len(params), f"{name} takes {len(params)} arguments, got {len(args)}"
        cargs = []
        for (t, _), a in zip(params, args):
            if "*" in t:
                assert isinstance(a, np.ndarray) and a.flags.c_contiguous
                cargs.append(ctypes.c_void_p(a.ctypes.data))
            else:
                cargs.append(_TYPES[t.split()[-1]](a))
        g = tuple(grid) + (1,) * (3 - len(grid))
        getattr(self.lib, f"emu_{name}")(ctypes.c_int(g[0]), ctypes.c_int(g[1]), ctypes.c_int(g[2]),
                                         ctypes.c_int(k.block), *cargs)


def resolve_grid(grid: tuple, symbols: dict[str, int]) -> tuple[int, ...]:
    """A Launch's grid with its symbols bound: an int, or (symbol, per) = ceil(symbols[symbol] / per)."""
    return tuple(g if isinstance(g, int) else -(-symbols[g[0]] // g[1]) for g in grid)


def resolve_args(args: list[dict], symbols: dict[str, int], bind) -> list:
    """A Launch's arguments: scalars ({"i32": v} / {"f32": v}, v a constant or a symbol) as numbers,
    every other reference through bind(ref) -> NumPy array."""
    out = []
    for a in args:
        if set(a) == {"i32"}:
            v = a["i32"]
            out.append(int(symbols[v] if isinstance(v, str) else v))
        elif set(a) == {"f32"}:
            v = a["f32"]
            out.append(np.float32(symbols[v] if isinstance(v, str) else v))
        else:
            out.append(bind(a))
    return out


def run_launch(emu: Emulated, launch, symbols: dict[str, int], bind) -> None:
    """Run a codegen Launch record on the emulator, as a runtime would: grid and arguments resolved."""
    emu.launch(launch.kernel.name, resolve_grid(launch.grid, symbols), *resolve_args(launch.args, symbols, bind))


def packed_buffer(fmt: str, rows: int, k: int, poison: bool = True):
    """An arena-style packed activation buffer [rows, k]: (raw bytes, cpu_kernels.Packed view of them)."""
    from llmplan.models.formats import ACTIVATION_FORMATS, planes
    from llmplan.runtime.cpu_kernels import Packed

    ps, size = planes(ACTIVATION_FORMATS[fmt.upper()], rows, k)
    raw = np.full(size, 0xFF if poison else 0, np.uint8)  # 0xFF..: NaN halves and floats, -1 integers
    return raw, Packed(fmt, {p.name: raw[p.offset:p.offset + p.nbytes].view(p.dtype).reshape(p.shape) for p in ps})
