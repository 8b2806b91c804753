// tiles.h: the rows16 records (rows16.h) against many activation rows on Intel AMX int8 tiles (SIMD path
// amx), and the tile engine's scalar twin, which runs the same code with the three tile instructions
// computed in memory, on every path.
//
// Per record (super-block sb of 16 weight rows) and block of M <= 16 activation rows:
//   B: the record's 256 values unpacked once into 64 rows of 64 bytes, row i holding values 4i .. 4i + 3
//      of each of the 16 weight rows: the VNNI order the records' vectors already have, nibbles (and
//      Q6_K's 2-bit plane) unpacked. A sub-block j of SUB values is rows j SUB / 4 .. + SUB / 4 of it.
//   A: the activation rows' q8_k values of sub-block j, loaded straight from the packed buffer (stride k).
//   C = A . B (TDPBSUD: signed activations, unsigned weights): M rows of 16 int32, element (m, r) the
//      exact integer sum of sub-block j of activation row m and weight row r; two sub-blocks in flight.
//   Then the epilogue, C's rows as rows16.h's lanes (a lane a weight row): the sub-block's scale (and
//      Q6_K's offset) into the super-block's integer, and the super-block's float steps, as every other
//      path takes them (rows16.h RecV / Rec: the same integers, the same float operations in the same
//      order), so the amx path and its twin give the other paths' bits, and a row's result never depends
//      on the activation rows beside it.
// Q8_0's records need no unpacking: their values are B as they are (rows16_q8.h r16_tiles).
// A task configures the tiles for its block heights (ldtilecfg) and releases them when done. Using the
// tiles needs the kernel's permission, which cpu_build.host_isas asks for the process (arch_prctl) before
// it offers the amx path.
#pragma once
#include <string.h>

#include <vector>

#include "rows16.h"

