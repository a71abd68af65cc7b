// DIHAL_HOST_DEVICE marks small functions shared by the CPU kernels, the CUDA kernels and their
// host emulation: __host__ __device__ under nvcc, plain inline elsewhere.
#pragma once

#ifdef __CUDACC__
#define DIHAL_HOST_DEVICE __host__ __device__ inline
#else
#define DIHAL_HOST_DEVICE inline
#endif
