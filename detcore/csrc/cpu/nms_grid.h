// Greedy NMS with spatial culling, for the CPU kernels (nms_kernel.cpp). Plain C++, no ATen.
//
// The walk is torchvision's greedy NMS: boxes in decreasing score order; a box not yet suppressed
// is kept and suppresses every later box whose IoU with it exceeds the threshold. With a
// threshold >= 0, IoU > threshold needs a positive intersection, so a kept box need only look at
// the later boxes it overlaps. The boxes are filed in grids so that it finds them quickly:
//  - a level holds the boxes whose larger side is within a factor 4 of each other; each level is
//    a uniform grid, a box filed once, in the cell of its corner (x1, y1), cells in score order;
//  - a box overlapping box k has x1 in (x1_k - W, x2_k) and y1 in (y1_k - H, y2_k), W and H the
//    level's widest and tallest box: the kept box visits the cells of that range in each level,
//    and skips a cell whose boxes all end left of or above it;
//  - cells are half as wide as the level's widest box, and larger where boxes are sparse (at
//    least 16 boxes a cell on average): an empty cell costs more than testing a few boxes;
//  - in a cell, the boxes ranked above the current one are settled and skipped for good, and the
//    suppressed ones are removed, so each box is tested only while it is unsettled.
// Cells are skipped only when no box in them can overlap: the cell of a coordinate is a
// non-decreasing function of it, the ranges are rounded outwards, and the skip tests compare the
// boxes' own values. Every pair looked at gets the plain walk's IoU arithmetic, so the result is
// the plain walk's, bit for bit. Boxes that overlap nothing (x2 <= x1 or y2 <= y1) are kept and
// never filed. Boxes with a NaN or infinite coordinate, and every box when the threshold is
// negative (then even disjoint boxes suppress each other), sit in one list that every kept box
// scans; such a kept box scans everything.
//
// The cost is the sum over kept boxes of the unsettled boxes in the cells they visit: never
// above the plain walk's O(N * kept) by more than the cell visits, and close to the number of
// overlapping pairs when the boxes are spread thinly; memory is O(N). The walk is serial: on a
// busy machine a multi-threaded walk waits at every synchronization for its slowest thread.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace detcore {
namespace nms_grid {

// Measured on the benchmark's boxes and on boxes of sizes 8..1024 px (benchmarks/benchmark_ops.py).
constexpr int kMaxLevels = 8;            // boxes smaller than the largest by over 4^7 share a level
constexpr int kLevelScaleLog2 = 2;       // a level holds boxes within a factor 4 of each other
constexpr double kCellPerWidth = 0.5;    // cell side over the level's largest box side
constexpr double kCellsPerBox = 1.0 / 16; // at most one cell per 16 boxes of the level
constexpr int64_t kSampledQueries = 64;   // queries sampled to choose between the walks

// The IoU test of torchvision's CPU kernel, in T: kept box k against box j.
template <typename T>
inline bool iou_above(
    T kx1, T ky1, T kx2, T ky2, T karea, T x1, T y1, T x2, T y2, T area, T threshold) {
  const T w = std::max(T(0), std::min(kx2, x2) - std::max(kx1, x1));
  const T h = std::max(T(0), std::min(ky2, y2) - std::max(ky1, y1));
  const T inter = w * h;
  const T iou = inter / (karea + area - inter);
  return iou > threshold;
}

// Box k = (kx1, ky1, kx2, ky2), of area karea, against boxes [0, count) of the arrays:
// hit[j] = IoU > threshold; returns the number of hits. A function of its own, with restrict
// pointers, so that the compiler vectorizes it wherever it is inlined (inside a larger function
// it left some copies scalar under -std=c++20, far slower).
template <typename T>
int64_t iou_hits(
    T kx1, T ky1, T kx2, T ky2, T karea, const T* __restrict x1, const T* __restrict y1,
    const T* __restrict x2, const T* __restrict y2, const T* __restrict area, int64_t count,
    T threshold, int32_t* __restrict hit) {
  int32_t hits = 0;
  for (int64_t j = 0; j < count; ++j) {
    hit[j] = iou_above(kx1, ky1, kx2, ky2, karea, x1[j], y1[j], x2[j], y2[j], area[j], threshold);
    hits += hit[j];
  }
  return hits;
}

// One level: a uniform grid over the corners (x1, y1) of its boxes.
struct Level {
  int64_t gx = 1, gy = 1;        // cells per axis
  double ox = 0, oy = 0;         // corner of cell (0, 0)
  double inv_x = 0, inv_y = 0;   // cells per unit length
  double max_w = 0, max_h = 0;   // upper bounds of the widths and heights of its boxes
  int64_t first_cell = 0;        // its cells in Grid::begin / Grid::end
  int64_t live = 0;              // boxes not yet settled
  bool scan_all = false;         // the list of boxes that every kept box scans

