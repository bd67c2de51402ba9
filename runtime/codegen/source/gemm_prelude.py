"""The C++ of the matmul and attention kernels (the CPU prelude's part for Note [matmul kernels]
in runtime/codegen/opaque/gemm.py and Note [attention kernels] in runtime/codegen/opaque/attention.py), kept apart from the rest of the prelude.

Note [register tiles]: a register tile is the block of C whose partial sums stay in the CPU's
vector registers while k runs: each step loads a few vectors and does one multiply-add per
accumulator. The tile must fit the register file with room for the vectors a step loads, or the
compiler keeps accumulators on the stack and every multiply-add reads and writes memory (the old
4 x 4 tile of 16-float vectors is 16 zmm on AVX-512 but 32 ymm on AVX2, twice the 16 there are:
g++ 12.2 compiled its inner loop to 540 stack loads and stores around 32 FMAs, and broadcast A's
element by 16 scalar stores). So the vector is the machine's own (``FUSEG_VW`` floats: 16 with
AVX-512, 8 with AVX/AVX2, 4 otherwise, from the compiler's target macros under -march=native) and
the tile is sized for its 16 (or 32) registers:

* B contiguous along n: ``FUSEG_MR`` rows x ``FUSEG_NV`` vectors (6 x 2 on AVX2: 12 accumulators,
  2 loads of B and 1 broadcast of A a step, 15 of 16 ymm; 6 x 4 on AVX-512, 29 of 32 zmm). With at
  most 2 rows (a decode step) the tile is 2 rows x twice the vectors: more accumulators in flight;
  with many columns too (a decode step's product by a Conv1D weight), C's rows stay in memory and
  B is read row by row, in order. From ``NN_PACK_ROWS`` rows each panel of B is first copied
  contiguous, a block of k at a time: its rows lie a whole row of B apart, a cache line a step
  (GPT-2's 128 x 768 by 768 x 2304: 4.28 -> 3.39 ms on one thread of an AVX2 EPYC; level at 64).
* A and B contiguous along k: ``FUSEG_DR`` x ``FUSEG_DC`` dot products, ``FUSEG_DR * FUSEG_DC ==
  FUSEG_VW`` (2 x 4 on AVX2), one vector each, summed across lanes together at the end
  (``fuseg_hsum``: a transpose-and-add tree); one row alone takes 1 x ``FUSEG_VW``. From
  ``FUSEG_PACK_ROWS`` rows, B is instead copied contiguous along n, ``FUSEG_KC`` of k and one
  tile's columns at a time (a fixed stack buffer, columns past N zero), and the first tile reads it.

Every size, stride and offset is a runtime argument (Note [kernel sizes as arguments] in
symsizes.py: one binary for every size); only the tile shapes are compile-time. Edges need no
scalar code: the last vector of a row is loaded and stored under a lane mask (vmaskmovps on AVX;
AVX-512's masked moves; a loop elsewhere), k past the last whole vector of a dot product is a masked load (zeros add
nothing), and rows or columns past a dot tile's edge read the last real one again and are not
stored. tests/test_matmul_kernels.py reads the disassembly of a built kernel: no stack traffic in
the inner loops.
"""

from __future__ import annotations

import hashlib

__all__ = ["ATTENTION_ROUTINES", "ATTENTION_SCORES", "GEMM_COMMON", "GEMM_ROUTINES", "NN_PACK_ROWS", "PACK_ROWS",
           "gemm_texts"]

#: rows of C from which B contiguous along k is first copied contiguous along n, and from which B
#: contiguous along n is copied panel by panel (Note [register tiles]); tests in the kernel, so
#: never a condition of a plan. The copy pays once about a register tile of rows reads it: on one
#: thread of the AVX2 EPYC the copying loop took 0.90-1.05x the dot products' time at 4 rows,
#: 0.59-0.76x at 6, 0.45-0.69x at 12-32 (64 x 64 and 128 x 64 by 64, 768 x 768 by 768). Since
#: 2026-11-28 both are measured on the machine that runs the kernels (Note [thread thresholds
#: measured here] in runtime/codegen/thresholds.py: ``pack_rows``, ``nn_pack_rows``) and defined before the
#: prelude with the matmul threshold; these are the values where nothing is measured
PACK_ROWS = 5
NN_PACK_ROWS = 64
#: scores of one block of query rows the attention kernel keeps on the stack (64 KiB)
ATTENTION_SCORES = 1 << 14


