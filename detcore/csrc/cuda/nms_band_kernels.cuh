// Device code of batched_nms over many boxes (nms_launch.h's banded path): the boxes grouped by
// category, highest score first inside a category, and each category a run of whole 64-box
// blocks, so that boxes are tested against their own category only and the mask holds only the
// words inside each run (a band along the diagonal). Same two steps as nms_kernels.cuh (whose
// IoU and bit conventions these kernels use): the mask kernel, then the unwrap, here one block
// per run. No runtime, no ATen: the host compiler builds it too, under the CUDA emulation of the
// tests.
#pragma once

#include <cstdint>

#include "launch_config.h"
#include "nms_kernels.cuh"
#include "shared_memory.h"

namespace detcore {
namespace {  // included by nms_kernel.cu alone (and by the emulation's own translation unit)

// The layout, per row block rb (a block of up to 64 boxes of one run; made by nms_launch.h):
// block_first_box[rb] is its first box in the grouped order, block_rows[rb] its box count,
// block_end[rb] one past the last block of its run, and block_words[rb] the mask word of its
// first row and first column block. Row r of block rb has a word for each column block cb in
// [rb, block_end[rb]): band_word(rb, r, cb).
struct NmsBand {
  const int64_t* block_first_box;
  const int64_t* block_rows;
  const int64_t* block_end;
  const int64_t* block_words;
};

__device__ __forceinline__ int64_t band_word(const NmsBand& band, int64_t rb, int64_t r, int64_t cb) {
  return band.block_words[rb] + r * (band.block_end[rb] - rb) + (cb - rb);
}

// Row block rb along y, column block rb + blockIdx.x along x (up to the end of rb's run), in
// grid-stride loops. Writes every word of the band. iou_threshold: as nms_mask_kernel's.
template <typename T, typename A>
__global__ void nms_band_mask_kernel(
    int64_t blocks, const T* __restrict__ boxes, NmsBand band, A iou_threshold,
    unsigned long long* __restrict__ mask) {
  DETCORE_SHARED_ARRAY(A, col_boxes, kBlockBoxes * 4);
  const int t = threadIdx.x;

  for (int64_t rb = blockIdx.y; rb < blocks; rb += gridDim.y) {
    const int64_t end = band.block_end[rb];
    const int row_size = static_cast<int>(band.block_rows[rb]);
    for (int64_t cb = rb + blockIdx.x; cb < end; cb += gridDim.x) {
      const int col_size = static_cast<int>(band.block_rows[cb]);
      __syncthreads();  // the previous iteration is done reading the shared column block
      if (t < col_size) {
        const int64_t j = band.block_first_box[cb] + t;
        for (int d = 0; d < 4; ++d) {
          col_boxes[t * 4 + d] = static_cast<A>(boxes[j * 4 + d]);
        }
      }
      __syncthreads();

      if (t < row_size) {
        const int64_t i = band.block_first_box[rb] + t;
        A row_box[4];
        for (int d = 0; d < 4; ++d) {
          row_box[d] = static_cast<A>(boxes[i * 4 + d]);
        }
        // On the diagonal block, only boxes ranked below i (k > t) can be suppressed by i.
        const int start = (rb == cb) ? t + 1 : 0;
        unsigned long long bits = 0;
        for (int k = start; k < col_size; ++k) {
          if (box_iou(row_box, col_boxes + k * 4) > iou_threshold) {
            bits |= 1ULL << k;
          }
        }
        mask[band_word(band, rb, t, cb)] = bits;
      }
    }
  }
}

// One block per run (grid-stride loop over the runs), each doing nms_unwrap_kernel's walk over
// its blocks [run_blocks[g], run_blocks[g + 1]). keep[rank[i]] is the flag of grouped box i
// (rank: its place in the score order). The removed bitmap of run g is the dynamic shared memory
// (a word per block of the widest run) when use_shared, else removed_global from g's first block.
__global__ void nms_band_unwrap_kernel(
    int64_t runs, const int64_t* __restrict__ run_blocks, NmsBand band,
    const unsigned long long* __restrict__ mask, bool use_shared,
    unsigned long long* __restrict__ removed_global, const int64_t* __restrict__ rank,
    bool* __restrict__ keep) {
  DETCORE_DYNAMIC_SHARED(unsigned long long, removed_shared);
  DETCORE_SHARED_ARRAY(unsigned long long, diagonal, kBlockBoxes);
  DETCORE_SHARED_VAR(unsigned long long, kept_bits);
  const int t = threadIdx.x;

  for (int64_t g = blockIdx.x; g < runs; g += gridDim.x) {
    const int64_t first_block = run_blocks[g];
    const int64_t end_block = run_blocks[g + 1];
    unsigned long long* removed = use_shared ? removed_shared : removed_global + first_block;
    for (int64_t w = t; w < end_block - first_block; w += blockDim.x) {
      removed[w] = 0;
    }
    __syncthreads();

    for (int64_t rb = first_block; rb < end_block; ++rb) {
      const int row_size = static_cast<int>(band.block_rows[rb]);
      for (int j = t; j < row_size; j += blockDim.x) {
        diagonal[j] = mask[band_word(band, rb, j, rb)];
      }
      __syncthreads();

      if (t == 0) {
        unsigned long long removed_here = removed[rb - first_block];
        unsigned long long kept = 0;
        for (int j = 0; j < row_size; ++j) {
          if (!((removed_here >> j) & 1ULL)) {
            kept |= 1ULL << j;
            removed_here |= diagonal[j];
          }
        }
        removed[rb - first_block] = removed_here;
        kept_bits = kept;
      }
      __syncthreads();

      const unsigned long long kept = kept_bits;
      const int64_t first_box = band.block_first_box[rb];
      for (int j = t; j < row_size; j += blockDim.x) {
        keep[rank[first_box + j]] = (kept >> j) & 1ULL;
      }
      for (int64_t cb = rb + 1 + t; cb < end_block; cb += blockDim.x) {
        unsigned long long acc = removed[cb - first_block];
        unsigned long long rest = kept;
        while (rest != 0) {
          const int j = __ffsll(static_cast<long long>(rest)) - 1;
          rest &= rest - 1;
          acc |= mask[band_word(band, rb, j, cb)];
        }
        removed[cb - first_block] = acc;
      }
      __syncthreads();  // removed[rb + 1] and the shared words are final before the next block
    }
  }
}

}  // namespace
}  // namespace detcore
