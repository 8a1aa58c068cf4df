#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kn_cuda {

constexpr int BLOCK = 256;

inline unsigned int n_blocks(int64_t n) { return (unsigned int)((n + BLOCK - 1) / BLOCK); }

// A launch with zero work is legal for callers but not for CUDA.
#define KN_LAUNCH(kernel, n, stream, ...)                                        \
    do {                                                                         \
        if ((n) > 0) kernel<<<n_blocks(n), BLOCK, 0, stream>>>(__VA_ARGS__);     \
        return cudaGetLastError();                                               \
    } while (0)

}  // namespace kn_cuda
