// cuda/device_codec.cu compiled by the host compiler for the CPU emulator (see cuda_emu.h).
#include "tests/cuda/emu/cuda_emu.h"
// The emulator header must come first.
#include "cuda/device_codec.cu"
