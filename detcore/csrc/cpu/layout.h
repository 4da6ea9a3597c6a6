// Memory-layout changes for the CPU kernels that read a feature map channels-last.
#pragma once

#include <algorithm>
#include <cstdint>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "parallel.h"

namespace detcore {

// out[n][j][i] = in[n][i][j] for `count` [rows, cols] matrices, on all threads, in square tiles
// small enough that a tile's source and destination lines stay in the L1 cache.
template <typename T>
void transpose_matrices(const T* in, T* out, int64_t count, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 32;
  const int64_t bands = (rows + kTile - 1) / kTile;  // tasks: one band of rows of one matrix
  at::parallel_for(0, count * bands, grain_for(kTile * cols), [&](int64_t lo, int64_t hi) {
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t n = task / bands;
      const int64_t row_lo = (task % bands) * kTile;
      const int64_t row_hi = std::min(rows, row_lo + kTile);
      const T* src = in + n * rows * cols;
      T* dst = out + n * rows * cols;
      for (int64_t col_lo = 0; col_lo < cols; col_lo += kTile) {
        const int64_t col_hi = std::min(cols, col_lo + kTile);
        for (int64_t i = row_lo; i < row_hi; ++i) {
          for (int64_t j = col_lo; j < col_hi; ++j) dst[j * rows + i] = src[i * cols + j];
        }
      }
    }
  });
}

// A [N, C, H, W] tensor's values in an [N, H, W, C] buffer: the tensor itself when it already is
// channels-last, else a transposed copy.
template <typename T>
at::Tensor nhwc_buffer(const at::Tensor& input) {
  if (input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return input;
  }
  const at::Tensor src = input.contiguous();
  at::Tensor dst =
      at::empty({input.size(0), input.size(2), input.size(3), input.size(1)}, input.options());
  transpose_matrices(
      src.data_ptr<T>(), dst.data_ptr<T>(), input.size(0), input.size(1),
      input.size(2) * input.size(3));
  return dst;
}

}  // namespace detcore