namespace lp_cpu {

constexpr int TILE_M = 16;  // activation rows per block (a tile's rows)

// The tile registers' shapes for blocks of m activation rows and sub-blocks of `sub` values: C0 A0 B0 in
// tiles 0 1 2, C1 A1 B1 in 3 4 5 (palette 1: 64 bytes, column bytes at 16, rows at 48)
struct TileShapes {
  alignas(64) uint8_t cfg[64] = {};
  TileShapes(int m, int sub) {
    cfg[0] = 1;
    const int colsb[6] = {64, sub, 64, 64, sub, 64}, rows[6] = {m, m, sub / 4, m, m, sub / 4};
    for (int t = 0; t < 6; ++t) {
      const uint16_t c = (uint16_t)colsb[t];
      memcpy(cfg + 16 + 2 * t, &c, 2);
      cfg[48 + t] = (uint8_t)rows[t];
    }
  }
  int colsb(int t) const { return cfg[16 + 2 * t] | cfg[17 + 2 * t] << 8; }
  int rows(int t) const { return cfg[48 + t]; }
};

#if LP_CPU_ISA >= 3
// g++'s _tile_* are macros that paste their tile number into the instruction's text (clang's are
// builtins), so each call names its tile as a literal and T picks the call at compile time.
#define LP_TILE_CALL(T, call) \
  if constexpr (T == 0) call(0); \
  else if constexpr (T == 1) call(1); \
  else if constexpr (T == 2) call(2); \
  else if constexpr (T == 3) call(3); \
  else if constexpr (T == 4) call(4); \
  else {                              \
    static_assert(T == 5, "tiles 0-5"); \
    call(5);                          \
  }
struct AmxTiles {
  static void config(const TileShapes& s) { _tile_loadconfig(s.cfg); }
  static void release() { _tile_release(); }
  template <int T> static void zero() {
#define LP_ZERO(t) _tile_zero(t)
    LP_TILE_CALL(T, LP_ZERO)
#undef LP_ZERO
  }
  template <int T> static void load(const void* p, size_t stride) {
#define LP_LOAD(t) _tile_loadd(t, p, stride)
    LP_TILE_CALL(T, LP_LOAD)
#undef LP_LOAD
  }
  template <int C, int A, int B> static void dot() {
    static_assert((C == 0 && A == 1 && B == 2) || (C == 3 && A == 4 && B == 5), "r16_tiles' two tile triples");
    if constexpr (C == 0) _tile_dpbsud(0, 1, 2);
    else _tile_dpbsud(3, 4, 5);
  }
  template <int T> static void store(void* p, size_t stride) {
#define LP_STORE(t) _tile_stored(t, p, stride)
    LP_TILE_CALL(T, LP_STORE)
#undef LP_STORE
  }
};
#undef LP_TILE_CALL
#endif

// The twin: the tile registers as a thread's memory, each instruction as Intel's pseudo-code has it
// (rows and column bytes from the configuration; TDPBSUD adds, per int32 of C, the four products of a
// signed byte of A and an unsigned byte of B, wrapping)
struct TwinTiles {
  struct Reg {
    alignas(64) uint8_t b[16][64];
  };
  static TileShapes& shapes() {
    static thread_local TileShapes s(0, 0);
    return s;
  }
  static Reg& reg(int t) {
    static thread_local Reg r[8];
    return r[t];
  }
  static void config(const TileShapes& s) { shapes() = s; }
  static void release() { shapes() = TileShapes(0, 0); }
  template <int T> static void zero() { memset(reg(T).b, 0, sizeof(Reg)); }
  template <int T> static void load(const void* p, size_t stride) {
    for (int i = 0; i < shapes().rows(T); ++i) memcpy(reg(T).b[i], (const uint8_t*)p + i * stride, shapes().colsb(T));
  }
  template <int C, int A, int B> static void dot() {
    const TileShapes& s = shapes();
    for (int m = 0; m < s.rows(C); ++m)
      for (int k = 0; k < s.colsb(A) / 4; ++k)
        for (int n = 0; n < s.colsb(C) / 4; ++n) {
          int32_t c;
          memcpy(&c, reg(C).b[m] + 4 * n, 4);
          uint32_t sum = (uint32_t)c;
          for (int i = 0; i < 4; ++i) sum += (uint32_t)((int8_t)reg(A).b[m][4 * k + i] * (int)reg(B).b[k][4 * n + i]);
          memcpy(reg(C).b[m] + 4 * n, &sum, 4);
        }
  }
  template <int T> static void store(void* p, size_t stride) {
    for (int i = 0; i < shapes().rows(T); ++i) memcpy((uint8_t*)p + i * stride, reg(T).b[i], shapes().colsb(T));
  }
};

// The record's values as B rows (64 of 64 bytes), and the epilogue over a C row's 16 lanes: the SIMD
// steps of rows16.h on avx512 and amx (what the amx path runs), its scalar steps elsewhere.
#if LP_CPU_ISA >= 2
template <class Rec> inline void tile_values(const uint8_t* rec, uint8_t (&b)[64][64]) {
  for (int g = 0; g < 4; ++g)
    for (int t = 0; t < 8; ++t) {
      V512::I u0, u1;
      RecV<V512, Rec>::values(rec, g, t, 0, u0, u1);
      _mm512_store_si512(b[16 * g + t], u0);
      _mm512_store_si512(b[16 * g + 8 + t], u1);
    }
}
template <class Rec> inline void tile_term(int32_t* isum, const int32_t* c, const uint8_t* rec, int j, const int32_t* off) {
  const __m512i s = RecV<V512, Rec>::term(_mm512_loadu_si512(c), rec, 0, j, off);
  _mm512_storeu_si512(isum, _mm512_add_epi32(_mm512_loadu_si512(isum), s));
}
template <class Rec>
inline void tile_apply(float* acc, const int32_t* isum, const uint8_t* rec, const int32_t* pairs, const int32_t* off, float dk) {
  _mm512_storeu_ps(acc, RecV<V512, Rec>::apply(_mm512_loadu_ps(acc), _mm512_loadu_si512(isum), rec, 0, pairs, off, dk));
}
#else
template <class Rec> inline void tile_values(const uint8_t* rec, uint8_t (&b)[64][64]) {
  for (int i = 0; i < 64; ++i)
    for (int r = 0; r < R16; ++r) {
      int u[4];
      Rec::u4(rec, r, 4 * i, u);
      for (int k = 0; k < 4; ++k) b[i][4 * r + k] = (uint8_t)u[k];
    }
}
template <class Rec> inline void tile_term(int32_t* isum, const int32_t* c, const uint8_t* rec, int j, const int32_t* off) {
  for (int r = 0; r < R16; ++r) isum[r] += Rec::term(c[r], rec, r, j, off);
}
template <class Rec>
inline void tile_apply(float* acc, const int32_t* isum, const uint8_t* rec, const int32_t* pairs, const int32_t* off, float dk) {
  for (int r = 0; r < R16; ++r) acc[r] = Rec::apply(acc[r], isum[r], rec, r, pairs, off, dk);
}
#endif

// Weight rows [r0, r1) (r0 a multiple of 16) of records w against every activation row of a (matmul.h
// Acts: a.rows q8_k rows of a.k values at a.qs, a.col(c) a row with its sums); out(weight row,
// activation row, value).
template <class T, class Rec, class Acts, class Out>
inline void r16_tiles(const Rows16<Rec>& w, int r0, int r1, const Acts& a, Out& out) {
  const int rows = a.rows, k = a.k;
  constexpr int SUB = Rec::SUB, NSUB = 256 / SUB;
  alignas(64) static thread_local uint8_t b[64][64];
  alignas(64) static thread_local int32_t c[2][TILE_M][R16];
  static thread_local std::vector<float> acc;  // [rows][16]: the group's float sums
  int shaped = 0;
  for (int group = r0 / R16; R16 * group < r1; ++group) {
    acc.assign((size_t)rows * R16, 0.0f);
    for (int sb = 0; sb < w.nsb; ++sb) {
      const uint8_t* rec = w.rec(group, sb);
      tile_values<Rec>(rec, b);
      for (int m0 = 0; m0 < rows; m0 += TILE_M) {
        const int m = lp_min(TILE_M, rows - m0);
        if (m != shaped) T::config(TileShapes(m, SUB)), shaped = m;
        const int8_t* x = a.qs + (size_t)m0 * k + 256 * sb;
        int32_t isum[TILE_M][R16] = {};
        for (int j = 0; j < NSUB; j += 2) {
          T::template zero<0>();
          T::template load<1>(x + SUB * j, k);
          T::template load<2>(b[SUB / 4 * j], 64);
          T::template dot<0, 1, 2>();
          T::template zero<3>();
          T::template load<4>(x + SUB * (j + 1), k);
          T::template load<5>(b[SUB / 4 * (j + 1)], 64);
          T::template dot<3, 4, 5>();
          T::template store<0>(c[0], 64);
          T::template store<3>(c[1], 64);
          for (int i = 0; i < m; ++i) {
            const int32_t* off = a.col(m0 + i).off + 16 * sb;
            tile_term<Rec>(isum[i], c[0][i], rec, j, off);
            tile_term<Rec>(isum[i], c[1][i], rec, j + 1, off);
          }
        }
        for (int i = 0; i < m; ++i) {
          const R16Col col = a.col(m0 + i);
          tile_apply<Rec>(&acc[(size_t)(m0 + i) * R16], isum[i], rec, col.pairs + 4 * sb, col.off + 16 * sb, col.dk[sb]);
        }
      }
    }
    for (int i = 0; i < rows; ++i)
      for (int r = 0; r < R16 && R16 * group + r < r1; ++r) out(R16 * group + r, i, acc[(size_t)i * R16 + r]);
  }
  if (shaped) T::release();
}

}  // namespace lp_cpu
