// Build facts of detcore._C: whether CUDA kernels were compiled, and for which GPU archs.
#pragma once

#include <cstdint>
#include <string>

namespace detcore {

// CUDA runtime version this binary was compiled against (e.g. 13000), or 0 for a CPU-only build.
int64_t cuda_version();

// The archs the CUDA kernels were compiled for, as nvcc lists them, e.g. "800,900" ("" if none).
std::string cuda_arch_list();

// The newest arch whose PTX is embedded (e.g. 120), which the driver compiles for newer GPUs;
// 0 if none (the build runs only on its SASS archs), -1 if the build did not say.
int64_t cuda_ptx_arch();

}  // namespace detcore
