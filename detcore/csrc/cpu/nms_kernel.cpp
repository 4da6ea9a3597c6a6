// NMS and batched (per-category) NMS on the CPU.
//
// Same answer as torchvision's greedy NMS (sort by score, stable; a kept box suppresses every
// later box with IoU > threshold, the IoU computed with torchvision's arithmetic), computed with
// far fewer IoUs, on one thread:
//  - the walk files the boxes in grids and a kept box tests only the boxes near it
//    (nms_grid.h): the cost follows the overlapping pairs, not N * kept;
//  - below kGridMinBoxes boxes filing costs more than it saves, and the plain walk runs: boxes
//    copied into structure-of-arrays in score order, a branch-free (vectorized) IoU loop, the
//    survivors compacted after each block of kBlock candidates.
// One call of nms runs on the calling thread: the walk is sequential, and on a busy machine a
// parallel region per step waited for its most delayed thread at every step. batched_nms groups
// the boxes by category and, when the total work is large, runs the groups' walks in one
// parallel region, threads taking groups as they come free.
#include <algorithm>
#include <atomic>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../checks.h"
#include "../nms_common.h"
#include "compute_type.h"
#include "nms_grid.h"
#include "parallel.h"

namespace detcore {
namespace {

constexpr int64_t kBlock = 256;         // plain walk: candidates settled before a compaction
constexpr int64_t kGridMinBoxes = 512;  // fewer boxes: the plain walk (the grid walk lost on
                                        // nearly every layout: docs/benchmarks.md)

// The plain walk's candidates, in decreasing score order, as structure-of-arrays.
template <typename T>
struct Candidates {
  std::vector<T> x1, y1, x2, y2, area;
  std::vector<int64_t> rank;  // position in the global score order
  std::vector<int32_t> suppressed;

  // Candidate i is the box sorted_boxes[4 * r], r = ranks ? ranks[i] : i.
  Candidates(const T* sorted_boxes, const int64_t* ranks, int64_t n)
      : x1(n), y1(n), x2(n), y2(n), area(n), rank(n), suppressed(n, 0) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = ranks ? ranks[i] : i;
      const T* b = sorted_boxes + 4 * r;
      x1[i] = b[0], y1[i] = b[1], x2[i] = b[2], y2[i] = b[3];
      area[i] = (b[2] - b[0]) * (b[3] - b[1]);
      rank[i] = r;
    }
  }

  void move(int64_t from, int64_t to) {
    x1[to] = x1[from], y1[to] = y1[from], x2[to] = x2[from], y2[to] = y2[from];
    area[to] = area[from];
    rank[to] = rank[from];
  }
};

// Marks boxes [0, count) of the arrays that box k overlaps by more than the threshold. A
// function of its own with restrict pointers, like nms_grid::iou_hits, so that it is vectorized.
template <typename T>
void mark_overlapped(
    T kx1, T ky1, T kx2, T ky2, T karea, const T* __restrict x1, const T* __restrict y1,
    const T* __restrict x2, const T* __restrict y2, const T* __restrict area, int64_t count,
    T threshold, int32_t* __restrict suppressed) {
  for (int64_t j = 0; j < count; ++j) {
    suppressed[j] |= static_cast<int32_t>(
        nms_grid::iou_above(kx1, ky1, kx2, ky2, karea, x1[j], y1[j], x2[j], y2[j], area[j], threshold));
  }
}

// Marks candidates [lo, hi) that candidate k overlaps by more than the threshold.
template <typename T>
void suppress_by(Candidates<T>& c, int64_t k, int64_t lo, int64_t hi, T threshold) {
  mark_overlapped(
      c.x1[k], c.y1[k], c.x2[k], c.y2[k], c.area[k], c.x1.data() + lo, c.y1.data() + lo,
      c.x2.data() + lo, c.y2.data() + lo, c.area.data() + lo, hi - lo, threshold,
      c.suppressed.data() + lo);
}

// The plain greedy walk: the kept boxes of each block of kBlock candidates suppress all later
// candidates, then the survivors are compacted to the front, never to be visited again.
template <typename T>
void plain_walk(const T* sorted_boxes, const int64_t* ranks, int64_t n, T threshold, uint8_t* keep) {
  Candidates<T> c(sorted_boxes, ranks, n);
  std::vector<int64_t> kept;
  kept.reserve(kBlock);
  int64_t remaining = n;
  while (remaining > 0) {
    const int64_t block = std::min(kBlock, remaining);
    kept.clear();
    for (int64_t i = 0; i < block; ++i) {
      if (c.suppressed[i]) continue;
      keep[c.rank[i]] = 1;
      kept.push_back(i);
      suppress_by(c, i, i + 1, block, threshold);
    }
    for (int64_t k : kept) suppress_by(c, k, block, remaining, threshold);
    int64_t alive = 0;
    for (int64_t j = block; j < remaining; ++j) {
      if (!c.suppressed[j]) c.move(j, alive++);
    }
    std::fill(c.suppressed.begin(), c.suppressed.begin() + alive, 0);
    remaining = alive;
  }
}

