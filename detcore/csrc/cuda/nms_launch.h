// Host side of the CUDA nms and batched_nms: the score order, the mask and keep buffers, the
// dtype dispatch and the launches of nms_kernels.cuh's kernels, then the kept indices. Shared by
// the real launcher (nms_kernel.cu) and the CUDA emulation of the tests, which pass their launch
// policy (launch_config.h), so that both run exactly this sequence. The mask never leaves the
// device; the only host sync is masked_select's, for the result size, except on batched_nms's
// banded path (over launch.limits.nms_band_above boxes), which also waits for the categories'
// sizes (unique_consecutive, their copy to the host) and for the copy of its layout back.
#pragma once

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "../nms_common.h"
#include "launch_config.h"
#include "nms_band_kernels.cuh"
#include "nms_kernels.cuh"

namespace detcore {

inline unsigned long long* nms_words(const at::Tensor& words) {
  return reinterpret_cast<unsigned long long*>(words.data_ptr<int64_t>());
}

// The mask [n, ceil(n / 64)] (int64 words) of boxes sorted by decreasing score; categories
// (int64, sorted likewise) is undefined for plain nms. Only the words that the unwrap reads are
// written (nms_mask_kernel).
template <typename Launch>
at::Tensor nms_mask_launch(
    const at::Tensor& sorted_boxes, const at::Tensor& sorted_categories, double iou_threshold,
    const Launch& launch) {
  const int64_t n = sorted_boxes.size(0);
  const NmsLaunch l = nms_launch(n, launch.limits.max_grid_dim, launch.limits.max_shared_words);
  at::Tensor mask = launch.empty({n, l.col_blocks}, sorted_boxes.options().dtype(at::kLong));
  if (n == 0) {
    return mask;
  }
  const at::Tensor boxes = sorted_boxes.contiguous();
  const at::Tensor categories =
      sorted_categories.defined() ? sorted_categories.contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, boxes.scalar_type(), "detcore_nms_mask_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        launch(
            dim3(l.grid_x, l.grid_y), dim3(kBlockBoxes), 0, nms_mask_kernel<scalar_t, acc_t>, n,
            l.col_blocks, static_cast<const scalar_t*>(boxes.data_ptr<scalar_t>()),
            static_cast<const int64_t*>(
                categories.defined() ? categories.data_ptr<int64_t>() : nullptr),
            threshold_in<acc_t>(iou_threshold), nms_words(mask));
      });
  return mask;
}

// The keep flag of each sorted box, from a contiguous mask [n, ceil(n / 64)].
template <typename Launch>
at::Tensor nms_unwrap_launch(const at::Tensor& mask, const Launch& launch) {
  const int64_t n = mask.size(0);
  const NmsLaunch l = nms_launch(n, launch.limits.max_grid_dim, launch.limits.max_shared_words);
  at::Tensor keep = launch.empty({n}, mask.options().dtype(at::kBool));
  if (n == 0) {
    return keep;
  }
  at::Tensor removed_global;  // the kernel zeroes it
  if (!l.unwrap_in_shared) {
    removed_global = launch.empty({l.col_blocks}, mask.options());
  }
  launch(
      dim3(1), dim3(kUnwrapThreads), l.unwrap_shared_bytes, nms_unwrap_kernel, n, l.col_blocks,
      static_cast<const unsigned long long*>(nms_words(mask)), l.unwrap_in_shared,
      removed_global.defined() ? nms_words(removed_global) : nullptr, keep.data_ptr<bool>());
  return keep;
}

// --- batched_nms's banded path: the pairs inside each category only --------------------------

// Where each 64-box row block of the grouped boxes lies (NmsBand, nms_band_kernels.cuh), on the
// host: `table` holds block_first_box, block_rows, block_end and block_words (blocks values each),
// then run_blocks (runs + 1 values). A category of m boxes takes ceil(m / 64) blocks, and its
// row block k (of r rows) a word per row and column block k.. of the category: the mask holds
// the upper triangle of each category's own blocks.
struct NmsBandLayout {
  at::Tensor table;  // int64, on the CPU
  int64_t blocks = 0, runs = 0, widest_run = 0, words = 0;
};

