// graph.h: a recorded step replayed in one call (the CPU's CUDA graph). The runtime's cpu driver records
// a decode step's kernel calls once: each entry point's `<name>_packed` twin (cpu_build.py render) with
// its arguments as 64-bit words; lp_cpu_replay then runs them in order without a trip through Python per
// launch (about 1.5 us of ctypes each, a tenth of a small model's step).
#pragma once
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "host.h"

typedef void (*lp_packed_fn)(const uint64_t* args);

// a float argument travels as its bits in the word's low half
inline float lp_word_f32(uint64_t w) {
  const uint32_t bits = (uint32_t)w;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

inline uint64_t lp_clock_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

// call i runs fns[i] on the words args[at[i]] ..; with `ns` (n + 1 words), the clock before the first
// call and after each: a step's time by call as the replay spends it, which timing each launch through
// Python (a few microseconds of ctypes, a cold pool) does not give for the small ones
LP_KERNEL void lp_cpu_replay(int n, const lp_packed_fn* fns, const uint64_t* args, const int* at, uint64_t* ns) {
  if (ns) ns[0] = lp_clock_ns();
  for (int i = 0; i < n; ++i) {
    fns[i](args + at[i]);
    if (ns) ns[i + 1] = lp_clock_ns();
  }
}

// A greedy decode burst: the recorded step replayed `steps` times, each one position further on
// (pos[r] += 1 for each of its `rows` rows) and reading the tokens the one before wrote (the fused tail
// writes them into the tokens slot the embedding reads); out[s * rows + r] gets step s's token of row r.
// The host learns `steps` tokens a row for one trip through Python and the engine.
LP_KERNEL void lp_cpu_replay_steps(int n, const lp_packed_fn* fns, const uint64_t* args, const int* at, int steps,
                                   int rows, int32_t* pos, const int32_t* tokens, int32_t* out) {
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < rows; ++r) pos[r] += 1;
    lp_cpu_replay(n, fns, args, at, nullptr);
    for (int r = 0; r < rows; ++r) out[s * rows + r] = tokens[r];
  }
}
