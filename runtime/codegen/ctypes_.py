"""C types, literals and the shared prelude of generated kernels (both targets).

Storage types are what a tensor's memory holds; compute types are what the kernel computes in:
fp16/bf16/fp32 compute in float (as torch's CUDA kernels do), fp64 in double, every integer type
in long long, bool in bool. fp16 and bf16 are stored as ``unsigned short`` and converted by the
bit-level routines below, the same code on the GPU and on the CPU, so the CPU build checks them.
"""

from __future__ import annotations

import math

import torch

__all__ = ["COMPUTE", "STORAGE", "Declined", "compute_type", "literal", "prelude", "storage_type"]


class Declined(Exception):
    """The generator does not take this segment; the message says why (recorded by the runtime)."""


STORAGE: dict[torch.dtype, str] = {
    torch.float32: "float", torch.float64: "double", torch.float16: "unsigned short",
    torch.bfloat16: "unsigned short", torch.bool: "bool", torch.uint8: "unsigned char",
    torch.int8: "signed char", torch.int16: "short", torch.int32: "int", torch.int64: "long long",
}
COMPUTE: dict[torch.dtype, str] = {
    torch.float32: "float", torch.float64: "double", torch.float16: "float", torch.bfloat16: "float",
    torch.bool: "bool", torch.uint8: "long long", torch.int8: "long long", torch.int16: "long long",
    torch.int32: "long long", torch.int64: "long long",
}


def storage_type(dtype: torch.dtype) -> str:
    if dtype not in STORAGE:
        raise Declined(f"dtype {dtype} is not supported by the kernel generator")
    return STORAGE[dtype]


def compute_type(dtype: torch.dtype) -> str:
    storage_type(dtype)
    return COMPUTE[dtype]


def literal(value: object, ctype: str) -> str:
    """A Python scalar as a C literal of ``ctype``: only a bool, int or float is taken, an int
    only within 64 bits (Note [checked source values] in checks.py)."""
    if isinstance(value, complex):
        raise Declined("complex scalars are not supported")
    if not isinstance(value, (bool, int, float)):
        raise Declined(f"scalar argument {type(value).__name__} {value!r:.60}: not a bool, int or float")
    if ctype == "bool":
        return "true" if value else "false"
    if ctype == "long long":
        if isinstance(value, float):
            if not math.isfinite(value):
                raise Declined(f"scalar {value} in an integer computation")
            value = int(value)
        v = int(value)
        if not -(2 ** 63) <= v < 2 ** 63:
            raise Declined(f"scalar {v} does not fit a 64-bit integer")
        return "(-9223372036854775807LL - 1)" if v == -(2 ** 63) else f"{v}LL"
    try:
        v = float(value)
    except OverflowError:
        raise Declined(f"scalar {value} does not fit a double") from None
    if math.isnan(v):
        return f"(({ctype})FUSEG_NAN)"
    if math.isinf(v):
        return f"(({ctype})FUSEG_INF)" if v > 0 else f"(-({ctype})FUSEG_INF)"
    text = repr(v)
    return f"{text}f" if ctype == "float" else text


# Note [bool loads as bytes]: GCC 12 (-O3 -march=native, AVX-512) does not vectorize a loop that
# loads through a ``bool*`` and computes in float ("no vectype for stmt" on the float load), nor one
# that casts a bool to float: every masked_fill / where under a mask and every masked softmax ran
# one element at a time (a masked softmax of 64x1024 took 163 us against eager's 45; 27 us after).
# So a bool element is read as its byte compared with 0 (torch stores bools as bytes: the same
# value, and defined for any byte a hostile buffer holds), and a bool widened to a number is a
# select (``lower.convert``). tests/test_vectorized_loops.py reads the vectorizer's own report.
def load(dtype: torch.dtype, ref: str) -> str:
    if dtype == torch.float16:
        return f"fuseg_h2f({ref})"
    if dtype == torch.bfloat16:
        return f"fuseg_bf2f({ref})"
    if dtype == torch.bool:  # Note [bool loads as bytes]
        return f"(*(const unsigned char*)&{ref} != 0)"
    return f"(({compute_type(dtype)}){ref})"  # Declined for a dtype the generator has no type for


def store(dtype: torch.dtype, expr: str) -> str:
    if dtype == torch.float16:
        return f"fuseg_f2h((float)({expr}))"
    if dtype == torch.bfloat16:
        return f"fuseg_f2bf((float)({expr}))"
    return f"(({storage_type(dtype)})({expr}))"


