// Device code of nms and batched_nms: no runtime, no streams, no ATen, so that the host compiler
// can build it too, under the CUDA emulation of the tests (tests/layers/cuda_emulation/).
//
// Boxes are sorted by decreasing score, then two kernels run:
//  1. the mask kernel: box i (a row) and a block of 64 boxes j > i (a column block) give one
//     64-bit word whose bit k says "box i suppresses box 64 * block + k";
//  2. the unwrap kernel: a single block walks the rows in score order, keeping the bitmap of
//     removed boxes, and writes a keep flag per sorted box.
// T is the boxes' type, A the type the IoU is computed in (float for half and bfloat16).
#pragma once

#include <cstdint>

#include "../rounded_ops.h"
#include "launch_config.h"
#include "shared_memory.h"

namespace detcore {
namespace {  // included by nms_kernel.cu alone (and by the emulation's own translation unit)

// std::max / std::min's exact definitions (they decide what a NaN coordinate gives).
template <typename A>
__device__ __forceinline__ A max_of(A a, A b) {
  return (a < b) ? b : a;
}
template <typename A>
__device__ __forceinline__ A min_of(A a, A b) {
  return (b < a) ? b : a;
}

// IoU of a = (x1, y1, x2, y2) with b, in the accumulation type A; no "+1" in widths.
// Explicitly rounded (rounded_ops.h): the IoU must be bit-identical to the CPU kernel's, since a
// last-bit difference can flip "IoU > threshold".
template <typename A>
__device__ __forceinline__ A box_iou(const A* a, const A* b) {
  const A w = max_of(A(0), sub_rn(min_of(a[2], b[2]), max_of(a[0], b[0])));
  const A h = max_of(A(0), sub_rn(min_of(a[3], b[3]), max_of(a[1], b[1])));
  const A inter = mul_rn(w, h);
  const A area_a = mul_rn(sub_rn(a[2], a[0]), sub_rn(a[3], a[1]));
  const A area_b = mul_rn(sub_rn(b[2], b[0]), sub_rn(b[3], b[1]));
  return inter / sub_rn(add_rn(area_a, area_b), inter);
}

// mask[i * col_blocks + cb], bit k: box i suppresses box cb * 64 + k (which ranks below i).
// Only words with cb >= i's row block are written; the unwrap kernel reads no others.
// categories (sorted like the boxes) may be null; when given, only equal categories suppress.
// iou_threshold is the threshold in A (nms_common.h's threshold_in): the comparison in A gives
// the answer of the comparison in double, without double arithmetic on the GPU.
template <typename T, typename A>
__global__ void nms_mask_kernel(
    int64_t n, int64_t col_blocks, const T* __restrict__ boxes,
    const int64_t* __restrict__ categories, A iou_threshold,
    unsigned long long* __restrict__ mask) {
  DETCORE_SHARED_ARRAY(A, col_boxes, kBlockBoxes * 4);
  DETCORE_SHARED_ARRAY(int64_t, col_categories, kBlockBoxes);
  const int t = threadIdx.x;

  for (int64_t rb = blockIdx.y; rb < col_blocks; rb += gridDim.y) {
    for (int64_t cb = blockIdx.x; cb < col_blocks; cb += gridDim.x) {
      if (cb < rb) {
        continue;  // the same for the whole block, so no thread skips a barrier alone
      }
      const int row_size = static_cast<int>(min(n - rb * kBlockBoxes, int64_t(kBlockBoxes)));
      const int col_size = static_cast<int>(min(n - cb * kBlockBoxes, int64_t(kBlockBoxes)));

      __syncthreads();  // the previous iteration is done reading the shared column block
      if (t < col_size) {
        const int64_t j = cb * kBlockBoxes + t;
        for (int d = 0; d < 4; ++d) {
          col_boxes[t * 4 + d] = static_cast<A>(boxes[j * 4 + d]);
        }
        if (categories != nullptr) {
          col_categories[t] = categories[j];
        }
      }
      __syncthreads();

      if (t < row_size) {
        const int64_t i = rb * kBlockBoxes + t;
        A row_box[4];
        for (int d = 0; d < 4; ++d) {
          row_box[d] = static_cast<A>(boxes[i * 4 + d]);
        }
        const int64_t row_category = categories != nullptr ? categories[i] : 0;
        // On the diagonal block, only boxes ranked below i (k > t) can be suppressed by i.
        const int start = (rb == cb) ? t + 1 : 0;
        unsigned long long bits = 0;
        for (int k = start; k < col_size; ++k) {
          if (categories != nullptr && col_categories[k] != row_category) {
            continue;
          }
          if (box_iou(row_box, col_boxes + k * 4) > iou_threshold) {
            bits |= 1ULL << k;
          }
        }
        mask[i * col_blocks + cb] = bits;
      }
    }
  }
}

// One block walks the row blocks in order. For row block rb:
//  - thread 0 settles its (up to) 64 boxes one by one, using the removed word of rb and the
//    diagonal mask words (box j suppresses later boxes of the same block);
//  - then every thread ORs the rows of the kept boxes into the removed words after rb, each
//    thread owning distinct words, so there are no races.
// The removed bitmap is the dynamic shared memory when use_shared (NmsLaunch::unwrap_in_shared),
// else removed_global (very large n).
__global__ void nms_unwrap_kernel(
    int64_t n, int64_t col_blocks, const unsigned long long* __restrict__ mask,
    bool use_shared, unsigned long long* __restrict__ removed_global, bool* __restrict__ keep) {
  DETCORE_DYNAMIC_SHARED(unsigned long long, removed_shared);
  DETCORE_SHARED_ARRAY(unsigned long long, diagonal, kBlockBoxes);
  DETCORE_SHARED_VAR(unsigned long long, kept_bits);
  unsigned long long* removed = use_shared ? removed_shared : removed_global;
  const int t = threadIdx.x;

  for (int64_t w = t; w < col_blocks; w += blockDim.x) {
    removed[w] = 0;
  }
  __syncthreads();

  for (int64_t rb = 0; rb < col_blocks; ++rb) {
    const int64_t first = rb * kBlockBoxes;
    const int row_size = static_cast<int>(min(n - first, int64_t(kBlockBoxes)));

    for (int j = t; j < row_size; j += blockDim.x) {
      diagonal[j] = mask[(first + j) * col_blocks + rb];
    }
    __syncthreads();

    if (t == 0) {
      unsigned long long removed_here = removed[rb];
      unsigned long long kept = 0;
      for (int j = 0; j < row_size; ++j) {
        if (!((removed_here >> j) & 1ULL)) {
          kept |= 1ULL << j;
          removed_here |= diagonal[j];
        }
      }
      removed[rb] = removed_here;
      kept_bits = kept;
    }
    __syncthreads();

    const unsigned long long kept = kept_bits;
    for (int j = t; j < row_size; j += blockDim.x) {
      keep[first + j] = (kept >> j) & 1ULL;
    }
    for (int64_t w = rb + 1 + t; w < col_blocks; w += blockDim.x) {
      unsigned long long acc = removed[w];
      unsigned long long rest = kept;
      while (rest != 0) {
        const int j = __ffsll(static_cast<long long>(rest)) - 1;
        rest &= rest - 1;
        acc |= mask[(first + j) * col_blocks + w];
      }
      removed[w] = acc;
    }
    __syncthreads();  // removed[rb + 1] and the shared words are final before the next block
  }
}

}  // namespace
}  // namespace detcore