def _transpose_steps(vw: int) -> list[tuple[list[int], list[int]]]:
    """The shuffles of a transpose of ``vw`` vectors of ``vw`` lanes in registers, one pair per
    step (rows h apart, h = vw / 2, ..., 1): lane t of the first result takes lane t % h of x's or
    y's block (by t // h) of h lanes, the second the block after it."""
    out = []
    h = vw // 2
    while h >= 1:
        lo = [(t // h % 2) * vw + (t // h // 2) * 2 * h + t % h for t in range(vw)]
        out.append((lo, [i + h for i in lo]))
        h //= 2
    return out


def _sum_steps(vw: int) -> list[tuple[list[int], list[int]]]:
    """The shuffles of a sum across lanes of ``vw`` vectors (h = vw / 2, ..., 1): x's pairs of
    h-lane blocks, added, fill the result's low half in order, y's its high half; so after the
    last step lane j holds the sum of vector j."""
    out = []
    h = vw // 2
    while h >= 1:
        half = vw // 2
        lo = [(t >= half) * vw + (t % half) // h * 2 * h + t % h for t in range(vw)]
        out.append((lo, [i + h for i in lo]))
        h //= 2
    return out


def _shuffles() -> str:
    parts = []
    for vw in (16, 8, 4):
        lines = [f"#{'if' if vw == 16 else 'elif'} FUSEG_VW == {vw}"]
        for name, steps in (("HSUM", _sum_steps(vw)), ("TRANSPOSE", _transpose_steps(vw))):
            for level, (lo, hi) in enumerate(steps):
                lines.append(f"#define FUSEG_{name}_LO{level} {', '.join(map(str, lo))}")
                lines.append(f"#define FUSEG_{name}_HI{level} {', '.join(map(str, hi))}")
        parts.append("\n".join(lines))
    return "\n".join(parts) + "\n#endif\n"


#: the types, tile shapes and vector helpers: in the matmul library and in every kernel's prelude
GEMM_COMMON = r"""
// ---- Note [matmul kernels] (runtime/codegen/gemm.py), Note [register tiles] (gemm_prelude.py) ----
// Multiply-adds contracted to FMA here only (FUSEG_CONTRACT): every other kernel rounds a * b first.
#if defined(__clang__)
#define FUSEG_CONTRACT
#define FUSEG_CONTRACT_BODY _Pragma("clang fp contract(fast)")
#elif defined(__GNUC__)
#define FUSEG_CONTRACT __attribute__((optimize("fp-contract=fast")))
#define FUSEG_CONTRACT_BODY
#else
#define FUSEG_CONTRACT
#define FUSEG_CONTRACT_BODY
#endif
#ifndef FUSEG_VW
#if defined(__AVX512F__)
#define FUSEG_VW 16
#elif defined(__AVX__)
#define FUSEG_VW 8
#else
#define FUSEG_VW 4
#endif
#endif
#if FUSEG_VW == 16
#define FUSEG_MR 6
#define FUSEG_NV 4
#define FUSEG_DR 4
#define FUSEG_KC 128
#elif FUSEG_VW == 8
#define FUSEG_MR 6
#define FUSEG_NV 2
#define FUSEG_DR 2
#define FUSEG_KC 256
#else
#define FUSEG_MR 6
#define FUSEG_NV 2
#define FUSEG_DR 2
#define FUSEG_KC 256
#endif
#define FUSEG_DC (FUSEG_VW / FUSEG_DR)
#define FUSEG_ME 4
#define FUSEG_W (FUSEG_NV * FUSEG_VW)
// (FUSEG_PARALLEL_MACS, FUSEG_PACK_ROWS, FUSEG_NN_PACK_ROWS: defined before the prelude, Note
// [thread thresholds measured here])
#define FUSEG_ATTENTION_SCORES @ATTENTION_SCORES@
typedef float fuseg_v __attribute__((vector_size(4 * FUSEG_VW), aligned(4), may_alias));
typedef int fuseg_vm __attribute__((vector_size(4 * FUSEG_VW)));
#if defined(__clang__)
#define FUSEG_SHUFV(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define FUSEG_SHUFV(a, b, ...) __builtin_shuffle(a, b, (fuseg_vm){__VA_ARGS__})
#endif
@SHUFFLES@
static inline fuseg_v fuseg_ld(const float* p) { return *(const fuseg_v*)p; }
static inline void fuseg_st(float* p, fuseg_v v) { *(fuseg_v*)p = v; }
// x in every lane: x - 0 is x for every x (-0.0 included), so the compiler drops the subtraction
// and broadcasts (0 + x it must keep: -0.0 + 0 is +0.0; a loop over the lanes became inserts)
static inline fuseg_v fuseg_bc(float x) { return x - (fuseg_v){}; }
// lanes below n (0 <= n <= FUSEG_VW) set
static inline fuseg_vm fuseg_lanes(long n) {
  static const int iota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  fuseg_vm i;
  __builtin_memcpy(&i, iota, sizeof i);
  return i < (fuseg_vm){} + (int)n;
}
#if FUSEG_VW == 8 && defined(__AVX__) && !defined(__clang__)
typedef float fuseg_v8a __attribute__((vector_size(32)));
static inline fuseg_v fuseg_ldm(const float* p, fuseg_vm m) {
  return (fuseg_v)__builtin_ia32_maskloadps256((const fuseg_v8a*)p, m);
}
static inline void fuseg_stm(float* p, fuseg_vm m, fuseg_v v) { __builtin_ia32_maskstoreps256((fuseg_v8a*)p, m, (fuseg_v8a)v); }
#elif FUSEG_VW == 16 && defined(__AVX512F__) && defined(__AVX512DQ__) && !defined(__clang__)
// AVX-512's own masked moves (the lanes' sign bits to a mask register): the loop over lanes below
// compiled to 16 conditional broadcasts, and left a dot tile's sums in a stack buffer from the end
// of its main loop on (g++ 12.2; tests/test_matmul_kernels.py reads the disassembly)
typedef float fuseg_v16a __attribute__((vector_size(64)));
typedef int fuseg_v16i __attribute__((vector_size(64)));
static inline fuseg_v fuseg_ldm(const float* p, fuseg_vm m) {
  return (fuseg_v)__builtin_ia32_loadups512_mask(p, (fuseg_v16a){}, __builtin_ia32_cvtd2mask512((fuseg_v16i)m));
}
static inline void fuseg_stm(float* p, fuseg_vm m, fuseg_v v) {
  __builtin_ia32_storeups512_mask(p, (fuseg_v16a)v, __builtin_ia32_cvtd2mask512((fuseg_v16i)m));
}
#else
static inline fuseg_v fuseg_ldm(const float* p, fuseg_vm m) {
  fuseg_v v = {};
  for (int l = 0; l < FUSEG_VW; ++l) if (m[l]) v[l] = p[l];
  return v;
}
static inline void fuseg_stm(float* p, fuseg_vm m, fuseg_v v) {
  for (int l = 0; l < FUSEG_VW; ++l) if (m[l]) p[l] = v[l];
}
#endif
// The bias of n (<= FUSEG_VW) columns from x, sxn apart (0: one value broadcast along the row).
static inline fuseg_v fuseg_bias(const float* x, long sxn, long n) {
  if (sxn == 1) return n == FUSEG_VW ? fuseg_ld(x) : fuseg_ldm(x, fuseg_lanes(n));
  if (sxn == 0) return fuseg_bc(*x);
  fuseg_v v = {};
  for (long l = 0; l < n; ++l) v[l] = x[l * sxn];
  return v;
}
// Lane j of the result: the sum of a[j]'s lanes (FUSEG_VW vectors; a transpose-and-add tree).
static inline fuseg_v fuseg_hsum(const fuseg_v* a) {
  fuseg_v t[FUSEG_VW];
  for (int p = 0; p < FUSEG_VW; ++p) t[p] = a[p];
  int n = FUSEG_VW;
#define FUSEG_HSUM_LEVEL(L) \
  n /= 2; \
  for (int p = 0; p < n; ++p) \
    t[p] = FUSEG_SHUFV(t[2 * p], t[2 * p + 1], FUSEG_HSUM_LO##L) + FUSEG_SHUFV(t[2 * p], t[2 * p + 1], FUSEG_HSUM_HI##L);
  FUSEG_HSUM_LEVEL(0)
  FUSEG_HSUM_LEVEL(1)
#if FUSEG_VW >= 8
  FUSEG_HSUM_LEVEL(2)
#endif
#if FUSEG_VW >= 16
  FUSEG_HSUM_LEVEL(3)
#endif
#undef FUSEG_HSUM_LEVEL
  return t[0];
}
""".replace("@SHUFFLES@", _shuffles()).replace("@ATTENTION_SCORES@", str(ATTENTION_SCORES))

#: the matmul routines (Note [register tiles]), compiled once, in the matmul library (Note [one matmul library])
GEMM_ROUTINES = r"""
// C = A @ B (+ X): what every tile reads. X broadcasts by strides 0; null: no bias.
struct fuseg_mm {
  long K;
  const float* A;
  long sam, sak;
  const float* B;
  long sbk;
  float* C;
  long ldc;
  const float* X;
  long sxm, sxn;
};
// B contiguous along n: `rows` (1..MR) rows of C from row i x NV vectors from column j, k
// outermost. Rows past `rows` read the last real row again and are not stored; where EDGE, the
// panel has w columns (1..NV * FUSEG_VW) and each vector is loaded and stored under its lanes' mask.
// add: C += A @ B (a later block of k), else C = A @ B + X.
template <int MR, int NV, bool EDGE>
FUSEG_CONTRACT static void fuseg_nn_tile(const fuseg_mm& p, long i, long rows, long j, long w, bool add) {
  FUSEG_CONTRACT_BODY
  const long K = p.K, sak = p.sak, sbk = p.sbk;
  const float* a[MR];
  for (int r = 0; r < MR; ++r) a[r] = p.A + (i + (r < rows ? r : rows - 1)) * p.sam;
  const float* B = p.B + j;
  fuseg_vm m[NV];
  for (int v = 0; v < NV; ++v) m[v] = fuseg_lanes(EDGE ? (w - v * FUSEG_VW < 0 ? 0 : w - v * FUSEG_VW < FUSEG_VW ? w - v * FUSEG_VW : FUSEG_VW) : FUSEG_VW);
  fuseg_v acc[MR][NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) acc[r][v] = (fuseg_v){};
  for (long k = 0; k < K; ++k) {
    fuseg_v b[NV];
    for (int v = 0; v < NV; ++v) b[v] = EDGE ? fuseg_ldm(B + k * sbk + v * FUSEG_VW, m[v]) : fuseg_ld(B + k * sbk + v * FUSEG_VW);
    for (int r = 0; r < MR; ++r) {
      const fuseg_v x = fuseg_bc(a[r][k * sak]);
      for (int v = 0; v < NV; ++v) acc[r][v] += x * b[v];
    }
  }
  // acc is read by constant indices only (so it stays in registers: were it in memory, the masked
  // loads, which may read any memory, would make every step store it); the stores read a copy
  fuseg_v out[MR][NV];
#if defined(__clang__)
#pragma clang loop unroll(full)
#else
#pragma GCC unroll 64
#endif
  for (int t = 0; t < MR * NV; ++t) out[t / NV][t % NV] = acc[t / NV][t % NV];
  for (int r = 0; r < MR; ++r)
    for (int v = 0; v < NV; ++v) {
      const long n = EDGE ? w - v * FUSEG_VW : FUSEG_VW;  // columns of this vector
      if (r < rows && n > 0) {
        float* c = p.C + (i + r) * p.ldc + j + v * FUSEG_VW;
        fuseg_v s = out[r][v];
        if (add) s += n < FUSEG_VW ? fuseg_ldm(c, m[v]) : fuseg_ld(c);
        else if (p.X) s += fuseg_bias(p.X + (i + r) * p.sxm + (j + v * FUSEG_VW) * p.sxn, p.sxn, n < FUSEG_VW ? n : FUSEG_VW);
        if (n < FUSEG_VW) fuseg_stm(c, m[v], s);
        else fuseg_st(c, s);
      }
    }
}
// one panel of w columns (1 <= w <= NV * FUSEG_VW) from column j, every row; a panel cut short by
// the edge of C in chunks of FUSEG_NV vectors by FUSEG_ME-row tiles (their masks, loop-invariant,
// take registers: a 6-row tile with them needed 17 ymm and kept its accumulators in memory)
template <int MR, int NV>
static void fuseg_nn_panel(const fuseg_mm& p, long M, long j, long w, bool add) {
  if (w == NV * FUSEG_VW) {
    for (long i = 0; i < M; i += MR) fuseg_nn_tile<MR, NV, false>(p, i, M - i < MR ? M - i : MR, j, w, add);
    return;
  }
  // a narrow panel (an attention head's features, a block of keys): as few vectors as it has
  if (w <= FUSEG_VW) {
    for (long i = 0; i < M; i += FUSEG_MR) fuseg_nn_tile<FUSEG_MR, 1, true>(p, i, M - i < FUSEG_MR ? M - i : FUSEG_MR, j, w, add);
    return;
  }
#if FUSEG_NV > 2
  if (w <= 2 * FUSEG_VW) {
    for (long i = 0; i < M; i += FUSEG_MR) fuseg_nn_tile<FUSEG_MR, 2, true>(p, i, M - i < FUSEG_MR ? M - i : FUSEG_MR, j, w, add);
    return;
  }
#endif
  for (long jc = 0; jc < w; jc += FUSEG_NV * FUSEG_VW)
    for (long i = 0; i < M; i += FUSEG_ME)
      fuseg_nn_tile<FUSEG_ME, FUSEG_NV, true>(p, i, M - i < FUSEG_ME ? M - i : FUSEG_ME, j + jc,
                                               w - jc < FUSEG_NV * FUSEG_VW ? w - jc : FUSEG_NV * FUSEG_VW, add);
}
template <int MR, int NV>
static void fuseg_nn_panels(const fuseg_mm& p, long M, long N) {
  const long panels = (N + NV * FUSEG_VW - 1) / (NV * FUSEG_VW);
#pragma omp parallel for schedule(static) if (panels > 1 && M * N * p.K >= FUSEG_PARALLEL_MACS)
  for (long t = 0; t < panels; ++t) {
    const long j = t * NV * FUSEG_VW;
    fuseg_nn_panel<MR, NV>(p, M, j, N - j < NV * FUSEG_VW ? N - j : NV * FUSEG_VW, false);
  }
}
// At most 2 rows of C and many columns (a decode step's product): C's rows in memory, B's rows read
// in order, each once (a panel of a few columns walked B a whole row apart: memory latency).
FUSEG_CONTRACT static void fuseg_nn_rows(const fuseg_mm& p, long M, long N) {
  FUSEG_CONTRACT_BODY
  float* c0 = p.C;
  float* c1 = M > 1 ? p.C + p.ldc : p.C;  // (one row: the second is the first again, written last)
  for (long j = 0; j < N; j += FUSEG_VW) {
    const long n = N - j < FUSEG_VW ? N - j : FUSEG_VW;
    const fuseg_vm m = fuseg_lanes(n);
    for (long r = M - 1; r >= 0; --r) {
      const fuseg_v x = p.X ? fuseg_bias(p.X + r * p.sxm + j * p.sxn, p.sxn, n) : (fuseg_v){};
      if (n == FUSEG_VW) fuseg_st((r ? c1 : c0) + j, x);
      else fuseg_stm((r ? c1 : c0) + j, m, x);
    }
  }
  for (long k = 0; k < p.K; ++k) {
    const float* b = p.B + k * p.sbk;
    const fuseg_v a0 = fuseg_bc(p.A[k * p.sak]), a1 = fuseg_bc(p.A[(M > 1 ? p.sam : 0) + k * p.sak]);
    long j = 0;
    for (; j + FUSEG_VW <= N; j += FUSEG_VW) {
      const fuseg_v bv = fuseg_ld(b + j);
      fuseg_st(c1 + j, fuseg_ld(c1 + j) + a1 * bv);
      if (M > 1) fuseg_st(c0 + j, fuseg_ld(c0 + j) + a0 * bv);
    }
    if (j < N) {
      const fuseg_vm m = fuseg_lanes(N - j);
      const fuseg_v bv = fuseg_ldm(b + j, m);
      fuseg_stm(c1 + j, m, fuseg_ldm(c1 + j, m) + a1 * bv);
      if (M > 1) fuseg_stm(c0 + j, m, fuseg_ldm(c0 + j, m) + a0 * bv);
    }
  }
}
// C (M x N, rows ldc apart, columns contiguous) = A (M x K, strides sam, sak) @ B (K x N, rows
// sbk apart, columns contiguous) + X (strides sxm, sxn; null: none).
static void fuseg_mm_nn(long M, long N, long K, const float* A, long sam, long sak, const float* B, long sbk,
                        float* C, long ldc, const float* X, long sxm, long sxn) {
  if (M <= 0 || N <= 0) return;
  const fuseg_mm p = {K, A, sam, sak, B, sbk, C, ldc, X, sxm, sxn};
  if (M >= FUSEG_NN_PACK_ROWS && N > FUSEG_W && K > 0) {
    // B's rows a whole row of B apart: each panel copied contiguous, a block of k at a time, where
    // enough rows of C read it (the copy is one read of the panel)
    const long panels = (N + FUSEG_W - 1) / FUSEG_W;
#pragma omp parallel for schedule(static) if (panels > 1 && M * N * K >= FUSEG_PARALLEL_MACS)
    for (long t = 0; t < panels; ++t) {
      float P[FUSEG_KC * FUSEG_W];  // (each thread its own)
      const long j = t * FUSEG_W, w = N - j < FUSEG_W ? N - j : FUSEG_W;
      for (long k0 = 0; k0 < K; k0 += FUSEG_KC) {
        const long kc = K - k0 < FUSEG_KC ? K - k0 : FUSEG_KC;
        for (long k = 0; k < kc; ++k) {
          const float* b = B + (k0 + k) * sbk + j;
          for (long c = 0; c < FUSEG_W; ++c) P[k * FUSEG_W + c] = c < w ? b[c] : 0.0f;
        }
        const fuseg_mm q = {kc, A + k0 * sak, sam, sak, P, FUSEG_W, C + j, ldc, X ? X + j * sxn : X, sxm, sxn};
        fuseg_nn_panel<FUSEG_MR, FUSEG_NV>(q, M, 0, w, k0 > 0);
      }
    }
    return;
  }
  if (M > 2) fuseg_nn_panels<FUSEG_MR, FUSEG_NV>(p, M, N);
  else if (N <= 4 * FUSEG_W) fuseg_nn_panels<2, 2 * FUSEG_NV>(p, M, N);
  else fuseg_nn_rows(p, M, N);
}
// A and B contiguous along k: DR x DC dot products (DR * DC == FUSEG_VW) at rows i, columns j; rows
// past `rows` and columns past `cols` read the last real ones again and are not stored.
template <int DR, int DC>
FUSEG_CONTRACT static void fuseg_nt_tile(long K, const float* A, long sam, const float* B, long sbn, float* C, long ldc,
                                         const float* X, long sxm, long sxn, long rows, long cols) {
  FUSEG_CONTRACT_BODY
  static_assert(DR * DC == FUSEG_VW, "one vector of sums");
  const float* a[DR];
  const float* b[DC];
  for (int r = 0; r < DR; ++r) a[r] = A + (r < rows ? r : rows - 1) * sam;
  for (int c = 0; c < DC; ++c) b[c] = B + (c < cols ? c : cols - 1) * sbn;
  fuseg_v acc[DR * DC];
  for (int t = 0; t < DR * DC; ++t) acc[t] = (fuseg_v){};
  long k = 0;
  for (; k + FUSEG_VW <= K; k += FUSEG_VW) {
    fuseg_v av[DR];
    for (int r = 0; r < DR; ++r) av[r] = fuseg_ld(a[r] + k);
    for (int c = 0; c < DC; ++c) {
      const fuseg_v bv = fuseg_ld(b[c] + k);
      for (int r = 0; r < DR; ++r) acc[r * DC + c] += av[r] * bv;
    }
  }
  if (k < K) {  // k past the last whole vector: masked loads, zeros past K
    const fuseg_vm m = fuseg_lanes(K - k);
    fuseg_v av[DR];
    for (int r = 0; r < DR; ++r) av[r] = fuseg_ldm(a[r] + k, m);
    for (int c = 0; c < DC; ++c) {
      const fuseg_v bv = fuseg_ldm(b[c] + k, m);
      for (int r = 0; r < DR; ++r) acc[r * DC + c] += av[r] * bv;
    }
  }
  const fuseg_v s = fuseg_hsum(acc);
  for (int r = 0; r < DR; ++r)
    for (int c = 0; c < DC; ++c)
      if (r < rows && c < cols) C[r * ldc + c] = X ? s[r * DC + c] + X[r * sxm + c * sxn] : s[r * DC + c];
}
// B (K x w columns, column c at B + c * sbn, contiguous along k) copied contiguous along n into P
// (kc x FUSEG_W, from k = 0): VW x VW blocks transposed in registers, the edges element by element,
// columns past w zero.
static void fuseg_nt_pack(const float* B, long sbn, long w, long kc, float* P) {
  long c = 0;
  for (; c + FUSEG_VW <= w; c += FUSEG_VW) {
    long k = 0;
    for (; k + FUSEG_VW <= kc; k += FUSEG_VW) {
      fuseg_v t[FUSEG_VW];
      for (int r = 0; r < FUSEG_VW; ++r) t[r] = fuseg_ld(B + (c + r) * sbn + k);
#define FUSEG_TRANSPOSE_STEP(H, L) \
      for (int r = 0; r < FUSEG_VW; ++r) \
        if (!(r & H)) { \
          const fuseg_v x = t[r], y = t[r + H]; \
          t[r] = FUSEG_SHUFV(x, y, FUSEG_TRANSPOSE_LO##L); \
          t[r + H] = FUSEG_SHUFV(x, y, FUSEG_TRANSPOSE_HI##L); \
        }
#if FUSEG_VW >= 16
      FUSEG_TRANSPOSE_STEP(8, 0)
      FUSEG_TRANSPOSE_STEP(4, 1)
      FUSEG_TRANSPOSE_STEP(2, 2)
      FUSEG_TRANSPOSE_STEP(1, 3)
#elif FUSEG_VW >= 8
      FUSEG_TRANSPOSE_STEP(4, 0)
      FUSEG_TRANSPOSE_STEP(2, 1)
      FUSEG_TRANSPOSE_STEP(1, 2)
#else
      FUSEG_TRANSPOSE_STEP(2, 0)
      FUSEG_TRANSPOSE_STEP(1, 1)
#endif
#undef FUSEG_TRANSPOSE_STEP
      for (int r = 0; r < FUSEG_VW; ++r) fuseg_st(P + (k + r) * FUSEG_W + c, t[r]);
    }
    for (; k < kc; ++k)
      for (int r = 0; r < FUSEG_VW; ++r) P[k * FUSEG_W + c + r] = B[(c + r) * sbn + k];
  }
  for (int e = 0; e < FUSEG_W; ++e)  // (a loop of known length: c is past the whole vectors)
    if (e >= c)
      for (long k = 0; k < kc; ++k) P[k * FUSEG_W + e] = e < w ? B[e * sbn + k] : 0.0f;
}
// C (M x N, rows ldc apart) = A (M x K, rows sam apart, contiguous along k) @ B (K x N: column n at
// B + n * sbn, contiguous along k) + X (strides sxm, sxn; null: none).
static void fuseg_mm_nt(long M, long N, long K, const float* A, long sam, const float* B, long sbn,
                        float* C, long ldc, const float* X, long sxm, long sxn) {
  if (M <= 0 || N <= 0) return;
  const bool threads = M * N * K >= FUSEG_PARALLEL_MACS;
  if (M >= FUSEG_PACK_ROWS && K > 0) {
    const long panels = (N + FUSEG_W - 1) / FUSEG_W;
#pragma omp parallel for schedule(static) if (threads && panels > 1)
    for (long t = 0; t < panels; ++t) {
      float P[FUSEG_KC * FUSEG_W];  // (each thread its own)
      const long j = t * FUSEG_W, w = N - j < FUSEG_W ? N - j : FUSEG_W;
      for (long k0 = 0; k0 < K; k0 += FUSEG_KC) {
        const long kc = K - k0 < FUSEG_KC ? K - k0 : FUSEG_KC;
        fuseg_nt_pack(B + j * sbn + k0, sbn, w, kc, P);
        const fuseg_mm p = {kc, A + k0, sam, 1, P, FUSEG_W, C + j, ldc, X ? X + j * sxn : X, sxm, sxn};
        fuseg_nn_panel<FUSEG_MR, FUSEG_NV>(p, M, 0, w, k0 > 0);
      }
    }
    return;
  }
  const long pairs = M / FUSEG_DR * FUSEG_DR, tiles = (N + FUSEG_DC - 1) / FUSEG_DC, last = (N + FUSEG_VW - 1) / FUSEG_VW;
  // rows in whole tiles, the rows left by FUSEG_DR x FUSEG_DC tiles (where more than one) or 1 x FUSEG_VW
  const long rest = M - pairs, cols = rest > 1 ? tiles : last;
#pragma omp parallel for schedule(static) if (threads)
  for (long t = 0; t < pairs / FUSEG_DR * tiles + (rest ? cols : 0); ++t) {
    if (t < pairs / FUSEG_DR * tiles) {
      const long i = t / tiles * FUSEG_DR, j = t % tiles * FUSEG_DC;
      fuseg_nt_tile<FUSEG_DR, FUSEG_DC>(K, A + i * sam, sam, B + j * sbn, sbn, C + i * ldc + j, ldc,
                                        X ? X + i * sxm + j * sxn : X, sxm, sxn, FUSEG_DR, N - j < FUSEG_DC ? N - j : FUSEG_DC);
    } else if (rest > 1) {
      const long j = (t - pairs / FUSEG_DR * tiles) * FUSEG_DC;
      fuseg_nt_tile<FUSEG_DR, FUSEG_DC>(K, A + pairs * sam, sam, B + j * sbn, sbn, C + pairs * ldc + j, ldc,
                                        X ? X + pairs * sxm + j * sxn : X, sxm, sxn, rest, N - j < FUSEG_DC ? N - j : FUSEG_DC);
    } else {  // one row left: 1 x FUSEG_VW dot products
      const long j = (t - pairs / FUSEG_DR * tiles) * FUSEG_VW;
      fuseg_nt_tile<1, FUSEG_VW>(K, A + pairs * sam, sam, B + j * sbn, sbn, C + pairs * ldc + j, ldc,
                                 X ? X + pairs * sxm + j * sxn : X, sxm, sxn, 1, N - j < FUSEG_VW ? N - j : FUSEG_VW);
    }
  }
}
"""

#: the attention routines, in every kernel's prelude: their products call the matmul library
ATTENTION_ROUTINES = r"""
// Note [attention kernels] (runtime/codegen/attention.py): one head of a small float32 attention,
// blocks of query rows whose scores fit FUSEG_ATTENTION_SCORES floats on the stack (S <= that: a
// condition of the plan). Per block: the scores Q K^T (the keys any row of the block sees: with
// CAUSAL, none past the block's last row), each row scaled, masked (an additive mask MSM, MSN
// apart, or keys past the row's own index when causal), soft-maxed in place, then O = P V. A row
// whose scores are all -inf gets zeros and a logsumexp of 0, as ATen's CPU kernel gives it.
static void fuseg_attention_head(long L, long S, long E, const float* Q, long qsm, const float* K, long ksn,
                                 const float* V, long vss, const float* Mk, long msm, long msn, int causal,
                                 float scale, float* O, long osm, float* Lse, long lsm) {
  float P[FUSEG_ATTENTION_SCORES];
  const long rb = FUSEG_ATTENTION_SCORES / S;
  for (long i0 = 0; i0 < L; i0 += rb) {
    const long rows = L - i0 < rb ? L - i0 : rb;
    const long keys = causal && i0 + rows < S ? i0 + rows : S;
    fuseg_mm_nt(rows, keys, E, Q + i0 * qsm, qsm, K, ksn, P, keys, nullptr, 0, 0);
    for (long i = 0; i < rows; ++i) {
      float* r = P + i * keys;
      const long n = causal && i0 + i + 1 < keys ? i0 + i + 1 : keys;  // the keys row i sees
      const float* mk = Mk ? Mk + (i0 + i) * msm : nullptr;
      float mx = -FUSEG_INF;
      int nan = 0;  // Note [max without a NaN chain] (rows.py)
      if (mk) {
#pragma omp simd reduction(fuseg_max_ordered : mx) reduction(| : nan)
        for (long j = 0; j < n; ++j) {
          const float s = r[j] * scale + mk[j * msn];
          r[j] = s;
          mx = fuseg_max_ordered<float>(mx, s);
          nan |= s != s;
        }
      } else {
#pragma omp simd reduction(fuseg_max_ordered : mx) reduction(| : nan)
        for (long j = 0; j < n; ++j) {
          const float s = r[j] * scale;
          r[j] = s;
          mx = fuseg_max_ordered<float>(mx, s);
          nan |= s != s;
        }
      }
      mx = nan ? __builtin_nanf("") : mx;
      float sum = 0.0f;
      if (mx == -FUSEG_INF) {
        for (long j = 0; j < keys; ++j) r[j] = 0.0f;
      } else {
#pragma omp simd reduction(+ : sum)
        for (long j = 0; j < n; ++j) {
          const float e = fuseg_exp(r[j] - mx);
          r[j] = e;
          sum += e;
        }
        const float inv = 1.0f / sum;
        for (long j = 0; j < n; ++j) r[j] = r[j] * inv;
        for (long j = n; j < keys; ++j) r[j] = 0.0f;
      }
      if (Lse) Lse[(i0 + i) * lsm] = (mx == -FUSEG_INF ? 0.0f : mx) + fuseg_math::log(sum == 0.0f ? 1.0f : sum);
    }
    fuseg_mm_nn(rows, E, keys, P, keys, 1, V, vss, O + i0 * osm, osm, nullptr, 0, 0);
  }
}
// Note [attention backward kernels] (attention.py): one head's gradients from the forward's
// logsumexp. Per block of query rows: P = exp(scale Q K^T + mask - lse), dP = dO V^T, dS = P (dP -
// rowsum(dO O)) scale; then dV += P^T dO, dK += dS^T Q, dQ = dS K. Keys a causal row does not see
// get P = dS = 0.
static void fuseg_attention_head_backward(long L, long S, long E, const float* G, long gsm, const float* Q, long qsm,
                                          const float* K, long ksn, const float* V, long vss, const float* O, long osm,
                                          const float* Lse, long lsm, const float* Mk, long msm, long msn, int causal,
                                          float scale, float* DQ, long dqsm, float* DK, long dksn, float* DV, long dvss,
                                          int first) {
  float P[FUSEG_ATTENTION_SCORES];
  float D[FUSEG_ATTENTION_SCORES];  // dP, then dS
  if (first)  // (the first query head of the key's group; the others add to its gradients)
    for (long j = 0; j < S; ++j)
      for (long e = 0; e < E; ++e) DK[j * dksn + e] = DV[j * dvss + e] = 0.0f;
  const long rb = FUSEG_ATTENTION_SCORES / S;
  for (long i0 = 0; i0 < L; i0 += rb) {
    const long rows = L - i0 < rb ? L - i0 : rb;
    const long keys = causal && i0 + rows < S ? i0 + rows : S;
    fuseg_mm_nt(rows, keys, E, Q + i0 * qsm, qsm, K, ksn, P, keys, nullptr, 0, 0);
    fuseg_mm_nt(rows, keys, E, G + i0 * gsm, gsm, V, vss, D, keys, nullptr, 0, 0);
    for (long i = 0; i < rows; ++i) {
      float* p = P + i * keys;
      float* d = D + i * keys;
      const long n = causal && i0 + i + 1 < keys ? i0 + i + 1 : keys;  // the keys row i sees
      const float* mk = Mk ? Mk + (i0 + i) * msm : nullptr;
      const float lse = Lse[(i0 + i) * lsm];
      const float* g = G + (i0 + i) * gsm;
      const float* o = O + (i0 + i) * osm;
      float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
      for (long e = 0; e < E; ++e) dot += g[e] * o[e];
      if (mk) {
#pragma omp simd
        for (long j = 0; j < n; ++j) {
          const float pj = fuseg_exp(p[j] * scale + mk[j * msn] - lse);
          p[j] = pj;
          d[j] = pj * (d[j] - dot) * scale;
        }
      } else {
#pragma omp simd
        for (long j = 0; j < n; ++j) {
          const float pj = fuseg_exp(p[j] * scale - lse);
          p[j] = pj;
          d[j] = pj * (d[j] - dot) * scale;
        }
      }
      for (long j = n; j < keys; ++j) p[j] = d[j] = 0.0f;
    }
    fuseg_mm_nn(keys, E, rows, P, 1, keys, G + i0 * gsm, gsm, DV, dvss, DV, dvss, 1);
    fuseg_mm_nn(keys, E, rows, D, 1, keys, Q + i0 * qsm, qsm, DK, dksn, DK, dksn, 1);
    fuseg_mm_nn(rows, E, keys, D, keys, 1, K, ksn, DQ + i0 * dqsm, dqsm, nullptr, 0, 0);
  }
}
"""

# Note [one matmul library] (runtime/codegen/gemm_library.py): the library holds the routines, the
# settings of the call under way on the calling thread (every routine reads them there, before its
# parallel region), and one entry point per routine, named for the library's source
_LIBRARY_SETTINGS = r"""
static thread_local long long fuseg_lib_macs = 0;
static thread_local long fuseg_lib_pack = 0, fuseg_lib_nn_pack = 0;
#define FUSEG_PARALLEL_MACS fuseg_lib_macs
#define FUSEG_PACK_ROWS fuseg_lib_pack
#define FUSEG_NN_PACK_ROWS fuseg_lib_nn_pack
"""
_NN = ("long M, long N, long K, const float* A, long sam, long sak, const float* B, long sbk, float* C, long ldc, "
       "const float* X, long sxm, long sxn", "M, N, K, A, sam, sak, B, sbk, C, ldc, X, sxm, sxn")
_NT = ("long M, long N, long K, const float* A, long sam, const float* B, long sbn, float* C, long ldc, "
       "const float* X, long sxm, long sxn", "M, N, K, A, sam, B, sbn, C, ldc, X, sxm, sxn")
_ENTRIES = f"""
extern "C" void fuseg_gemm_nn_@TAG@(long long macs, long nn_pack, {_NN[0]}) {{
  fuseg_lib_macs = macs;
  fuseg_lib_nn_pack = nn_pack;
  fuseg_mm_nn({_NN[1]});
}}
extern "C" void fuseg_gemm_nt_@TAG@(long long macs, long pack, {_NT[0]}) {{
  fuseg_lib_macs = macs;
  fuseg_lib_pack = pack;
  fuseg_mm_nt({_NT[1]});
}}
"""
# in a kernel's prelude: the routines' names call the library with the settings defined before the
# prelude (Note [thread thresholds measured here])
_CALLS = f"""// Note [one matmul library] (runtime/codegen/gemm_library.py): the routines are the matmul library's
extern "C" void fuseg_gemm_nn_@TAG@(long long macs, long nn_pack, {_NN[0]});
extern "C" void fuseg_gemm_nt_@TAG@(long long macs, long pack, {_NT[0]});
static inline void fuseg_mm_nn({_NN[0]}) {{
  fuseg_gemm_nn_@TAG@(FUSEG_PARALLEL_MACS, FUSEG_NN_PACK_ROWS, {_NN[1]});
}}
static inline void fuseg_mm_nt({_NT[0]}) {{
  fuseg_gemm_nt_@TAG@(FUSEG_PARALLEL_MACS, FUSEG_PACK_ROWS, {_NT[1]});
}}
"""


def gemm_texts(base: str) -> tuple[str, str, str]:
    """The library's source of Note [one matmul library] (the CPU prelude ``base``, the common part,
    the routines and their entry points), what a kernel's prelude has in the routines' place, and
    the tag both name the entry points by (the library source's digest: a kernel calls the library
    its own source names, and its cache key holds that name)."""
    template = "#define FUSEG_I long long\n" + base + GEMM_COMMON + _LIBRARY_SETTINGS + GEMM_ROUTINES + _ENTRIES
    tag = hashlib.sha256(template.encode()).hexdigest()[:16]
    return template.replace("@TAG@", tag), _CALLS.replace("@TAG@", tag), tag
