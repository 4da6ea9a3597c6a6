// exp, log1p and pow of float32 on GCC vector types (GCC and Clang), for the CPU kernels whose
// cost is transcendental functions over millions of values. The C library's functions are
// scalar calls the compiler cannot vectorize; these are branch-free range reduction plus a short
// polynomial, so a loop over vectors runs in SIMD registers of whatever width the function is
// compiled for (cpu/isa_dispatch.h). exp and log1p are within 3 ulp of the correctly rounded
// result on their domain, denormal results included; pow goes through double precision (the
// rounding of gamma * log(q) would otherwise cost |gamma log q| ulp) and is within 1 ulp.
//
// VectorMath<FloatN> takes one of the Float4 / Float8 / Float16 lane sets below.
#pragma once

#include <cstdint>

namespace detcore {

#define DETCORE_LANES(name, n)                                                 \
  struct name {                                                                \
    static constexpr int kLanes = n;                                           \
    typedef float V __attribute__((vector_size(4 * n)));                       \
    typedef int32_t I __attribute__((vector_size(4 * n)));                     \
    typedef uint32_t U __attribute__((vector_size(4 * n)));                    \
    typedef double D __attribute__((vector_size(8 * n)));                      \
    typedef int64_t I64 __attribute__((vector_size(8 * n)));                   \
    typedef uint64_t U64 __attribute__((vector_size(8 * n)));                  \
  }
DETCORE_LANES(Float4, 4);
DETCORE_LANES(Float8, 8);
DETCORE_LANES(Float16, 16);
#undef DETCORE_LANES

#define DETCORE_VECTOR_INLINE inline __attribute__((always_inline))

template <typename L>
struct VectorMath {
  typedef typename L::V V;
  typedef typename L::I I;
  typedef typename L::U U;
  typedef typename L::D D;
  typedef typename L::I64 I64;
  typedef typename L::U64 U64;

  static DETCORE_VECTOR_INLINE V splat(float s) { return V{} + s; }

  // exp(y) for y <= 0 (NaN gives NaN). y = k ln2 + r with |r| <= ln2 / 2: exp(r) by its Taylor
  // series to r^7 (error under 1e-8), times 2^k in two halves, each a normal float, so that
  // results down to the smallest denormal come out rounded once.
  static DETCORE_VECTOR_INLINE V exp(V y) {
    y = y < -104.0f ? -104.0f : y;  // exp(-104) rounds to 0 in float32
    V k = (y * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(y / ln2)
    k = k == k ? k : 0.0f;  // a NaN lane: keep the integer conversion below defined
    // ln2 in two parts, the first with 9 significant bits so that k * ln2_hi is exact.
    V r = y - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    V poly = r * (1.0f / 5040) + 1.0f / 720;
    poly = poly * r + 1.0f / 120;
    poly = poly * r + 1.0f / 24;
    poly = poly * r + 1.0f / 6;
    poly = poly * r + 0.5f;
    poly = poly * r + 1.0f;
    poly = poly * r + 1.0f;
    const I n = __builtin_convertvector(k, I);  // in [-150, 0]
    const I half = n >> 1;
    return poly * pow2(half) * pow2(n - half);
  }

  // log1p(e) for e in [0, 1] (NaN gives NaN): 2 atanh(s) with s = e / (2 + e) <= 1/3, by the odd
  // series to s^15 (error under 2e-9). Full relative accuracy for tiny e (no 1 + e rounding).
  static DETCORE_VECTOR_INLINE V log1p(V e) {
    const V two_s = (e + e) / (e + 2.0f);  // 2s, so that the smallest denormal e survives
    const V z = 0.25f * two_s * two_s;
    V poly = z * (1.0f / 15) + 1.0f / 13;
    poly = poly * z + 1.0f / 11;
    poly = poly * z + 1.0f / 9;
    poly = poly * z + 1.0f / 7;
    poly = poly * z + 1.0f / 5;
    poly = poly * z + 1.0f / 3;
    poly = poly * z + 1.0f;
    return two_s * poly;
  }

  // q^gamma for q in [0, 1] and gamma > 0 (NaN gives NaN), as exp(gamma log q) in double.
  static DETCORE_VECTOR_INLINE V pow(V q, float gamma) {
    const D qd = __builtin_convertvector(q, D);
    const D y = static_cast<double>(gamma) * log_double(qd);
    const V result = __builtin_convertvector(exp_double(y), V);
    return q == 0.0f ? 0.0f : result;
  }

 private:
  // 2^n for integer lanes n in [-126, 127], built in the exponent field.
  static DETCORE_VECTOR_INLINE V pow2(I n) { return (V)((U)(n + 127) << 23); }

  // log(q) for positive, normal q (every positive float is a normal double); NaN gives NaN.
  // q = 2^k m with m in [sqrt(1/2), sqrt(2)]: log m = 2 atanh(s), s = (m - 1) / (m + 1), |s| <=
  // 0.1716, by the odd series to s^13 (error under 5e-13).
  static DETCORE_VECTOR_INLINE D log_double(D q) {
    const I64 bits = (I64)q;
    I64 exponent = ((bits >> 52) & 0x7ff) - 1023;
    D m = (D)((bits & 0x000fffffffffffffLL) | 0x3ff0000000000000LL);  // in [1, 2)
    const I64 high = m > 1.4142135623730951;
    m = high ? m * 0.5 : m;
    exponent -= high;  // a true lane is -1
    const D s = (m - 1.0) / (m + 1.0);
    const D z = s * s;
    D poly = z * (1.0 / 13) + 1.0 / 11;
    poly = poly * z + 1.0 / 9;
    poly = poly * z + 1.0 / 7;
    poly = poly * z + 1.0 / 5;
    poly = poly * z + 1.0 / 3;
    poly = poly * z + 1.0;
    const D log_m = 2.0 * s * poly;
    const D result = __builtin_convertvector(exponent, D) * 0.6931471805599453 + log_m;
    return q == q ? result : q;  // NaN stays NaN
  }

  // exp(y) for y <= 0, rounded to float afterwards: below -110 it is 0 in float32, so y is
  // clamped there and 2^k stays a normal double. Taylor series of exp(r) to r^11 (|r| <=
  // ln2 / 2: error under 1e-14); ln2 in two parts, the first with 21 significant bits.
  static DETCORE_VECTOR_INLINE D exp_double(D y) {
    y = y < -110.0 ? -110.0 : y;
    D k = (y * 1.4426950408889634 + 6755399441055744.0) - 6755399441055744.0;  // round
    k = k == k ? k : 0.0;  // a NaN lane: keep the integer conversion below defined
    D r = y - k * 0x1.62e42p-1;
    r = r - k * 0x1.fdf473de6af28p-22;
    D poly = r * (1.0 / 39916800) + 1.0 / 3628800;
    poly = poly * r + 1.0 / 362880;
    poly = poly * r + 1.0 / 40320;
    poly = poly * r + 1.0 / 5040;
    poly = poly * r + 1.0 / 720;
    poly = poly * r + 1.0 / 120;
    poly = poly * r + 1.0 / 24;
    poly = poly * r + 1.0 / 6;
    poly = poly * r + 0.5;
    poly = poly * r + 1.0;
    poly = poly * r + 1.0;
    const I64 n = __builtin_convertvector(k, I64);  // in [-159, 0]
    return poly * (D)((U64)(n + 1023) << 52);
  }
};

}  // namespace detcore