// Greedy NMS of candidates 0..n-1 (decreasing score; candidate i is the box
// sorted_boxes[4 * r], r = ranks ? ranks[i] : i); sets keep[r] for the kept ones.
template <typename T>
void greedy_walk(const T* sorted_boxes, const int64_t* ranks, int64_t n, T threshold, uint8_t* keep) {
  if (n >= kGridMinBoxes) {
    nms_grid::GreedyGrid<T> grid(sorted_boxes, ranks, n, threshold);
    if (grid.beats_plain_walk()) {
      grid.run(keep);
      return;
    }
  }
  plain_walk(sorted_boxes, ranks, n, threshold, keep);
}

// Kept indices in decreasing score order, from a keep flag per rank.
at::Tensor kept_indices(const at::Tensor& order, const std::vector<uint8_t>& keep) {
  const int64_t* order_ptr = order.data_ptr<int64_t>();
  std::vector<int64_t> result;
  for (size_t r = 0; r < keep.size(); ++r) {
    if (keep[r]) result.push_back(order_ptr[r]);
  }
  auto out = at::empty({static_cast<int64_t>(result.size())}, order.options());
  std::copy(result.begin(), result.end(), out.data_ptr<int64_t>());
  return out;
}

template <typename T>
at::Tensor nms_sorted(const at::Tensor& boxes, const at::Tensor& order, double iou_threshold) {
  auto sorted_boxes = boxes.index_select(0, order).contiguous();
  std::vector<uint8_t> keep(boxes.size(0), 0);
  greedy_walk(sorted_boxes.data_ptr<T>(), nullptr, boxes.size(0), threshold_in<T>(iou_threshold), keep.data());
  return kept_indices(order, keep);
}

// Per category: the ranks grouped by category (a stable sort keeps score order inside a group),
// each group's walk independent of the others.
template <typename T>
at::Tensor batched_nms_sorted(
    const at::Tensor& boxes, const at::Tensor& order, const at::Tensor& sorted_category,
    double iou_threshold) {
  const int64_t n = boxes.size(0);
  auto sorted_boxes = boxes.index_select(0, order).contiguous();
  auto by_category = std::get<1>(sorted_category.sort(/*stable=*/true, 0, /*descending=*/false));
  auto grouped = sorted_category.index_select(0, by_category);
  const int64_t* rank_ptr = by_category.data_ptr<int64_t>();
  const int64_t* cat_ptr = grouped.data_ptr<int64_t>();
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < n; ++i) {
    if (i == 0 || cat_ptr[i] != cat_ptr[i - 1]) starts.push_back(i);
  }
  starts.push_back(n);
  const int64_t groups = static_cast<int64_t>(starts.size()) - 1;
  const T* box_ptr = sorted_boxes.data_ptr<T>();
  const T threshold = threshold_in<T>(iou_threshold);
  std::vector<uint8_t> keep(n, 0);  // groups write disjoint ranks
  // A group of m boxes costs about m^2 / 2 IoUs in the plain walk, less in the grid walk: the
  // larger of the two is the work estimate for going parallel.
  int64_t work = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t m = starts[g + 1] - starts[g];
    work += m * std::min<int64_t>(m, kGridMinBoxes) / 2;
  }
  parallel_chunks(groups, 1, work / groups, [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g) {
      greedy_walk(box_ptr, rank_ptr + starts[g], starts[g + 1] - starts[g], threshold, keep.data());
    }
  });
  return kept_indices(order, keep);
}

at::Tensor sort_order(const at::Tensor& scores) {
  return std::get<1>(scores.sort(/*stable=*/true, /*dim=*/0, /*descending=*/true));
}

at::Tensor nms_cpu(const at::Tensor& boxes, const at::Tensor& scores, double iou_threshold) {
  check_nms_inputs("nms", boxes, scores, iou_threshold);
  if (boxes.size(0) == 0) {
    return at::empty({0}, boxes.options().dtype(at::kLong));
  }
  auto order = sort_order(scores);
  const auto boxes_c = in_compute_type(boxes);
  return AT_DISPATCH_FLOATING_TYPES(boxes_c.scalar_type(), "nms_cpu", [&] {
    return nms_sorted<scalar_t>(boxes_c, order, iou_threshold);
  });
}

at::Tensor batched_nms_cpu(
    const at::Tensor& boxes, const at::Tensor& scores, const at::Tensor& idxs,
    double iou_threshold) {
  check_batched_nms_inputs(boxes, scores, idxs, iou_threshold);
  if (boxes.size(0) == 0) {
    return at::empty({0}, boxes.options().dtype(at::kLong));
  }
  auto order = sort_order(scores);
  auto sorted_category = category_ids(idxs).index_select(0, order).contiguous();
  const auto boxes_c = in_compute_type(boxes);
  return AT_DISPATCH_FLOATING_TYPES(boxes_c.scalar_type(), "batched_nms_cpu", [&] {
    return batched_nms_sorted<scalar_t>(boxes_c, order, sorted_category, iou_threshold);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CPU, m) {
  m.impl("nms", TORCH_FN(nms_cpu));
  m.impl("batched_nms", TORCH_FN(batched_nms_cpu));
}

}  // namespace detcore
