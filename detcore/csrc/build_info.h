// Build facts of detcore._C: whether CUDA kernels were compiled, and for which GPU archs.
#pragma once

#include <cstdint>
#include <string>

namespace detcore {

// CUDA runtime version this binary was compiled against (e.g. 13000), or 0 for a CPU-only build.
int64_t cuda_version();

// The archs the CUDA kernels were compiled for, as nvcc lists them, e.g. "800,900" ("" if none).
std::string cuda_arch_list();

}  // namespace detcore