  // Cell column of x: floor((x - ox) * inv_x), clamped. Non-decreasing in x.
  int64_t col(double x) const { return clamp_cell((x - ox) * inv_x, gx); }
  int64_t row(double y) const { return clamp_cell((y - oy) * inv_y, gy); }

  static int64_t clamp_cell(double t, int64_t cells) {
    if (!(t >= 0)) return 0;  // also NaN
    if (t >= static_cast<double>(cells - 1)) return cells - 1;
    return static_cast<int64_t>(t);
  }
};

// The walk over candidates 0..n-1 (in decreasing score order); candidate i is box
// boxes[4 * rank(i)], rank(i) = ranks ? ranks[i] : i, and keep[rank(i)] is set when it is kept.
template <typename T>
class GreedyGrid {
 public:
  // Files the boxes in cells (not yet copied: see fill()).
  GreedyGrid(const T* boxes, const int64_t* ranks, int64_t n, T threshold)
      : boxes_(boxes), ranks_(ranks), n_(n), threshold_(threshold) {
    index();
  }

  // Whether this walk is estimated to beat the plain one (every kept box against every later
  // box): a sample of queries says how many cells and boxes a query looks at; the costs per
  // kept box were fitted on 108 runs (9 box layouts, 256..8192 boxes; AMD EPYC): the grid
  // 6.7 ns per cell looked at and per cell visited + 0.19 ns per box in them + 63 ns, the plain
  // walk 0.154 ns per box + 25 ns (how well the choice does: docs/benchmarks.md, "Figures behind
  // code choices").
  bool beats_plain_walk() {
    double cells = 0, visits = 0, entries = 0;
    int64_t queries = 0;
    const int64_t step = std::max<int64_t>(1, n_ / kSampledQueries);
    for (int64_t i = 0; i < n_; i += step) {
      if (kind_[i] == kInert) continue;
      ++queries;
      for_each_cell_near(i, [&](Level&, int64_t cell) {
        cells += 1;
        visits += begin_[cell] < end_[cell];
        entries += static_cast<double>(end_[cell] - begin_[cell]);
      });
    }
    if (queries == 0) return true;
    return 6.7 * (cells + visits) / queries + 0.19 * entries / queries + 38 < 0.154 * n_;
  }

  void run(uint8_t* keep) {
    fill();
    std::vector<uint8_t> removed(n_, 0);
    for (int64_t i = 0; i < n_; ++i) {
      if (removed[i]) continue;
      keep[rank(i)] = 1;
      if (kind_[i] == kInert) continue;
      suppress_from(i, removed.data());
    }
  }

 private:
  enum Kind : uint8_t { kFiled, kInert, kScanAll };

  const T* box(int64_t i) const { return boxes_ + 4 * rank(i); }
  int64_t rank(int64_t i) const { return ranks_ ? ranks_[i] : i; }

  // A double above v (for the bounds of widths, once per level).
  static double up(double v) { return std::nextafter(v, std::numeric_limits<double>::infinity()); }
  // A double at or below the one before v, without a call (once per level and kept box): v - d
  // with d >= v's spacing rounds to at most that double; the smallest subnormal handles v = 0.
  // A rounded x - w is within half a spacing of the exact value, so down(x - w) <= x - w exactly.
  static double down(double v) {
    return v - (std::fabs(v) * 0x1p-51 + std::numeric_limits<double>::denorm_min());
  }

