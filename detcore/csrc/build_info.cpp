#include "build_info.h"

namespace detcore {

#ifdef WITH_CUDA
// Defined in cuda/build_info.cu, where nvcc provides the facts.
int64_t cuda_runtime_version_compiled();
std::string cuda_arch_list_compiled();
int64_t cuda_ptx_arch_compiled();
#endif

int64_t cuda_version() {
#ifdef WITH_CUDA
  return cuda_runtime_version_compiled();
#else
  return 0;
#endif
}

std::string cuda_arch_list() {
#ifdef WITH_CUDA
  return cuda_arch_list_compiled();
#else
  return "";
#endif
}

int64_t cuda_ptx_arch() {
#ifdef WITH_CUDA
  return cuda_ptx_arch_compiled();
#else
  return 0;
#endif
}

}  // namespace detcore
