"""C types, literals and the shared prelude of generated kernels (both targets).

Storage types are what a tensor's memory holds; compute types are what the kernel computes in:
fp16/bf16/fp32 compute in float (as torch's CUDA kernels do), fp64 in double, every integer type
in long long, bool in bool. fp16 and bf16 are stored as ``unsigned short`` and converted by the
bit-level routines below, the same code on the GPU and on the CPU, so the CPU build checks them.
"""

from __future__ import annotations

import math

import torch

from ...machine.compiler import Declined
from .gemm_prelude import ATTENTION_ROUTINES, GEMM_COMMON, gemm_texts

__all__ = ["COMPUTE", "GEMM_LIBRARY", "GEMM_TAG", "STORAGE", "Declined", "compute_type", "literal", "prelude", "storage_type"]


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
// Note [half conversions on the GPU]: on CUDA a float <-> fp16 conversion is one cvt instruction
// (sm_80 and later for bf16), which rounds to nearest even as the software versions below do (and
// as ATen's CUDA kernels convert); the software versions cost 6-20 integer operations each, and a
// bf16 RoPE block on the H100 ran at 600-800 GB/s with them, bound by arithmetic, not memory.
// FUSEG_SOFT_HALF (FUSEG_CUDA_TUNING=0: Note [CUDA launch shapes]) keeps the software versions.
#if defined(__CUDA_ARCH__) && !defined(FUSEG_SOFT_HALF)
FUSEG_FN float fuseg_h2f(unsigned short h) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
FUSEG_FN unsigned short fuseg_f2h(float f) { unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
#elif defined(FUSEG_F16C_HALF) && !defined(__CUDACC__) && defined(__F16C__) && defined(__FLT16_MAX__)
// F16C's scalar instructions (Note [fp16 on the CPU]), the "before" of perf/experiments/half_vectors.py
FUSEG_FN float fuseg_h2f(unsigned short h) { _Float16 x; __builtin_memcpy(&x, &h, 2); return (float)x; }
FUSEG_FN unsigned short fuseg_f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; __builtin_memcpy(&h, &x, 2); return h; }
#else
// Note [fp16 on the CPU]: the CPU converts fp16 with integer and float operations and selects, no
// branch, so a loop over fp16 values vectorizes. GCC 12 vectorizes no _Float16 conversion, with
// F16C or AVX512-FP16 alike (checked for -march=native on Zen 4 and -march=sapphirerapids): a
// loop of F16C's one-value instructions was scalar, and so was its sum: a float layer norm of an
// fp16 row of 4096 added its squares into one accumulator, its rstd 12x eager's error, and ran
// one element at a time. Each piece is exact: fp16's exponent and mantissa moved to float's
// places with the bias difference (112) added; a subnormal is its mantissa times 2^-24 (an int
// converted and scaled by a power of two); inf and NaN keep their bits under float's all-ones
// exponent. Back: a normal value is rounded to nearest even on its bits (as the bf16 rounding
// does); one below fp16's smallest normal is added to 0.5, whose float ulp is fp16's subnormal
// step, so the hardware's rounding to nearest even does it and the sum's low bits are the
// result; past 65520 it is inf and a NaN is fp16's quiet NaN. tests/test_codegen.py checks every
// fp16 value and the ties between them, bit for bit; CUDA with FUSEG_SOFT_HALF runs these too.
FUSEG_FN float fuseg_h2f(unsigned short h) {
  unsigned int sign = ((unsigned int)h & 0x8000u) << 16, em = (unsigned int)h & 0x7fffu, e = em & 0x7c00u;
  unsigned int normal = (em << 13) + (112u << 23), infnan = (em << 13) | 0x7f800000u;
  unsigned int sub = fuseg_f2bits((float)(int)(em & 0x3ffu) * 5.9604644775390625e-08f);
  return fuseg_bits2f(sign | (e == 0x7c00u ? infnan : (e == 0u ? sub : normal)));
}
FUSEG_FN unsigned short fuseg_f2h(float f) {
  unsigned int x = fuseg_f2bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  unsigned int normal = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  unsigned int sub = fuseg_f2bits(fuseg_bits2f(a) + 0.5f) - 0x3f000000u;
  unsigned int h = a > 0x7f800000u ? 0x7e00u : (a >= 0x477ff000u ? 0x7c00u : (a < 0x38800000u ? sub : normal));
  return (unsigned short)(sign | h);
}
#endif
FUSEG_FN float fuseg_bf2f(unsigned short b) { return fuseg_bits2f((unsigned int)b << 16); }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && !defined(FUSEG_SOFT_HALF)
FUSEG_FN unsigned short fuseg_f2bf(float f) { unsigned short b; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f)); return b; }
#else
FUSEG_FN unsigned short fuseg_f2bf(float f) {
  unsigned int x = fuseg_f2bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
  return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
#endif
template <class T> FUSEG_FN T fuseg_max(T a, T b) { return (a != a || b != b) ? (T)(a + b) : (a > b ? a : b); }
template <class T> FUSEG_FN T fuseg_min(T a, T b) { return (a != a || b != b) ? (T)(a + b) : (a < b ? a : b); }
template <class T> FUSEG_FN T fuseg_sum(T a, T b) { return (T)(a + b); }
// Note [max without a NaN chain] (rows.py): the CPU's max/min passes compare alone (one vector
// max/min instruction) and keep a NaN flag beside them
template <class T> FUSEG_FN T fuseg_max_ordered(T a, T b) { return a > b ? a : b; }
template <class T> FUSEG_FN T fuseg_min_ordered(T a, T b) { return a < b ? a : b; }
template <class T> FUSEG_FN T fuseg_any(T a, T b) { return (T)(a || b); }
// Note [sums in chunks] (cascade.py): a chunk's partial sum added into the row's sum with its
// rounding error kept aside (Neumaier); the total adds the error back where the sum is finite
template <class T> FUSEG_FN void fuseg_sum_into(T& s, T& c, T x) {
  const T t = s + x;
  c += ((s < 0 ? -s : s) >= (x < 0 ? -x : x)) ? (T)((s - t) + x) : (T)((x - t) + s);
  s = t;
}
template <class T> FUSEG_FN T fuseg_sum_total(T s, T c) { return s - s == 0 ? (T)(s + c) : s; }
// Note [sums in ATen's order, streamed] (cascade.py): the power of two of ATen's cascade step for n
// additions per accumulator, max(4, CeilLog2(n) / 4) (a loop: no branch in the kernel's source)
FUSEG_FN int fuseg_cascade_power(long long n) { int c = 1; while (c < 62 && (1LL << c) < n) ++c; return c / 4 > 4 ? c / 4 : 4; }
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
// OpenMP's thread count and number (Note [a long row's sum shared among threads] in cascade.py),
// declared: the prelude includes nothing
extern "C" int omp_get_max_threads(void);
extern "C" int omp_get_num_threads(void);
extern "C" int omp_get_thread_num(void);
#define FUSEG_FN static inline
#define FUSEG_UNROLL
#define FUSEG_ON_CPU(cpu, cuda) (cpu)
#if defined(__GNUC__) && !defined(__clang__)
#define FUSEG_NO_IF_CONVERT __attribute__((optimize("no-tree-loop-if-convert")))
#define FUSEG_NO_PRE __attribute__((optimize("no-tree-pre")))
#else
#define FUSEG_NO_IF_CONVERT
#define FUSEG_NO_PRE
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
// Note [exp's range by its argument]: the argument is clamped to [-104, 89] before the reduction,
// and the result's range follows from it: past 88.72 the product overflows to inf, under -103.97
// it rounds to 0, so the selects of inf and 0 for arguments beyond them, and the clamp of n (three
// compares and blends each way, as g++ 12.2 compiled the nested ternary) went; 2^n's split takes
// n >> 1 (n in [-150, 129]: both factors normal) where n / 2 needed a sign fix. Bit for bit the
// results of before for all 2^32 floats (NaNs too; a scratch program), the loop of a lone exp
// 46 -> 34 instructions a vector of 16 (g++ 12.2, AVX-512), 1.13-1.27x its throughput on one
// thread of the Intel Xeon with AMX (three rounds), an exp kernel over 256 x 4096 floats on two
// threads 1.60x eager's time before, 1.28x after, a softmax 1.28x before, 1.10x after (one run
// each, interleaved with eager).
// Note [fused multiply-adds in the math functions]: the kernels are built with -ffp-contract=off
// (an op's a * b + c rounds twice, as eager's does), but inside exp, tanh and erf, whose results
// are approximations anyway, the polynomials and the reduction are written as fused multiply-adds
// (FUSEG_MAD) where the CPU has them (-march=native defines __FMA__), as ATen's vectorized exp
// (Sleef) is: a SiLU-times-input kernel over 256x2816 floats took 0.80x the time (250 -> 201 us on
// two threads of the AMD EPYC family 25 model 17, the same source otherwise; scratch), and the
// results stay within the tests' bounds (tests/test_codegen.py). Without FMA they are the plain
// multiply and add (a call of libm's fmaf would not vectorize).
#if defined(__FMA__)
#define FUSEG_MAD(a, b, c) __builtin_fmaf((a), (b), (c))
#else
#define FUSEG_MAD(a, b, c) ((a) * (b) + (c))
#endif
static inline float fuseg_exp(float x) {
  float c = x > -104.0f ? x : -104.0f;  // (Note [exp's range by its argument])
  c = c < 89.0f ? c : 89.0f;
  const float n = __builtin_rintf(c * 1.44269504088896341f);
  float r = FUSEG_MAD(n, -0.693359375f, c);
  r = FUSEG_MAD(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = FUSEG_MAD(p, r, 1.3981999507e-3f);
  p = FUSEG_MAD(p, r, 8.3334519073e-3f);
  p = FUSEG_MAD(p, r, 4.1665795894e-2f);
  p = FUSEG_MAD(p, r, 1.6666665459e-1f);
  p = FUSEG_MAD(p, r, 5.0000001201e-1f);
  p = FUSEG_MAD(p * r, r, r) + 1.0f;
  const int ni = (int)n, h = ni >> 1;
  const float y = p * fuseg_bits2f((unsigned int)(h + 127) << 23) * fuseg_bits2f((unsigned int)(ni - h + 127) << 23);
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
  const float q = FUSEG_MAD(FUSEG_MAD(FUSEG_MAD(FUSEG_MAD(-5.70498872745e-3f, z, 2.06390887954e-2f), z,
                                                  -5.37397155531e-2f), z, 1.33314422036e-1f), z, -3.33332819422e-1f);
  const float small = FUSEG_MAD(q * z, x, x);
  const float y = a < 0.625f ? small : copysign(big, x);
  return (x != x || x == 0.0f) ? x : y;  // NaN, and the sign of a zero, kept
}
static inline double fuseg_tanh(double x) { return tanh(x); }
static inline float fuseg_erf(float x) {
  const float a = fabs(x);
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  const float r = FUSEG_MAD(FUSEG_MAD(FUSEG_MAD(FUSEG_MAD(1.061405429f, t, -1.453152027f), t, 1.421413741f), t,
                                     -0.284496736f), t, 0.254829592f) * t;
  const float y = copysign(FUSEG_MAD(-r, fuseg_exp(-(x * x)), 1.0f), x);
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
"""
#: Note [one matmul library] (runtime/codegen/gemm_library.py): the library's source, and what the
#: kernels' prelude holds in its routines' place
GEMM_LIBRARY, _GEMM_CALLS, GEMM_TAG = gemm_texts(_CPU)
_CPU = _CPU + GEMM_COMMON + _GEMM_CALLS + ATTENTION_ROUTINES + "\n"


def prelude(target: str) -> str:
    return _CUDA if target == "cuda" else _CPU
