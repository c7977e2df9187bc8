// KVRT_HD marks a function both compilers build: __host__ __device__ under nvcc, plain inline
// under g++ / clang. The arithmetic the CPU and CUDA paths share lives in kernels/shared/ in
// such functions, so the CPU tests exercise the very code the CUDA kernels run.
#pragma once

#if defined(__CUDACC__)
#define KVRT_HD __host__ __device__ inline
#else
#define KVRT_HD inline
#endif
