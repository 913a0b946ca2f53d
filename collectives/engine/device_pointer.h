/* Whether a pointer is CUDA device memory that the host cannot dereference.
 *
 * The engine asks it before any CUDA library is loaded: THC_Allreduce on a device buffer must either
 * stage through host memory or run the CUDA codec. This helper needs no CUDA headers and no
 * CUDA libraries at link time (it dlopens the driver), so it can be compiled into libthc itself.
 */
#ifndef THC_ENGINE_DEVICE_POINTER_H_
#define THC_ENGINE_DEVICE_POINTER_H_

#ifdef __cplusplus
extern "C" {
#endif

/* 1: device (or pool) memory, not host-accessible; 0: host memory (pageable, pinned, registered),
 * managed memory, an unknown pointer, NULL, or no CUDA driver. Thread-safe; never initialises
 * CUDA (a process that has not initialised the driver cannot own device pointers). */
int thc_cuda_is_device_pointer(const void* ptr);

#ifdef __cplusplus
}
#endif

#endif /* THC_ENGINE_DEVICE_POINTER_H_ */
