// How the kernels declare shared memory: through these macros, never `__shared__` itself, so that
// the CUDA emulation of the tests (tests/layers/cuda_emulation/cuda_emulation.h) can give every
// block it runs at once its own copy, filled with garbage when the block starts. Under nvcc they
// are the plain declarations:
//   DETCORE_SHARED_ARRAY(type, name, count)  __shared__ type name[count]
//   DETCORE_SHARED_VAR(type, name)           __shared__ type name
//   DETCORE_DYNAMIC_SHARED(type, name)       extern __shared__ type name[]   (the launch's bytes)
#pragma once

#ifndef DETCORE_CUDA_EMULATION
#define DETCORE_SHARED_ARRAY(type, name, count) __shared__ type name[count]
#define DETCORE_SHARED_VAR(type, name) __shared__ type name
#define DETCORE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif
