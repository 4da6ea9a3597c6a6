// NMS and batched (per-category) NMS on the CPU.
//
// Same answer as torchvision's greedy NMS (sort by score, stable; a kept box suppresses every
// later box with IoU > threshold), computed faster:
//  - boxes are copied into structure-of-arrays in score order, with precomputed areas, so the
//    IoU loop is branch-free and the compiler vectorizes it;
//  - the greedy walk goes in blocks: the boxes kept in a block suppress all later candidates in
//    one pass, split across threads, and the survivors are compacted so suppressed boxes are
//    never looked at again.
// batched_nms runs one class-masked pass for small inputs and independent per-class NMS in
// parallel for large ones; both are exact, so they give the same result.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "../checks.h"
#include "compute_type.h"
#include "parallel.h"

namespace detcore {
namespace {

constexpr int64_t kBlock = 256;             // boxes resolved sequentially before a parallel pass
constexpr int64_t kPerClassMinBoxes = 4096; // batched_nms switches to per-class NMS above this

// The largest T not above `threshold`: for any T value v, v > result <=> (double)v > threshold,
// so comparing in T gives torchvision's result, which compares in double.
template <typename T>
T threshold_in(double threshold) {
  T t = static_cast<T>(threshold);
  if (static_cast<double>(t) > threshold) {
    t = std::nextafter(t, -std::numeric_limits<T>::infinity());
  }
  return t;
}

// Candidates of one greedy NMS run, in decreasing score order, as structure-of-arrays.
template <typename T>
struct Candidates {
  std::vector<T> x1, y1, x2, y2, area;
  std::vector<int64_t> category;  // empty unless class-masked
  std::vector<int64_t> rank;      // position in the global score order
  std::vector<int32_t> suppressed;

  void resize(int64_t n, bool with_category) {
    x1.resize(n), y1.resize(n), x2.resize(n), y2.resize(n), area.resize(n);
    rank.resize(n);
    suppressed.assign(n, 0);
    if (with_category) category.resize(n);
  }

