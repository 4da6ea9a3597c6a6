// Sigmoid focal loss forward and backward on the CPU: one pass over the logits and targets,
// nothing in between (torchvision's Python version makes about a dozen full-size temporaries).
//
// - The formula is sigmoid_focal_loss_common.h's, shared with the CUDA kernel.
// - float32 runs on vectors (cpu/vector_math.h: exp, log1p and log in SIMD registers), in
//   functions compiled for the baseline, AVX2 and AVX-512 (cpu/isa_dispatch.h); float64 on
//   scalars with the C library's functions; float16 / bfloat16 in float32, cast back once.
// - Work is split into fixed blocks of kBlock elements, taken by threads as they come free.
//   A block's sum is taken in double, lane by lane in a fixed order, and the block sums are
//   added in block order: a 'sum' or 'mean' does not depend on the number of threads.
// - Each target is checked as it is read (a probability in [0, 1]); the first bad one, in
//   memory order, is reported after the pass.
// The vector lanes are passed between inlined functions only; their ABI does not matter.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <torch/library.h>

#include "../checks.h"
#include "../sigmoid_focal_loss_common.h"
#include "compute_type.h"
#include "isa_dispatch.h"
#include "parallel.h"
#include "vector_math.h"

namespace detcore {
namespace {

// Elements per block (the unit of threading and of the fixed summation order).
constexpr int64_t kBlock = 16384;
// About how many simple operations one element costs, for grain_for.
constexpr int64_t kWorkPerElement = 40;

// How a block loop reads and writes values: one scalar at a time, or L::kLanes floats.
template <typename S>
struct ScalarLanes {
  typedef S Scalar;
  typedef S V;
  typedef ScalarMath Math;
  static constexpr int kLanes = 1;
  static DETCORE_FOCAL_INLINE V load(const S* p) { return *p; }
  static DETCORE_FOCAL_INLINE void store(S* p, V v) { *p = v; }
  static DETCORE_FOCAL_INLINE S lane(V v, int) { return v; }
  static DETCORE_FOCAL_INLINE V splat(S s) { return s; }
  typedef bool Mask;  // of targets that are not probabilities
  static DETCORE_FOCAL_INLINE Mask bad_targets(V t) { return !focal_target_ok(t); }
  static DETCORE_FOCAL_INLINE bool any(Mask m) { return m; }
};

template <typename L>
struct SimdLanes {
  typedef float Scalar;
  typedef typename L::V V;
  typedef VectorMath<L> Math;
  static constexpr int kLanes = L::kLanes;
  static DETCORE_FOCAL_INLINE V load(const float* p) {
    V v;
    std::memcpy(&v, p, sizeof(V));
    return v;
  }
  static DETCORE_FOCAL_INLINE void store(float* p, V v) { std::memcpy(p, &v, sizeof(V)); }
  static DETCORE_FOCAL_INLINE float lane(V v, int i) { return v[i]; }
  static DETCORE_FOCAL_INLINE V splat(float s) { return Math::splat(s); }
  typedef typename L::I Mask;  // -1 in the lanes of targets that are not probabilities
  static DETCORE_FOCAL_INLINE Mask bad_targets(V t) {
    return ~((t >= 0.0f) & (t <= 1.0f));  // NaN compares false
  }
  static DETCORE_FOCAL_INLINE bool any(Mask m) {
    for (int i = 0; i < kLanes; ++i) {
      if (m[i] != 0) return true;
    }
    return false;
  }
};

// What the loops read and write. grad is per element, or one value for all (a 'sum' or 'mean'
// reduction, or the expanded grad of loss.sum()). Null outputs are not computed.
template <typename S>
struct FocalJob {
  const S* inputs;
  const S* targets;
  int64_t numel;
  FocalParams<S> params;
  S* loss;             // forward, reduction 'none'
  const S* grad;       // backward: per element, or null (then grad_value)
  S grad_value;
  S* grad_inputs;      // backward
  S* grad_targets;     // backward, if the targets need a gradient
  double* block_sums;  // forward, 'sum' / 'mean': one per block
  int64_t* block_bad;  // the first bad target of each block, or -1
};

// Loads `lanes` values from p into a vector; a partial one (the last of a block) through a copy
// padded with `pad`.
template <typename Lanes>
DETCORE_FOCAL_INLINE typename Lanes::V load_lanes(
    const typename Lanes::Scalar* p, int lanes, typename Lanes::Scalar pad) {
  if (lanes == Lanes::kLanes) {
    return Lanes::load(p);
  }
  typename Lanes::Scalar buffer[Lanes::kLanes];
  for (int l = 0; l < Lanes::kLanes; ++l) buffer[l] = l < lanes ? p[l] : pad;
  return Lanes::load(buffer);
}

// Writes the first `lanes` values of v at p.
template <typename Lanes>
DETCORE_FOCAL_INLINE void store_lanes(typename Lanes::Scalar* p, int lanes, typename Lanes::V v) {
  if (lanes == Lanes::kLanes) {
    Lanes::store(p, v);
  } else {
    typename Lanes::Scalar buffer[Lanes::kLanes];
    Lanes::store(buffer, v);
    std::memcpy(p, buffer, lanes * sizeof(typename Lanes::Scalar));
  }
}

template <typename S>
int64_t first_bad_target(const S* t, int64_t start, int64_t end) {
  for (int64_t i = start; i < end; ++i) {
    if (!focal_target_ok(t[i])) return i;
  }
  return -1;
}

// The block loops. Everything they call is inlined, so that in an AVX2 or AVX-512 function
// every vector operation is compiled for that instruction set (no vectors cross a call).
template <typename Lanes>
DETCORE_FOCAL_INLINE void forward_blocks(
    const FocalJob<typename Lanes::Scalar>& job, int64_t lo, int64_t hi) {
  typedef typename Lanes::Scalar S;
  typedef typename Lanes::V V;
  constexpr int W = Lanes::kLanes;
  for (int64_t b = lo; b < hi; ++b) {
    const int64_t start = b * kBlock;
    const int64_t end = std::min(job.numel, start + kBlock);
    double sums[W] = {};
    typename Lanes::Mask bad{};
    for (int64_t i = start; i < end; i += W) {
      const int lanes = static_cast<int>(std::min<int64_t>(W, end - i));
      const V x = load_lanes<Lanes>(job.inputs + i, lanes, S(0));
      const V t = load_lanes<Lanes>(job.targets + i, lanes, S(0));  // padding: a valid target
      bad = bad | Lanes::bad_targets(t);
      const V loss = focal_terms<V, S, typename Lanes::Math>(x, t, job.params).loss;
      if (job.loss != nullptr) {
        store_lanes<Lanes>(job.loss + i, lanes, loss);
      } else if (lanes == W) {
        for (int l = 0; l < W; ++l) sums[l] += static_cast<double>(Lanes::lane(loss, l));
      } else {  // the padded lanes are not elements
        for (int l = 0; l < lanes; ++l) sums[l] += static_cast<double>(Lanes::lane(loss, l));
      }
    }
    if (job.block_sums != nullptr) {
      double sum = 0;
      for (int l = 0; l < W; ++l) sum += sums[l];
      job.block_sums[b] = sum;
    }
    job.block_bad[b] = Lanes::any(bad) ? first_bad_target(job.targets, start, end) : -1;
  }
}

template <typename Lanes>
DETCORE_FOCAL_INLINE void backward_blocks(
    const FocalJob<typename Lanes::Scalar>& job, int64_t lo, int64_t hi) {
  typedef typename Lanes::Scalar S;
  typedef typename Lanes::V V;
  constexpr int W = Lanes::kLanes;
  const V grad_value = Lanes::splat(job.grad_value);
  for (int64_t b = lo; b < hi; ++b) {
    const int64_t start = b * kBlock;
    const int64_t end = std::min(job.numel, start + kBlock);
    typename Lanes::Mask bad{};
    for (int64_t i = start; i < end; i += W) {
      const int lanes = static_cast<int>(std::min<int64_t>(W, end - i));
      const V x = load_lanes<Lanes>(job.inputs + i, lanes, S(0));
      const V t = load_lanes<Lanes>(job.targets + i, lanes, S(0));
      bad = bad | Lanes::bad_targets(t);
      const V g = job.grad != nullptr ? load_lanes<Lanes>(job.grad + i, lanes, S(0)) : grad_value;
      const FocalTerms<V> d = focal_terms<V, S, typename Lanes::Math>(x, t, job.params);
      store_lanes<Lanes>(job.grad_inputs + i, lanes, g * d.d_input);
      if (job.grad_targets != nullptr) {
        store_lanes<Lanes>(job.grad_targets + i, lanes, g * d.d_target);
      }
    }
    job.block_bad[b] = Lanes::any(bad) ? first_bad_target(job.targets, start, end) : -1;
  }
}

// The float32 loops, one copy per instruction set.
void forward_float_baseline(const FocalJob<float>& job, int64_t lo, int64_t hi) {
  forward_blocks<SimdLanes<Float4>>(job, lo, hi);
}
void backward_float_baseline(const FocalJob<float>& job, int64_t lo, int64_t hi) {
  backward_blocks<SimdLanes<Float4>>(job, lo, hi);
}
#if DETCORE_ISA_VARIANTS
DETCORE_TARGET_AVX2 void forward_float_avx2(const FocalJob<float>& job, int64_t lo, int64_t hi) {
  forward_blocks<SimdLanes<Float8>>(job, lo, hi);
}
DETCORE_TARGET_AVX2 void backward_float_avx2(const FocalJob<float>& job, int64_t lo, int64_t hi) {
  backward_blocks<SimdLanes<Float8>>(job, lo, hi);
}
DETCORE_TARGET_AVX512 void forward_float_avx512(const FocalJob<float>& job, int64_t lo, int64_t hi) {
  forward_blocks<SimdLanes<Float16>>(job, lo, hi);
}
DETCORE_TARGET_AVX512 void backward_float_avx512(const FocalJob<float>& job, int64_t lo, int64_t hi) {
  backward_blocks<SimdLanes<Float16>>(job, lo, hi);
}
#endif

typedef void (*FloatLoop)(const FocalJob<float>&, int64_t, int64_t);

FloatLoop float_loop(bool forward) {
#if DETCORE_ISA_VARIANTS
  switch (cpu_isa()) {
    case CpuIsa::kAvx512:
      return forward ? forward_float_avx512 : backward_float_avx512;
    case CpuIsa::kAvx2:
      return forward ? forward_float_avx2 : backward_float_avx2;
    default:
      break;
  }
#endif
  return forward ? forward_float_baseline : backward_float_baseline;
}

// Runs the job over all blocks, on the threads, and raises for a bad target.
template <typename S>
void run_blocks(
    const char* op, FocalJob<S>& job, bool forward, const at::Tensor& targets) {
  const int64_t blocks = (job.numel + kBlock - 1) / kBlock;
  std::vector<int64_t> bad(blocks, -1);
  job.block_bad = bad.data();
  Interrupt interrupt;  // asked between blocks (parallel_chunks)
  parallel_chunks(interrupt, blocks, 1, kBlock * kWorkPerElement, [&](int64_t lo, int64_t hi) {
    if constexpr (std::is_same_v<S, float>) {
      float_loop(forward)(job, lo, hi);
    } else if (forward) {
      forward_blocks<ScalarLanes<S>>(job, lo, hi);
    } else {
      backward_blocks<ScalarLanes<S>>(job, lo, hi);
    }
  });
  for (int64_t b = 0; b < blocks; ++b) {
    if (bad[b] >= 0) {
      throw_bad_focal_target(op, targets.sizes(), bad[b], static_cast<double>(job.targets[bad[b]]));
    }
  }
}

at::Tensor sigmoid_focal_loss_cpu(
    const at::Tensor& inputs, const at::Tensor& targets, double alpha, double gamma,
    c10::string_view reduction) {
  const char* op = "sigmoid_focal_loss";
  const FocalReduction r =
      check_sigmoid_focal_loss_inputs(op, inputs, targets, alpha, gamma, reduction);
  if (is_half_type(inputs)) {
    return sigmoid_focal_loss_cpu(
               in_compute_type(inputs), in_compute_type(targets), alpha, gamma, reduction)
        .to(inputs.scalar_type());
  }
  const at::Tensor x = inputs.contiguous();
  const at::Tensor t = targets.contiguous();
  const int64_t n = x.numel();
  at::Tensor loss;
  if (r == FocalReduction::kNone) {
    loss = at::empty(inputs.sizes(), inputs.options());
  }
  std::vector<double> block_sums((n + kBlock - 1) / kBlock, 0.0);
  AT_DISPATCH_FLOATING_TYPES(inputs.scalar_type(), "sigmoid_focal_loss_cpu", [&] {
    FocalJob<scalar_t> job{};
    job.inputs = x.data_ptr<scalar_t>();
    job.targets = t.data_ptr<scalar_t>();
    job.numel = n;
    job.params = focal_params<scalar_t>(alpha, gamma);
    job.loss = loss.defined() ? loss.data_ptr<scalar_t>() : nullptr;
    job.block_sums = loss.defined() ? nullptr : block_sums.data();
    run_blocks(op, job, /*forward=*/true, t);
  });
  if (r == FocalReduction::kNone) {
    return loss;
  }
  double total = 0;
  for (double s : block_sums) total += s;
  if (r == FocalReduction::kMean) {
    total = n > 0 ? total / static_cast<double>(n) : std::numeric_limits<double>::quiet_NaN();
  }
  return at::full({}, total, inputs.options());
}

// Whether every stride of t is 0: the expanded grad of loss.sum(), one value for all.
bool is_broadcast_scalar(const at::Tensor& t) {
  for (int64_t s : t.strides()) {
    if (s != 0) return false;
  }
  return t.numel() > 0;
}

std::tuple<at::Tensor, at::Tensor> sigmoid_focal_loss_backward_cpu(
    const at::Tensor& grad, const at::Tensor& inputs, const at::Tensor& targets, double alpha,
    double gamma, c10::string_view reduction, bool targets_grad) {
  const char* op = "sigmoid_focal_loss backward";
  const FocalReduction r =
      check_sigmoid_focal_loss_backward_inputs(grad, inputs, targets, alpha, gamma, reduction);
  if (is_half_type(inputs)) {
    auto [grad_inputs, grad_targets] = sigmoid_focal_loss_backward_cpu(
        in_compute_type(grad), in_compute_type(inputs), in_compute_type(targets), alpha, gamma,
        reduction, targets_grad);
    return {grad_inputs.to(inputs.scalar_type()), grad_targets.to(inputs.scalar_type())};
  }
  const at::Tensor x = inputs.contiguous();
  const at::Tensor t = targets.contiguous();
  const int64_t n = x.numel();
  at::Tensor grad_inputs = at::empty(inputs.sizes(), inputs.options());
  at::Tensor grad_targets =
      at::empty(targets_grad ? inputs.sizes() : at::IntArrayRef{0}, inputs.options());
  const bool one_value = r != FocalReduction::kNone || is_broadcast_scalar(grad);
  const at::Tensor g = one_value ? grad : grad.contiguous();
  AT_DISPATCH_FLOATING_TYPES(inputs.scalar_type(), "sigmoid_focal_loss_backward_cpu", [&] {
    FocalJob<scalar_t> job{};
    job.inputs = x.data_ptr<scalar_t>();
    job.targets = t.data_ptr<scalar_t>();
    job.numel = n;
    job.params = focal_params<scalar_t>(alpha, gamma);
    if (one_value) {
      double value = n > 0 ? static_cast<double>(*g.data_ptr<scalar_t>()) : 0.0;
      if (r == FocalReduction::kMean && n > 0) value /= static_cast<double>(n);
      job.grad_value = static_cast<scalar_t>(value);
    } else {
      job.grad = g.data_ptr<scalar_t>();
    }
    job.grad_inputs = grad_inputs.data_ptr<scalar_t>();
    job.grad_targets = targets_grad ? grad_targets.data_ptr<scalar_t>() : nullptr;
    run_blocks(op, job, /*forward=*/false, t);
  });
  return {grad_inputs, grad_targets};
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CPU, m) {
  m.impl("sigmoid_focal_loss", TORCH_FN(sigmoid_focal_loss_cpu));
  m.impl("_sigmoid_focal_loss_backward", TORCH_FN(sigmoid_focal_loss_backward_cpu));
}

}  // namespace detcore
