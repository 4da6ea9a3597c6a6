// Device code of sigmoid_focal_loss and its backward: elementwise kernels in grid-stride loops
// over the flat, contiguous tensors, and a deterministic sum for the 'sum' / 'mean' reductions.
// No runtime, no ATen: the host compiler builds it too, under the CUDA emulation of the tests
// (tests/layers/cuda_emulation/).
//
// The formula is sigmoid_focal_loss_common.h's, shared with the CPU kernel. T is the tensors'
// type, A the type the loss is computed in (float for half / bfloat16).
//
// The sum takes no atomics (their order, and so the float result, would vary run to run): each
// thread adds its elements in double, in index order; each block adds its threads' sums by a
// fixed tree in shared memory; one more block adds the block sums the same way. The grid depends
// on the element count only (launch_config.h), so the same input gives the same bits every time.
//
// Each target is checked as it is read: the first one (lowest index) that is not a probability
// is left in *first_bad (atomicMin: the minimum does not depend on the order), for the launcher
// to report.
#pragma once

#include <cstdint>

#include "../sigmoid_focal_loss_common.h"
#include "launch_config.h"
#include "shared_memory.h"

namespace detcore {
namespace {  // included by sigmoid_focal_loss_kernel.cu alone (and the emulation's own unit)

// Adds `value` of every thread of the block; the result is valid in thread 0. `shared` holds
// kFocalLossThreads values.
__device__ __forceinline__ double block_sum(double value, double* shared) {
  const unsigned int tid = threadIdx.x;
  shared[tid] = value;
  __syncthreads();
  for (unsigned int half = kFocalLossThreads / 2; half > 0; half /= 2) {
    if (tid < half) {
      shared[tid] += shared[tid + half];
    }
    __syncthreads();
  }
  return shared[0];
}

__device__ __forceinline__ void note_bad_target(long long index, long long* first_bad) {
  atomicMin(first_bad, index);
}

// loss != nullptr (reduction 'none'): the loss of each element. Otherwise block_sums[blockIdx.x]
// gets the block's sum.
template <typename T, typename A>
__global__ void sigmoid_focal_loss_forward_kernel(
    int64_t n, const T* __restrict__ inputs, const T* __restrict__ targets,
    FocalParams<A> params, T* __restrict__ loss, double* __restrict__ block_sums,
    long long* __restrict__ first_bad) {
  DETCORE_SHARED_ARRAY(double, shared, kFocalLossThreads);
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  double sum = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const A t = static_cast<A>(targets[i]);
    if (!focal_target_ok(t)) {
      note_bad_target(i, first_bad);
    }
    const A value = focal_terms<A, A, ScalarMath>(static_cast<A>(inputs[i]), t, params).loss;
    if (loss != nullptr) {
      loss[i] = static_cast<T>(value);
    } else {
      sum += static_cast<double>(value);
    }
  }
  if (block_sums != nullptr) {  // the same for all threads of the launch: no divergent barrier
    const double total = block_sum(sum, shared);
    if (threadIdx.x == 0) {
      block_sums[blockIdx.x] = total;
    }
  }
}

// One block: out[0] = (sum of the `count` block sums) / divisor (1, or n for the mean).
template <typename T>
__global__ void sigmoid_focal_loss_sum_kernel(
    int64_t count, const double* __restrict__ block_sums, double divisor, T* __restrict__ out) {
  DETCORE_SHARED_ARRAY(double, shared, kFocalLossThreads);
  double sum = 0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) {
    sum += block_sums[i];
  }
  const double total = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    out[0] = static_cast<T>(total / divisor);
  }
}

// grad is per element, or (grad_per_element false) one value for all, grad[0] / grad_divisor
// (a 'sum' or 'mean' reduction: 1 or n). grad_targets may be null (not needed).
template <typename T, typename A>
__global__ void sigmoid_focal_loss_backward_kernel(
    int64_t n, const T* __restrict__ grad, bool grad_per_element, double grad_divisor,
    const T* __restrict__ inputs, const T* __restrict__ targets, FocalParams<A> params,
    T* __restrict__ grad_inputs, T* __restrict__ grad_targets, long long* __restrict__ first_bad) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const A one_value =
      grad_per_element ? A(0) : static_cast<A>(static_cast<double>(grad[0]) / grad_divisor);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const A t = static_cast<A>(targets[i]);
    if (!focal_target_ok(t)) {
      note_bad_target(i, first_bad);
    }
    const FocalTerms<A> d = focal_terms<A, A, ScalarMath>(static_cast<A>(inputs[i]), t, params);
    const A g = grad_per_element ? static_cast<A>(grad[i]) : one_value;
    grad_inputs[i] = static_cast<T>(g * d.d_input);
    if (grad_targets != nullptr) {
      grad_targets[i] = static_cast<T>(g * d.d_target);
    }
  }
}

}  // namespace
}  // namespace detcore