  void move(int64_t from, int64_t to) {
    x1[to] = x1[from], y1[to] = y1[from], x2[to] = x2[from], y2[to] = y2[from];
    area[to] = area[from];
    rank[to] = rank[from];
    if (!category.empty()) category[to] = category[from];
  }
};

// Marks candidates [lo, hi) that candidate k overlaps by more than the threshold.
// Written without branches so it vectorizes; the IoU arithmetic is torchvision's, in T.
template <typename T>
inline void suppress_by(Candidates<T>& c, int64_t k, int64_t lo, int64_t hi, T threshold) {
  const T kx1 = c.x1[k], ky1 = c.y1[k], kx2 = c.x2[k], ky2 = c.y2[k], karea = c.area[k];
  const T* x1 = c.x1.data();
  const T* y1 = c.y1.data();
  const T* x2 = c.x2.data();
  const T* y2 = c.y2.data();
  const T* area = c.area.data();
  int32_t* suppressed = c.suppressed.data();
  if (c.category.empty()) {
    for (int64_t j = lo; j < hi; ++j) {
      const T w = std::max(T(0), std::min(kx2, x2[j]) - std::max(kx1, x1[j]));
      const T h = std::max(T(0), std::min(ky2, y2[j]) - std::max(ky1, y1[j]));
      const T inter = w * h;
      const T iou = inter / (karea + area[j] - inter);
      suppressed[j] |= static_cast<int32_t>(iou > threshold);
    }
  } else {
    const int64_t kcat = c.category[k];
    const int64_t* category = c.category.data();
    for (int64_t j = lo; j < hi; ++j) {
      const T w = std::max(T(0), std::min(kx2, x2[j]) - std::max(kx1, x1[j]));
      const T h = std::max(T(0), std::min(ky2, y2[j]) - std::max(ky1, y1[j]));
      const T inter = w * h;
      const T iou = inter / (karea + area[j] - inter);
      suppressed[j] |= static_cast<int32_t>((iou > threshold) & (category[j] == kcat));
    }
  }
}

// Greedy NMS over `c` (already in decreasing score order); sets keep[rank] for kept boxes.
template <typename T>
void greedy_nms(Candidates<T>& c, T threshold, uint8_t* keep, bool parallel) {
  int64_t remaining = static_cast<int64_t>(c.rank.size());
  std::vector<int64_t> kept;
  kept.reserve(kBlock);
  while (remaining > 0) {
    const int64_t block = std::min(kBlock, remaining);
    kept.clear();
    for (int64_t i = 0; i < block; ++i) {
      if (c.suppressed[i]) continue;
      keep[c.rank[i]] = 1;
      kept.push_back(i);
      suppress_by(c, i, i + 1, block, threshold);
    }
    auto suppress_rest = [&](int64_t lo, int64_t hi) {
      for (int64_t k : kept) suppress_by(c, k, lo, hi, threshold);
    };
    // Each later candidate costs one IoU per box kept in this block.
    const int64_t grain = grain_for(static_cast<int64_t>(kept.size()));
    if (parallel) {
      at::parallel_for(block, remaining, grain, suppress_rest);
    } else if (block < remaining) {
      suppress_rest(block, remaining);
    }
    // Compact the survivors to the front: suppressed boxes are never visited again.
    int64_t alive = 0;
    for (int64_t j = block; j < remaining; ++j) {
      if (!c.suppressed[j]) c.move(j, alive++);
    }
    std::fill(c.suppressed.begin(), c.suppressed.begin() + alive, 0);
    remaining = alive;
  }
}

// Fills candidates from sorted boxes; `ranks` selects which ranks (all when null).
template <typename T>
void gather(
    Candidates<T>& c, const T* sorted_boxes, const int64_t* sorted_category,
    const int64_t* ranks, int64_t n) {
  c.resize(n, sorted_category != nullptr);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = ranks ? ranks[i] : i;
    const T* b = sorted_boxes + 4 * r;
    c.x1[i] = b[0], c.y1[i] = b[1], c.x2[i] = b[2], c.y2[i] = b[3];
    c.area[i] = (b[2] - b[0]) * (b[3] - b[1]);
    c.rank[i] = r;
    if (sorted_category) c.category[i] = sorted_category[r];
  }
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
at::Tensor nms_sorted(
    const at::Tensor& boxes, const at::Tensor& order, const at::Tensor& sorted_category,
    double iou_threshold, bool per_class) {
  const int64_t n = boxes.size(0);
  auto sorted_boxes = boxes.index_select(0, order).contiguous();
  const T* box_ptr = sorted_boxes.data_ptr<T>();
  const T threshold = threshold_in<T>(iou_threshold);
  std::vector<uint8_t> keep(n, 0);
  if (!per_class) {
    const int64_t* cat = sorted_category.defined() ? sorted_category.data_ptr<int64_t>() : nullptr;
    Candidates<T> c;
    gather(c, box_ptr, cat, nullptr, n);
    greedy_nms(c, threshold, keep.data(), /*parallel=*/true);
    return kept_indices(order, keep);
  }
  // Per-class: group ranks by category (a stable sort keeps score order inside each group),
  // then run the classes' NMS independently, in parallel.
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
  const int64_t per_group = n / groups;  // a class's greedy NMS costs about per_group^2 IoUs
  at::parallel_for(0, groups, grain_for(per_group * per_group), [&](int64_t lo, int64_t hi) {
    Candidates<T> c;
    for (int64_t g = lo; g < hi; ++g) {
      gather(c, box_ptr, nullptr, rank_ptr + starts[g], starts[g + 1] - starts[g]);
      greedy_nms(c, threshold, keep.data(), /*parallel=*/false);
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
  at::Tensor none;
  return AT_DISPATCH_FLOATING_TYPES(boxes_c.scalar_type(), "nms_cpu", [&] {
    return nms_sorted<scalar_t>(boxes_c, order, none, iou_threshold, /*per_class=*/false);
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
  const bool per_class = boxes.size(0) > kPerClassMinBoxes;
  const auto boxes_c = in_compute_type(boxes);
  return AT_DISPATCH_FLOATING_TYPES(boxes_c.scalar_type(), "batched_nms_cpu", [&] {
    return nms_sorted<scalar_t>(boxes_c, order, sorted_category, iou_threshold, per_class);
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(detcore, CPU, m) {
  m.impl("nms", TORCH_FN(nms_cpu));
  m.impl("batched_nms", TORCH_FN(batched_nms_cpu));
}

}  // namespace detcore