_COMMON = r"""
FUSEG_FN float fuseg_h2f(unsigned short h) {
  unsigned int sign = ((unsigned int)h & 0x8000u) << 16, e = ((unsigned int)h >> 10) & 0x1fu, m = (unsigned int)h & 0x3ffu;
  if (e == 0x1fu) return fuseg_bits2f(sign | 0x7f800000u | (m << 13));
  if (e == 0u) { float f = (float)m * 5.9604644775390625e-08f; return sign ? -f : f; }
  return fuseg_bits2f(sign | ((e + 112u) << 23) | (m << 13));
}
FUSEG_FN unsigned short fuseg_f2h(float f) {
  unsigned int x = fuseg_f2bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    unsigned int e = a >> 23;
    if (e < 102u) return (unsigned short)sign;
    unsigned int mant = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
    unsigned int q = mant >> shift, rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q += 1u;
    return (unsigned short)(sign | q);
  }
  unsigned int h = (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu), rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h += 1u;
  return (unsigned short)(sign | h);
}
FUSEG_FN float fuseg_bf2f(unsigned short b) { return fuseg_bits2f((unsigned int)b << 16); }
FUSEG_FN unsigned short fuseg_f2bf(float f) {
  unsigned int x = fuseg_f2bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
template <class T> FUSEG_FN T fuseg_max(T a, T b) { return (a != a || b != b) ? (T)(a + b) : (a > b ? a : b); }
template <class T> FUSEG_FN T fuseg_min(T a, T b) { return (a != a || b != b) ? (T)(a + b) : (a < b ? a : b); }
template <class T> FUSEG_FN T fuseg_sum(T a, T b) { return (T)(a + b); }
// Note [max without a NaN chain] (rows.py): the CPU's max/min passes compare alone (one vector
// max/min instruction) and keep a NaN flag beside them
template <class T> FUSEG_FN T fuseg_max_ordered(T a, T b) { return a > b ? a : b; }
template <class T> FUSEG_FN T fuseg_min_ordered(T a, T b) { return a < b ? a : b; }
template <class T> FUSEG_FN T fuseg_any(T a, T b) { return (T)(a || b); }
template <class T> FUSEG_FN T fuseg_all(T a, T b) { return (T)(a && b); }
// Note [kernel sizes as arguments] (symsizes.py): a symbolic size divided as Python divides
FUSEG_FN long long fuseg_fdiv(long long a, long long b) { long long q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
FUSEG_FN long long fuseg_fmod(long long a, long long b) { long long r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
"""

_CUDA = r"""
#define FUSEG_FN __device__ __forceinline__
#define FUSEG_UNROLL _Pragma("unroll")
#define FUSEG_ON_CPU(cpu, cuda) (cuda)
#define FUSEG_INF __int_as_float(0x7f800000)
#define FUSEG_NAN __int_as_float(0x7fc00000)
#define FUSEG_BLOCK ((FUSEG_I)blockIdx.x)
#define FUSEG_NBLOCKS ((FUSEG_I)gridDim.x)
#define FUSEG_THREAD ((FUSEG_I)threadIdx.x)
#define FUSEG_BLOCK_DIM ((FUSEG_I)blockDim.x)
FUSEG_FN float fuseg_bits2f(unsigned int u) { return __uint_as_float(u); }
FUSEG_FN unsigned int fuseg_f2bits(float f) { return __float_as_uint(f); }
FUSEG_FN float fuseg_exp(float x) { return expf(x); }
FUSEG_FN double fuseg_exp(double x) { return exp(x); }
FUSEG_FN float fuseg_tanh(float x) { return tanhf(x); }
FUSEG_FN double fuseg_tanh(double x) { return tanh(x); }
FUSEG_FN float fuseg_erf(float x) { return erff(x); }
FUSEG_FN double fuseg_erf(double x) { return erf(x); }
""" + _COMMON + r"""
// One value per thread in, the block's combined value out, in every thread.
template <class T, T (*OP)(T, T)> __device__ T fuseg_block_reduce(T v, T identity) {
  __shared__ T buf[32];
  for (int o = 16; o > 0; o >>= 1) v = OP(v, (T)__shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) buf[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? buf[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) v = OP(v, (T)__shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) buf[0] = v;
  }
  __syncthreads();
  return buf[0];
}
"""

# Note [no headers in the CPU prelude]: <cmath> was most of a kernel build (a translation unit of
# bart-tiny's 4 kernels: 0.22-0.29 s with it, 0.14 s without; g++ on an empty file 0.05 s), and a
# cold cache builds a program's kernels before its first call. The prelude includes nothing: the
# math functions the generators emit are declared here, for float and double, as libstdc++'s
# <cmath> defines them (each calls the compiler builtin of its own type: sqrt(float) is
# __builtin_sqrtf): bart-tiny's kernels disassemble to the same instructions either way. The
# kernel cases run every function against eager in float (one-op cases) and double ("math-double").
# A generator that emits a function not listed here gets a compiler error, not another overload.
_CPU_MATH = ("sqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh", "sinh",
             "cosh", "asin", "acos", "atan", "erf", "erfc", "floor", "ceil", "trunc", "rint", "fabs")

_CPU = r"""
#define FUSEG_MATH1(fn) static inline float fn(float x) { return __builtin_##fn##f(x); } \
  static inline double fn(double x) { return __builtin_##fn(x); }
#define FUSEG_MATH2(fn) static inline float fn(float x, float y) { return __builtin_##fn##f(x, y); } \
  static inline double fn(double x, double y) { return __builtin_##fn(x, y); }
namespace fuseg_math {
""" + "".join(f"FUSEG_MATH1({f})\n" for f in _CPU_MATH) + r"""FUSEG_MATH2(pow)
FUSEG_MATH2(copysign)
}
using namespace fuseg_math;
#define FUSEG_FN static inline
#define FUSEG_UNROLL
#define FUSEG_ON_CPU(cpu, cuda) (cpu)
#if defined(__GNUC__) && !defined(__clang__)
#define FUSEG_NO_IF_CONVERT __attribute__((optimize("no-tree-loop-if-convert")))
#else
#define FUSEG_NO_IF_CONVERT
#endif
#define FUSEG_INF (__builtin_inff())
#define FUSEG_NAN (__builtin_nanf(""))
#define FUSEG_BLOCK ((FUSEG_I)0)
#define FUSEG_NBLOCKS ((FUSEG_I)1)
#define FUSEG_THREAD ((FUSEG_I)0)
#define FUSEG_BLOCK_DIM ((FUSEG_I)1)
#define __global__
static inline float fuseg_bits2f(unsigned int u) { float f; __builtin_memcpy(&f, &u, 4); return f; }
static inline unsigned int fuseg_f2bits(float f) { unsigned int u; __builtin_memcpy(&u, &f, 4); return u; }
static inline float rsqrt(float x) { return 1.0f / sqrt(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
// Note [vectorizable exp]: libm's expf is a call the compiler cannot vectorize, so a float exp on
// the CPU is this branch-free one (as ATen's CPU kernels use a vectorized exp of their own, not
// libm's): Cody-Waite reduction by ln 2, a degree-6 polynomial, 2^n applied in two factors (so
// results down to the denormals are right); within 1 ulp of the exact value over [-103.97, 88.72]
// (tests/test_codegen.py checks it), inf/0 beyond, NaN kept.
static inline float fuseg_exp(float x) {
  float n = __builtin_rintf(x * 1.44269504088896341f);
  n = n < -152.f ? -152.f : (n > 129.f ? 129.f : n);
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int ni = (int)n, h = ni / 2;
  float y = p * fuseg_bits2f((unsigned int)(h + 127) << 23) * fuseg_bits2f((unsigned int)(ni - h + 127) << 23);
  y = x > 88.72283935546875f ? FUSEG_INF : y;
  y = x < -103.97208404541015625f ? 0.0f : y;
  return x != x ? x : y;
}
static inline double fuseg_exp(double x) { return exp(x); }
// Note [vectorizable tanh and erf]: libm's tanhf/erff are calls too, and GELU spends its time in
// them. tanh: for |x| < 0.625 an odd polynomial (Cephes tanhf), beyond 1 - 2 / (exp(2|x|) + 1)
// with the sign restored; within 2 ulp (tests/test_codegen.py). erf, which only GELU calls (the
// erf op is libm's): the Abramowitz-Stegun 7.1.26 form that ATen's own vectorized CPU erf (so
// eager's GELU) uses, for every x, absolute error below 1.5e-7. That is relative error in
// 1 + erf, all GELU needs. A Taylor branch for small |x| (relative accuracy of erf itself near 0)
// was dropped: a GELU over 1M floats on one thread went from 1.95x eager's time to 1.70x (three
// alternating runs). The rest of that gap is fused multiply-adds, which ATen's vector code uses
// and ISO C++ contraction rules keep out of ours. Both branch-free.
static inline float fuseg_tanh(float x) {
  const float a = fabs(x), z = x * x;
  const float big = 1.0f - 2.0f / (fuseg_exp(2.0f * a) + 1.0f);
  const float small = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z
                        + 1.33314422036e-1f) * z - 3.33332819422e-1f) * z * x + x;
  const float y = a < 0.625f ? small : copysign(big, x);
  return (x != x || x == 0.0f) ? x : y;  // NaN, and the sign of a zero, kept
}
static inline double fuseg_tanh(double x) { return tanh(x); }
static inline float fuseg_erf(float x) {
  const float a = fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  const float r = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  const float y = copysign(1.0f - r * fuseg_exp(-(x * x)), x);
  return (x != x || x == 0.0f) ? x : y;
}
static inline double fuseg_erf(double x) { return erf(x); }
""" + _COMMON + r"""
// Reductions a row pass may vectorize (#pragma omp simd): NaN propagates as in fuseg_max/min.
// (integer rows too: rows.py marks their max/min passes simd as well)
#pragma omp declare reduction(fuseg_max : float : omp_out = fuseg_max<float>(omp_out, omp_in)) initializer(omp_priv = -FUSEG_INF)
#pragma omp declare reduction(fuseg_max : double : omp_out = fuseg_max<double>(omp_out, omp_in)) initializer(omp_priv = -(double)FUSEG_INF)
#pragma omp declare reduction(fuseg_min : float : omp_out = fuseg_min<float>(omp_out, omp_in)) initializer(omp_priv = FUSEG_INF)
#pragma omp declare reduction(fuseg_min : double : omp_out = fuseg_min<double>(omp_out, omp_in)) initializer(omp_priv = (double)FUSEG_INF)
#pragma omp declare reduction(fuseg_max_ordered : float : omp_out = fuseg_max_ordered<float>(omp_out, omp_in)) initializer(omp_priv = -FUSEG_INF)
#pragma omp declare reduction(fuseg_max_ordered : double : omp_out = fuseg_max_ordered<double>(omp_out, omp_in)) initializer(omp_priv = -(double)FUSEG_INF)
#pragma omp declare reduction(fuseg_min_ordered : float : omp_out = fuseg_min_ordered<float>(omp_out, omp_in)) initializer(omp_priv = FUSEG_INF)
#pragma omp declare reduction(fuseg_min_ordered : double : omp_out = fuseg_min_ordered<double>(omp_out, omp_in)) initializer(omp_priv = (double)FUSEG_INF)
#pragma omp declare reduction(fuseg_max : long long : omp_out = fuseg_max<long long>(omp_out, omp_in)) initializer(omp_priv = (-9223372036854775807LL - 1))
#pragma omp declare reduction(fuseg_min : long long : omp_out = fuseg_min<long long>(omp_out, omp_in)) initializer(omp_priv = 9223372036854775807LL)
// One thread per block on the CPU: the block's value is the thread's.
template <class T, T (*OP)(T, T)> static inline T fuseg_block_reduce(T v, T) { return v; }
// Note [matmul kernels] (runtime/codegen/gemm.py): small float32 matmuls, C = A @ B (+ X), one
// batch after another. 16-float vectors (GCC/clang vector extensions: the compiler maps them to
// the machine's registers), multiply-adds contracted to FMA here only (FUSEG_CONTRACT).
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
typedef float fuseg_vf __attribute__((vector_size(64), aligned(4), may_alias));
typedef int fuseg_vi __attribute__((vector_size(64)));
#define FUSEG_LD(v, p) __builtin_memcpy(&(v), (p), 64)
#define FUSEG_ST(p, v) __builtin_memcpy((p), &(v), 64)
#define FUSEG_BC(x) ((fuseg_vf){} + (float)(x))
#if defined(__clang__)
#define FUSEG_SHUF(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define FUSEG_SHUF(a, b, ...) __builtin_shuffle(a, b, (fuseg_vi){__VA_ARGS__})
#endif
// The sums of 16 vectors at once: lane j of the result is the sum of a[j]'s lanes.
FUSEG_CONTRACT static inline fuseg_vf fuseg_hsum16(const fuseg_vf* a) {
  fuseg_vf t[8], u[4], w[2];
  for (int p = 0; p < 8; ++p)
    t[p] = FUSEG_SHUF(a[2 * p], a[2 * p + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
         + FUSEG_SHUF(a[2 * p], a[2 * p + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int p = 0; p < 4; ++p)
    u[p] = FUSEG_SHUF(t[2 * p], t[2 * p + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
         + FUSEG_SHUF(t[2 * p], t[2 * p + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int p = 0; p < 2; ++p)
    w[p] = FUSEG_SHUF(u[2 * p], u[2 * p + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29)
         + FUSEG_SHUF(u[2 * p], u[2 * p + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return FUSEG_SHUF(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
       + FUSEG_SHUF(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}
// B with unit strides along n: MR rows of C times NV vectors of 16 columns, k outermost.
template <int MR, int NV, long K, long SAM, long SAK, long SBK, long LDC, int BIAS, long SXM, long SXN>
FUSEG_CONTRACT static inline void fuseg_mm_nn_tile(const float* A, const float* B, const float* X, float* C) {
  FUSEG_CONTRACT_BODY
  fuseg_vf acc[MR][NV] = {};
  for (long k = 0; k < K; ++k) {
    fuseg_vf b[NV];
    for (int j = 0; j < NV; ++j) FUSEG_LD(b[j], B + k * SBK + 16 * j);
    for (int i = 0; i < MR; ++i) {
      const fuseg_vf a = FUSEG_BC(A[i * SAM + k * SAK]);
      for (int j = 0; j < NV; ++j) acc[i][j] += a * b[j];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NV; ++j) {
      fuseg_vf v = acc[i][j];
      if constexpr (BIAS && SXN == 1) { fuseg_vf x; FUSEG_LD(x, X + i * SXM + 16 * j); v = v + x; }
      if constexpr (BIAS && SXN == 0) v = v + FUSEG_BC(X[i * SXM]);
      if constexpr (BIAS && SXN != 0 && SXN != 1) {
        float x[16];
        for (int l = 0; l < 16; ++l) x[l] = X[i * SXM + (16 * j + l) * SXN];
        fuseg_vf xv;
        FUSEG_LD(xv, x);
        v = v + xv;
      }
      FUSEG_ST(C + i * LDC + 16 * j, v);
    }
}
// One element of C from any strides (the columns past the last whole vector).
template <long K, long SAK, long SBK>
FUSEG_CONTRACT static inline float fuseg_mm_dot(const float* a, const float* b) {
  FUSEG_CONTRACT_BODY
  float s = 0.0f;
  for (long k = 0; k < K; ++k) s += a[k * SAK] * b[k * SBK];
  return s;
}
template <long M, long N, long K, long SAM, long SAK, long SBK, long SBN, long LDC, int BIAS, long SXM, long SXN>
FUSEG_CONTRACT static inline void fuseg_mm_nn(const float* A, const float* B, const float* X, float* C) {
  constexpr long NW = N / 64 * 64, NT = (N % 64) / 16, NS = N / 16 * 16;
  for (long m = 0; m < M / 4 * 4; m += 4) {
    for (long n = 0; n < NW; n += 64)
      fuseg_mm_nn_tile<4, 4, K, SAM, SAK, SBK, LDC, BIAS, SXM, SXN>(A + m * SAM, B + n, X + m * SXM + n * SXN, C + m * LDC + n);
    if constexpr (NT > 0)
      fuseg_mm_nn_tile<4, NT, K, SAM, SAK, SBK, LDC, BIAS, SXM, SXN>(A + m * SAM, B + NW, X + m * SXM + NW * SXN, C + m * LDC + NW);
  }
  if constexpr (M % 4 > 0) {
    constexpr long m = M / 4 * 4;
    for (long n = 0; n < NW; n += 64)
      fuseg_mm_nn_tile<M % 4, 4, K, SAM, SAK, SBK, LDC, BIAS, SXM, SXN>(A + m * SAM, B + n, X + m * SXM + n * SXN, C + m * LDC + n);
    if constexpr (NT > 0)
      fuseg_mm_nn_tile<M % 4, NT, K, SAM, SAK, SBK, LDC, BIAS, SXM, SXN>(A + m * SAM, B + NW, X + m * SXM + NW * SXN, C + m * LDC + NW);
  }
  for (long m = 0; m < M; ++m)
    for (long n = NS; n < N; ++n) {
      const float s = fuseg_mm_dot<K, SAK, SBK>(A + m * SAM, B + n * SBN);
      C[m * LDC + n] = BIAS ? s + X[m * SXM + n * SXN] : s;
    }
}
// One step of a 16 x 16 transpose in registers: rows i and i + B swap their blocks of B lanes.
#define FUSEG_LANES(...) __VA_ARGS__
#define FUSEG_TRANSPOSE_STEP(r, B, LO, HI) \
  for (int i = 0; i < 16; ++i) \
    if (!(i & B)) { \
      const fuseg_vf x = r[i], y = r[i + B]; \
      r[i] = FUSEG_SHUF(x, y, FUSEG_LANES LO); \
      r[i + B] = FUSEG_SHUF(x, y, FUSEG_LANES HI); \
    }
// B (K x N, contiguous along k: row n of B's transpose at B + n * SBN) copied contiguous along n
// into P (K x N), 16 x 16 blocks transposed in registers, the edges element by element; then the
// loop for B contiguous along n reads P (Note [matmul kernels]: the dot-product loop sums across
// lanes for every element of C, which costs as much as its multiply-adds at K = 64).
template <long K, long N, long SBN>
static inline void fuseg_mm_pack(const float* B, float* P) {
  for (long n = 0; n + 16 <= N; n += 16)
    for (long k = 0; k + 16 <= K; k += 16) {
      fuseg_vf r[16];
      for (int i = 0; i < 16; ++i) FUSEG_LD(r[i], B + (n + i) * SBN + k);
      FUSEG_TRANSPOSE_STEP(r, 8, (0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
                           (8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31));
      FUSEG_TRANSPOSE_STEP(r, 4, (0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27),
                           (4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31));
      FUSEG_TRANSPOSE_STEP(r, 2, (0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29),
                           (2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31));
      FUSEG_TRANSPOSE_STEP(r, 1, (0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30),
                           (1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31));
      for (int j = 0; j < 16; ++j) FUSEG_ST(P + (k + j) * N + n, r[j]);
    }
  for (long n = 0; n < N; ++n)
    for (long k = (n < N / 16 * 16 ? K / 16 * 16 : 0); k < K; ++k) P[k * N + n] = B[n * SBN + k];
}
template <long M, long N, long K, long SAM, long SBN, long LDC, int BIAS, long SXM, long SXN>
static inline void fuseg_mm_nt_packed(const float* A, const float* B, const float* X, float* C) {
  float P[K * N];
  fuseg_mm_pack<K, N, SBN>(B, P);
  fuseg_mm_nn<M, N, K, SAM, 1, N, 1, LDC, BIAS, SXM, SXN>(A, P, X, C);
}
// A and B with unit strides along k: 4 x 4 elements of C as 16 dot products of 16-float vectors,
// summed across lanes at once (fuseg_hsum16); lane 4 i + j holds C[i][j].
template <long K, long SAM, long SBN>
FUSEG_CONTRACT static inline fuseg_vf fuseg_mm_nt_tile(const float* A, const float* B) {
  FUSEG_CONTRACT_BODY
  fuseg_vf acc[16] = {};
  for (long k = 0; k + 16 <= K; k += 16) {
    fuseg_vf a[4], b[4];
    for (int i = 0; i < 4; ++i) FUSEG_LD(a[i], A + i * SAM + k);
    for (int j = 0; j < 4; ++j) FUSEG_LD(b[j], B + j * SBN + k);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) acc[4 * i + j] += a[i] * b[j];
  }
  fuseg_vf r = fuseg_hsum16(acc);
  if constexpr (K % 16 > 0) {
    float t[16];
    __builtin_memcpy(t, &r, 64);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        for (long k = K / 16 * 16; k < K; ++k) t[4 * i + j] += A[i * SAM + k] * B[j * SBN + k];
    __builtin_memcpy(&r, t, 64);
  }
  return r;
}
template <long K>
FUSEG_CONTRACT static inline float fuseg_mm_nt_dot(const float* a, const float* b) {
  FUSEG_CONTRACT_BODY
  fuseg_vf acc = {};
  for (long k = 0; k + 16 <= K; k += 16) {
    fuseg_vf x, y;
    FUSEG_LD(x, a + k);
    FUSEG_LD(y, b + k);
    acc += x * y;
  }
  float t[16], s = 0.0f;
  __builtin_memcpy(t, &acc, 64);
  for (int l = 0; l < 16; ++l) s += t[l];
  for (long k = K / 16 * 16; k < K; ++k) s += a[k] * b[k];
  return s;
}
template <long M, long N, long K, long SAM, long SBN, long LDC, int BIAS, long SXM, long SXN>
FUSEG_CONTRACT static inline void fuseg_mm_nt(const float* A, const float* B, const float* X, float* C) {
  for (long m = 0; m < M / 4 * 4; m += 4)
    for (long n = 0; n < N / 4 * 4; n += 4) {
      const fuseg_vf r = fuseg_mm_nt_tile<K, SAM, SBN>(A + m * SAM, B + n * SBN);
      float t[16];
      __builtin_memcpy(t, &r, 64);
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j)
          C[(m + i) * LDC + n + j] = BIAS ? t[4 * i + j] + X[(m + i) * SXM + (n + j) * SXN] : t[4 * i + j];
    }
  for (long m = 0; m < M; ++m)
    for (long n = (m < M / 4 * 4 ? N / 4 * 4 : 0); n < N; ++n) {
      const float s = fuseg_mm_nt_dot<K>(A + m * SAM, B + n * SBN);
      C[m * LDC + n] = BIAS ? s + X[m * SXM + n * SXN] : s;
    }
}
// Note [attention kernels] (runtime/codegen/attention.py): one head of a small float32
// attention. The scores P = Q K^T (L x S, on the stack) by the matmul loops above (Q and K
// contiguous along e: dot products, or from PACK rows K first copied contiguous along s), each row scaled, masked (an additive mask, or keys past the row's own
// index when CAUSAL), soft-maxed in place, then O = P V (V contiguous along e, O's rows OSM
// apart). A row whose scores are all -inf gets zeros and a logsumexp of 0, as ATen's CPU kernel
// gives it.
template <long L, long S, long E, int PACK, long QSM, long KSN, long VSS, long OSM,
          int MASK, long MSM, long MSN, int CAUSAL, int LSE, long LSM>
static inline void fuseg_attention_head(const float* Q, const float* K, const float* V, const float* Mk,
                                        const float scale, float* O, float* Lse) {
  float P[L * S];
  if constexpr (PACK) fuseg_mm_nt_packed<L, S, E, QSM, KSN, S, 0, 0, 0>(Q, K, nullptr, P);
  else fuseg_mm_nt<L, S, E, QSM, KSN, S, 0, 0, 0>(Q, K, nullptr, P);
  for (long i = 0; i < L; ++i) {
    float* r = P + i * S;
    const long n = CAUSAL ? (i + 1 < S ? i + 1 : S) : S;  // the keys row i sees
    float mx = -FUSEG_INF;
    int nan = 0;  // Note [max without a NaN chain] (rows.py)
#pragma omp simd reduction(fuseg_max_ordered : mx) reduction(| : nan)
    for (long j = 0; j < n; ++j) {
      float s = r[j] * scale;
      if constexpr (MASK) s = s + Mk[i * MSM + j * MSN];
      r[j] = s;
      mx = fuseg_max_ordered<float>(mx, s);
      nan |= s != s;
    }
    mx = nan ? __builtin_nanf("") : mx;
    float sum = 0.0f;
    if (mx == -FUSEG_INF) {
      for (long j = 0; j < S; ++j) r[j] = 0.0f;
    } else {
#pragma omp simd reduction(+ : sum)
      for (long j = 0; j < n; ++j) {
        const float e = fuseg_exp(r[j] - mx);
        r[j] = e;
        sum += e;
      }
      const float inv = 1.0f / sum;
      for (long j = 0; j < n; ++j) r[j] = r[j] * inv;
      for (long j = n; j < S; ++j) r[j] = 0.0f;
    }
    if constexpr (LSE) Lse[i * LSM] = (mx == -FUSEG_INF ? 0.0f : mx) + fuseg_math::log(sum == 0.0f ? 1.0f : sum);
  }
  fuseg_mm_nn<L, E, S, S, 1, VSS, 1, OSM, 0, 0, 0>(P, V, nullptr, O);
}
"""


def prelude(target: str) -> str:
    return _CUDA if target == "cuda" else _CPU
