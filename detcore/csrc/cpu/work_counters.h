// Counts of what the CPU kernels did, for tests that check an op's cost or behaviour by counting
// its work instead of timing it (detcore._C._nms_iou_count, detcore._C._interrupted_op_count).
// Process-wide totals that only grow; a test reads them before and after a call. Each is added to
// once per walk or per op, never per item, so counting costs nothing measurable.
#pragma once

#include <cstdint>

namespace detcore {

// IoUs computed by the CPU nms and batched_nms walks (nms_kernel.cpp, nms_grid.h).
int64_t nms_iou_count();

// CPU op calls that a SIGINT handler's exception ended from inside the op (interrupt.cpp): a
// KeyboardInterrupt that Python raised only after the op had returned is not counted.
int64_t interrupted_op_count();

}  // namespace detcore
