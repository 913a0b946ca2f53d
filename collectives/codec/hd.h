// Host/device portability for the element math shared by the host codec and the CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define THC_HD __host__ __device__ __forceinline__
#else
#define THC_HD inline
#endif