inline NmsBandLayout nms_band_layout(const at::Tensor& run_lengths) {
  const at::Tensor lengths = run_lengths.to(at::kCPU, at::kLong).contiguous();
  const int64_t* length = lengths.data_ptr<int64_t>();
  NmsBandLayout layout;
  layout.runs = lengths.numel();
  std::vector<int64_t> first_box, rows, end, words, run_blocks{0};
  int64_t box = 0;
  for (int64_t g = 0; g < layout.runs; ++g) {
    const int64_t run = (length[g] + kBlockBoxes - 1) / kBlockBoxes;
    const int64_t run_end = run_blocks.back() + run;
    for (int64_t k = 0; k < run; ++k) {
      first_box.push_back(box + k * kBlockBoxes);
      rows.push_back(std::min<int64_t>(kBlockBoxes, length[g] - k * kBlockBoxes));
      end.push_back(run_end);
      words.push_back(layout.words);
      layout.words += rows.back() * (run - k);
    }
    run_blocks.push_back(run_end);
    layout.widest_run = std::max(layout.widest_run, run);
    box += length[g];
  }
  layout.blocks = run_blocks.back();
  layout.table = at::empty({4 * layout.blocks + layout.runs + 1}, at::kLong);
  int64_t* out = layout.table.data_ptr<int64_t>();
  for (const std::vector<int64_t>* part : {&first_box, &rows, &end, &words, &run_blocks}) {
    out = std::copy(part->begin(), part->end(), out);
  }
  return layout;
}

// The keep flag of each box sorted by score, as nms_unwrap_launch(nms_mask_launch(...)) gives for
// batched_nms, with a mask of sum over categories of m * ceil(m / 64) words at most (m: a
// category's boxes) rather than n * ceil(n / 64).
template <typename Launch>
at::Tensor nms_band_keep_launch(
    const at::Tensor& sorted_boxes, const at::Tensor& sorted_categories, double iou_threshold,
    const Launch& launch) {
  const int64_t n = sorted_boxes.size(0);
  // Grouped by category, by score inside one (stable): rank[i] is grouped box i's score rank.
  const auto [grouped_categories, rank] =
      sorted_categories.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor boxes = sorted_boxes.index_select(0, rank).contiguous();
  const at::Tensor run_lengths = std::get<2>(at::unique_consecutive(
      grouped_categories, /*return_inverse=*/false, /*return_counts=*/true));
  const NmsBandLayout layout = nms_band_layout(run_lengths);
  const at::Tensor table = layout.table.to(sorted_boxes.device());
  const int64_t* t = table.data_ptr<int64_t>();
  const int64_t b = layout.blocks;
  const NmsBand band{t, t + b, t + 2 * b, t + 3 * b};
  const NmsBandLaunch l = nms_band_launch(
      b, layout.runs, layout.widest_run, launch.limits.max_grid_dim,
      launch.limits.max_shared_words);

  at::Tensor mask = launch.empty({layout.words}, sorted_boxes.options().dtype(at::kLong));
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kHalf, at::kBFloat16, boxes.scalar_type(), "detcore_nms_band_mask_cuda", [&] {
        using acc_t = at::opmath_type<scalar_t>;
        launch(
            dim3(l.mask_grid_x, l.mask_grid_y), dim3(kBlockBoxes), 0,
            nms_band_mask_kernel<scalar_t, acc_t>, b,
            static_cast<const scalar_t*>(boxes.data_ptr<scalar_t>()), band,
            threshold_in<acc_t>(iou_threshold), nms_words(mask));
      });

  at::Tensor keep = launch.empty({n}, sorted_boxes.options().dtype(at::kBool));
  at::Tensor removed_global;  // the kernel zeroes it
  if (!l.unwrap_in_shared) {
    removed_global = launch.empty({b}, sorted_boxes.options().dtype(at::kLong));
  }
  const at::Tensor contiguous_rank = rank.contiguous();
  launch(
      dim3(l.unwrap_grid), dim3(kUnwrapThreads), l.unwrap_shared_bytes, nms_band_unwrap_kernel,
      layout.runs, static_cast<const int64_t*>(t + 4 * b), band,
      static_cast<const unsigned long long*>(nms_words(mask)), l.unwrap_in_shared,
      removed_global.defined() ? nms_words(removed_global) : nullptr,
      static_cast<const int64_t*>(contiguous_rank.data_ptr<int64_t>()), keep.data_ptr<bool>());
  return keep;
}

// The kept indices, by decreasing score (equal scores: lower index first, as the CPU kernel).
// categories: int64 ids for batched_nms, undefined for nms.
template <typename Launch>
at::Tensor nms_kept_launch(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& categories,
    double iou_threshold, const Launch& launch) {
  if (boxes.size(0) == 0) {
    return at::empty({0}, boxes.options().dtype(at::kLong));
  }
  const at::Tensor order = std::get<1>(scores.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
  const at::Tensor sorted_boxes = boxes.index_select(0, order);
  if (categories.defined() && boxes.size(0) > launch.limits.nms_band_above) {
    const at::Tensor keep = nms_band_keep_launch(
        sorted_boxes, categories.index_select(0, order), iou_threshold, launch);
    return order.masked_select(keep);
  }
  const at::Tensor sorted_categories =
      categories.defined() ? categories.index_select(0, order) : at::Tensor();
  const at::Tensor mask = nms_mask_launch(sorted_boxes, sorted_categories, iou_threshold, launch);
  return order.masked_select(nms_unwrap_launch(mask, launch));
}

}  // namespace detcore
