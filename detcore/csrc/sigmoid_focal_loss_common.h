// The sigmoid focal loss of one element and its derivatives, shared by the CPU and CUDA kernels
// so that both compute the same formula. RetinaNet's loss (Lin et al. 2017), in torchvision's
// form: with p = sigmoid(x) and a target t in [0, 1],
//   ce   = -t log(p) - (1 - t) log(1 - p)      binary cross-entropy with logits
//   q    = t (1 - p) + (1 - t) p               1 - p_t
//   loss = a_t * ce * q^gamma,   a_t = alpha t + (1 - alpha)(1 - t), or 1 when alpha < 0.
// Everything comes from one exp(-|x|): p and 1 - p without cancellation, ce in its log-sigmoid
// form (log1p(exp(-|x|)) + max(x, 0) - x t), so large |x| neither overflows nor rounds p to 1.
// The derivatives are taken on paper, with every factor that can be 0 / 0 at a saturated logit
// written as a bounded ratio (p (1 - p) / q <= 1, ce / q <= |x| + 1), so they stay finite where
// torchvision's autograd gives NaN (gamma < 1 and |x| large).
//
// V is the value type: a scalar (CUDA, and the CPU's float64) or a GCC vector of floats (the
// CPU's float32: the same source, every operation lane by lane, `mask ? a : b` a blend). Math
// gives exp (of a non-positive argument), log1p (on [0, 1]), pow (of q in [0, 1], gamma > 0)
// and splat (a constant V) for V; ScalarMath below is the C library's.
#pragma once

#include <cmath>
#include <cstdint>

#include "rounded_ops.h"  // DETCORE_HOST_DEVICE

// Always inlined on the host too: the CPU kernel calls focal_terms on vectors from functions
// compiled for AVX2 / AVX-512, and a vector must not cross a call into code compiled for another
// instruction set (cpu/isa_dispatch.h).
#if defined(__CUDACC__)
#define DETCORE_FOCAL_INLINE __host__ __device__ __forceinline__
#else
#define DETCORE_FOCAL_INLINE inline __attribute__((always_inline))
#endif

namespace detcore {

// gamma 0, 1 and 2 (RetinaNet's) are products; any other value goes through pow.
enum class FocalGamma : int { kZero, kOne, kTwo, kOther };

// S is the scalar type of the computation (float or double).
template <typename S>
struct FocalParams {
  // a_t = alpha_pos t + alpha_neg (1 - t): alpha and 1 - alpha, or 1 and 1 (no weighting). Two
  // products of non-negative terms: a_t keeps its relative precision for any alpha, where the
  // affine form (1 - alpha) + (2 alpha - 1) t cancels at t = 1 and loses alpha's low bits (all
  // of them in float32 for alpha below 2^-24).
  S alpha_pos;
  S alpha_neg;
  S alpha_slope;  // d a_t / d t = alpha_pos - alpha_neg: 2 alpha - 1, or 0
  S gamma;
  FocalGamma kind;
};

template <typename S>
inline FocalParams<S> focal_params(double alpha, double gamma) {
  FocalParams<S> f;
  const bool weighted = alpha >= 0;
  f.alpha_pos = static_cast<S>(weighted ? alpha : 1.0);
  f.alpha_neg = static_cast<S>(weighted ? 1 - alpha : 1.0);
  f.alpha_slope = static_cast<S>(weighted ? 2 * alpha - 1 : 0.0);
  f.gamma = static_cast<S>(gamma);
  f.kind = gamma == 0   ? FocalGamma::kZero
           : gamma == 1 ? FocalGamma::kOne
           : gamma == 2 ? FocalGamma::kTwo
                        : FocalGamma::kOther;
  return f;
}

template <typename V>
struct FocalTerms {
  V loss;
  V d_input;   // d loss / d x
  V d_target;  // d loss / d t
};

// The loss and its two derivatives at (x, t). A caller that uses only some of them lets the
// compiler drop the rest (everything is inline).
template <typename V, typename S, typename Math>
DETCORE_FOCAL_INLINE FocalTerms<V> focal_terms(V x, V t, const FocalParams<S>& f) {
  const S zero = 0, one = 1;
  const V abs_x = x < zero ? -x : x;
  const V e = Math::exp(-abs_x);                // exp(-|x|), in [0, 1]
  const V big = one / (e + one);                // sigmoid(|x|)
  const V small = e * big;                      // sigmoid(-|x|) = 1 - sigmoid(|x|)
  const V p = x < zero ? small : big;           // sigmoid(x)
  const V p1 = x < zero ? big : small;          // 1 - sigmoid(x)
  const V u = one - t;
  // max(x, 0) - x t, as one product: for a hard target the side that matches is exactly 0, so
  // the small log1p term keeps all its bits (m + x - x rounds m away at large x).
  const V ce = Math::log1p(e) + (x > zero ? u * x : -(t * x));
  const V q = t * p1 + u * p;                   // 1 - p_t, in [0, 1]
  const V a = f.alpha_pos * t + f.alpha_neg * u;  // 1 exactly when unweighted: t + (1 - t)

  // w = q^gamma, and ce_dw = ce * d(q^gamma)/dq, each 0 where q = 0 and gamma > 0 (its limit:
  // there ce vanishes as fast as q).
  V w, ce_dw;
  switch (f.kind) {
    case FocalGamma::kZero:
      w = Math::splat(one);
      ce_dw = Math::splat(zero);
      break;
    case FocalGamma::kOne:
      w = q;
      ce_dw = ce;
      break;
    case FocalGamma::kTwo:
      w = q * q;
      ce_dw = S(2) * q * ce;
      break;
    default: {
      // ce / q as a quotient: 1 / q overflows for a denormal q, ce / q is at most |x| + 1.
      const V ce_over_q = q > zero ? ce / q : zero;
      w = Math::pow(q, f.gamma);
      ce_dw = f.gamma * w * ce_over_q;
      break;
    }
  }
  FocalTerms<V> out;
  out.loss = a * ce * w;
  // d ce/dx = p - t, d q/dx = (1 - 2t) p (1 - p), d ce/dt = -x, d q/dt = 1 - 2p.
  const V d_ce = p * u - t * p1;
  out.d_input = a * (d_ce * w + ce_dw * ((u - t) * p * p1));
  out.d_target = f.alpha_slope * ce * w + a * (ce_dw * (p1 - p) - x * w);
  return out;
}

// A target must be a probability; NaN is not one.
template <typename S>
DETCORE_HOST_DEVICE bool focal_target_ok(S t) {
  return t >= S(0) && t <= S(1);
}

// The C library's functions (the host's, or CUDA's in device code), for scalars.
struct ScalarMath {
  DETCORE_HOST_DEVICE static float exp(float v) { return ::expf(v); }
  DETCORE_HOST_DEVICE static double exp(double v) { return ::exp(v); }
  DETCORE_HOST_DEVICE static float pow(float q, float gamma) { return ::powf(q, gamma); }
  DETCORE_HOST_DEVICE static double pow(double q, double gamma) { return ::pow(q, gamma); }
  DETCORE_HOST_DEVICE static float log1p(float v) { return ::log1pf(v); }
  DETCORE_HOST_DEVICE static double log1p(double v) { return ::log1p(v); }
  template <typename S>
  DETCORE_HOST_DEVICE static S splat(S v) {
    return v;
  }
};

}  // namespace detcore
