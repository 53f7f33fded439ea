// tests/unit/simt: the little of <cuda_runtime.h> the chunk kernels' headers name, for the CPU emulation.
#pragma once
#include "simt.hpp"
typedef int cudaError_t;
typedef void* cudaStream_t;
