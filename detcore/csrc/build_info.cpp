#include "build_info.h"

#ifdef WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace detcore {

int64_t cuda_version() {
#ifdef WITH_CUDA
  return CUDART_VERSION;
#else
  return 0;
#endif
}

std::string cuda_arch_list() {
#ifdef DETCORE_CUDA_ARCH_LIST
  return DETCORE_CUDA_ARCH_LIST;
#else
  return "";
#endif
}

}  // namespace detcore
