// a + b, a - b and a * b, each rounded on its own, for arithmetic that must give the same bits on
// the CPU and the GPU. nvcc fuses a plain a * b + c into one FMA (-fmad=true, its default), which
// rounds once instead of twice: a last-bit difference that can flip a comparison (an IoU against
// its threshold) or a ceil (ROIAlign's adaptive sample count). The __f*_rn / __d*_rn intrinsics
// are never fused. On the host these are the plain operators: the CPU kernels' results stay as
// they were. The CUDA emulation in tests/ defines DETCORE_CUDA_EMULATION and the intrinsics, so
// it takes the device branch.
#pragma once

#if defined(__CUDACC__)
#define DETCORE_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DETCORE_HOST_DEVICE inline
#endif

#if defined(__CUDA_ARCH__) || defined(DETCORE_CUDA_EMULATION)
#define DETCORE_ROUNDED(intrinsic, op) return intrinsic(a, b)
#else
#define DETCORE_ROUNDED(intrinsic, op) return a op b
#endif

namespace detcore {

DETCORE_HOST_DEVICE float add_rn(float a, float b) { DETCORE_ROUNDED(__fadd_rn, +); }
DETCORE_HOST_DEVICE double add_rn(double a, double b) { DETCORE_ROUNDED(__dadd_rn, +); }
DETCORE_HOST_DEVICE float sub_rn(float a, float b) { DETCORE_ROUNDED(__fsub_rn, -); }
DETCORE_HOST_DEVICE double sub_rn(double a, double b) { DETCORE_ROUNDED(__dsub_rn, -); }
DETCORE_HOST_DEVICE float mul_rn(float a, float b) { DETCORE_ROUNDED(__fmul_rn, *); }
DETCORE_HOST_DEVICE double mul_rn(double a, double b) { DETCORE_ROUNDED(__dmul_rn, *); }

}  // namespace detcore

#undef DETCORE_ROUNDED