  void index() {
    // Sort the candidates into kinds and the filed ones into levels by their larger side.
    kind_.assign(n_, kFiled);
    std::vector<int8_t> level_of(n_, 0);
    const bool negative = !(threshold_ >= T(0));
    double top = 0;
    for (int64_t i = 0; i < n_; ++i) {
      const T* b = box(i);
      if (negative || !(std::isfinite(b[0]) && std::isfinite(b[1]) && std::isfinite(b[2]) &&
                        std::isfinite(b[3]))) {
        kind_[i] = kScanAll;
      } else if (!(b[2] > b[0]) || !(b[3] > b[1])) {
        kind_[i] = kInert;
      } else {
        top = std::max(top, std::max(double(b[2]) - double(b[0]), double(b[3]) - double(b[1])));
      }
    }
    levels_.assign(kMaxLevels + 1, Level());
    levels_[kMaxLevels].scan_all = true;
    std::vector<int64_t> count(kMaxLevels + 1, 0);
    for (int64_t i = 0; i < n_; ++i) {
      int level = kMaxLevels;
      if (kind_[i] == kInert) continue;
      if (kind_[i] == kFiled) {
        const T* b = box(i);
        const double reach = std::max(double(b[2]) - double(b[0]), double(b[3]) - double(b[1]));
        const int steps = std::ilogb(top / reach) / kLevelScaleLog2;  // 0: the largest boxes
        level = std::clamp(steps, 0, kMaxLevels - 1);
      }
      level_of[i] = static_cast<int8_t>(level);
      ++count[level];
    }
    // Each level's extent: its boxes' corners span [ox, max_x1] x [oy, max_y1].
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> max_x1(kMaxLevels + 1, -inf), max_y1(kMaxLevels + 1, -inf);
    for (Level& l : levels_) l.ox = l.oy = inf;
    for (int64_t i = 0; i < n_; ++i) {
      if (kind_[i] != kFiled) continue;
      const int level = level_of[i];
      Level& l = levels_[level];
      const T* b = box(i);
      l.ox = std::min(l.ox, double(b[0]));
      l.oy = std::min(l.oy, double(b[1]));
      max_x1[level] = std::max(max_x1[level], double(b[0]));
      max_y1[level] = std::max(max_y1[level], double(b[1]));
      l.max_w = std::max(l.max_w, double(b[2]) - double(b[0]));
      l.max_h = std::max(l.max_h, double(b[3]) - double(b[1]));
    }
    for (Level& l : levels_) l.max_w = up(l.max_w), l.max_h = up(l.max_h);  // rounded outwards
    int64_t cells = 0;
    for (int level = 0; level <= kMaxLevels; ++level) {
      Level& l = levels_[level];
      l.live = count[level];
      l.first_cell = cells;
      if (l.scan_all || l.live == 0) {
        l.ox = l.oy = 0;
      } else {
        grid(l, max_x1[level] - l.ox, max_y1[level] - l.oy);
      }
      cells += l.gx * l.gy;
    }
    // Each box's cell; the cells' ranges in the filed arrays (counting sort by cell), and the
    // largest x2 and y2 of each cell.
    cell_of_.assign(n_, -1);
    begin_.assign(cells + 1, 0);
    reach_x_.assign(cells, std::numeric_limits<T>::lowest());
    reach_y_.assign(cells, std::numeric_limits<T>::lowest());
    for (int64_t i = 0; i < n_; ++i) {
      if (kind_[i] == kInert) continue;
      const Level& l = levels_[level_of[i]];
      const T* b = box(i);
      int64_t c = l.first_cell;
      if (!l.scan_all) c += l.row(double(b[1])) * l.gx + l.col(double(b[0]));
      cell_of_[i] = c;
      ++begin_[c + 1];
      reach_x_[c] = std::max(reach_x_[c], b[2]);
      reach_y_[c] = std::max(reach_y_[c], b[3]);
    }
    for (int64_t c = 0; c < cells; ++c) begin_[c + 1] += begin_[c];
    end_.assign(begin_.begin() + 1, begin_.end());
    begin_.pop_back();
  }

  // Copies the boxes into their cells, each cell in score order.
  void fill() {
    const int64_t filed = end_.empty() ? 0 : end_.back();
    x1_.resize(filed), y1_.resize(filed), x2_.resize(filed), y2_.resize(filed);
    area_.resize(filed), index_.resize(filed);
    std::vector<int64_t> next(begin_);
    int64_t largest = 0;
    for (int64_t i = 0; i < n_; ++i) {
      const int64_t c = cell_of_[i];
      if (c < 0) continue;
      const int64_t e = next[c]++;
      const T* b = box(i);
      x1_[e] = b[0], y1_[e] = b[1], x2_[e] = b[2], y2_[e] = b[3];
      area_[e] = (b[2] - b[0]) * (b[3] - b[1]);
      index_[e] = i;
      largest = std::max(largest, end_[c] - begin_[c]);
    }
    hit_.resize(largest);
  }

  // Cells kCellPerWidth of the level's widest box wide (and of its tallest tall), at most
  // kCellsPerBox per box: for boxes spread thinly, larger cells.
  static void grid(Level& l, double extent_x, double extent_y) {
    double gx = std::floor(extent_x / (kCellPerWidth * l.max_w)) + 1;
    double gy = std::floor(extent_y / (kCellPerWidth * l.max_h)) + 1;
    const double budget = std::max(1.0, kCellsPerBox * static_cast<double>(l.live));
    gx = std::isfinite(gx) ? std::min(gx, budget) : 1;
    gy = std::isfinite(gy) ? std::min(gy, budget) : 1;
    if (gx * gy > budget) {
      const double shrink = std::sqrt(budget / (gx * gy));
      gx = std::max(1.0, std::floor(gx * shrink));
      gy = std::max(1.0, std::floor(gy * shrink));
    }
    l.gx = static_cast<int64_t>(gx);
    l.gy = static_cast<int64_t>(gy);
    l.inv_x = extent_x > 0 && std::isfinite(extent_x) ? gx / extent_x : 0;
    l.inv_y = extent_y > 0 && std::isfinite(extent_y) ? gy / extent_y : 0;
  }

  // Calls fn(level, cell) for every cell where box i may find a box it overlaps.
  template <typename Fn>
  void for_each_cell_near(int64_t i, Fn&& fn) {
    const T* b = box(i);
    const bool everywhere = kind_[i] == kScanAll;
    for (Level& l : levels_) {
      if (l.live == 0) continue;
      const bool cull = !everywhere && !l.scan_all;
      int64_t c0 = 0, c1 = l.gx - 1, r0 = 0, r1 = l.gy - 1;
      if (cull) {
        c0 = l.col(down(double(b[0]) - l.max_w));
        c1 = l.col(double(b[2]));
        r0 = l.row(down(double(b[1]) - l.max_h));
        r1 = l.row(double(b[3]));
      }
      for (int64_t r = r0; r <= r1; ++r) {
        for (int64_t c = c0; c <= c1; ++c) {
          const int64_t cell = l.first_cell + r * l.gx + c;
          // Every box of the cell ends left of b or above it (the cell range cannot tell: it
          // knows only the largest box of the level).
          if (cull && !(reach_x_[cell] > b[0] && reach_y_[cell] > b[1])) continue;
          fn(l, cell);
        }
      }
    }
  }

  void suppress_from(int64_t i, uint8_t* removed) {
    const T* b = box(i);
    for_each_cell_near(i, [&](Level& l, int64_t cell) { visit(l, cell, i, b, removed); });
  }

  // Candidate i (kept) against the unsettled boxes of one cell.
  void visit(Level& l, int64_t cell, int64_t i, const T* b, uint8_t* removed) {
    int64_t lo = begin_[cell];
    const int64_t hi = end_[cell];
    if (lo == hi) return;
    const int64_t* index = index_.data();
    const int64_t start = lo;
    while (lo < hi && index[lo] <= i) ++lo;  // settled: kept boxes scored above i, and i itself
    l.live -= lo - start;
    begin_[cell] = lo;
    if (lo == hi) return;
    const T kx1 = b[0], ky1 = b[1], kx2 = b[2], ky2 = b[3];
    const T karea = (kx2 - kx1) * (ky2 - ky1);
    const int64_t count = hi - lo;
    int32_t* hit = hit_.data();
    const int64_t hits = iou_hits(
        kx1, ky1, kx2, ky2, karea, x1_.data() + lo, y1_.data() + lo, x2_.data() + lo,
        y2_.data() + lo, area_.data() + lo, count, threshold_, hit);
    if (hits == 0) return;
    int64_t out = lo;
    for (int64_t j = 0; j < count; ++j) {  // drop the suppressed boxes, keep the order
      const int64_t e = lo + j;
      if (hit[j]) {
        removed[index[e]] = 1;
        continue;
      }
      x1_[out] = x1_[e], y1_[out] = y1_[e], x2_[out] = x2_[e], y2_[out] = y2_[e];
      area_[out] = area_[e], index_[out] = index_[e];
      ++out;
    }
    end_[cell] = out;
    l.live -= hits;
  }

  const T* boxes_;
  const int64_t* ranks_;
  int64_t n_;
  T threshold_;
  std::vector<Kind> kind_;
  std::vector<Level> levels_;
  std::vector<int64_t> cell_of_;      // cell of each candidate (-1: inert)
  std::vector<int64_t> begin_, end_;  // live boxes of cell c: [begin_[c], end_[c])
  std::vector<T> reach_x_, reach_y_;  // largest x2 and y2 of the boxes filed in cell c
  std::vector<T> x1_, y1_, x2_, y2_, area_;
  std::vector<int64_t> index_;        // candidate index of each filed box
  std::vector<int32_t> hit_;
};

}  // namespace nms_grid
}  // namespace detcore
