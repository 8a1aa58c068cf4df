#include "cuda_common.cuh"
#include "launchers.h"

namespace kn_cuda {
namespace {

__global__ void level0_kernel(const float* __restrict__ density, float thresh, const uint8_t* finer, uint32_t res,
                              uint8_t* level0, int64_t n_bytes) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_bytes) return;
    uint8_t v = kn::threshold_byte(density, (uint32_t)j, thresh);
    if (finer) v |= kn::pooled_from_finer(finer, (uint32_t)j, res);
    level0[j] = v;
}

__global__ void mip_kernel(const uint8_t* __restrict__ src, uint32_t n_cells, uint8_t* dst, int64_t n_bytes) {
    const int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_bytes) return;
    dst[j] = kn::mip_byte(src, (uint32_t)j, n_cells);
}

__global__ void query_kernel(const float* __restrict__ p, int64_t n, kn::GridView g, bool* out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int c;
    uint32_t ijk[3];
    out[i] = kn::locate_cell(g, p + 3 * i, &c, ijk) && kn::occupied_at(g, c, 0, ijk);
}

}  // namespace

cudaError_t occ_bitfield(const float* density, float thresh, int n_cascades, uint32_t res, int n_mips,
                         const uint32_t* mip_offset, uint8_t* bits, cudaStream_t stream) {
    const int64_t cells = (int64_t)res * res * res;
    const uint32_t per = mip_offset[n_mips];
    // Launches on one stream run in order, so each cascade sees the finished finer one.
    for (int c = 0; c < n_cascades; ++c) {
        uint8_t* base = bits + (size_t)c * per;
        const uint8_t* finer = c > 0 ? bits + (size_t)(c - 1) * per : nullptr;
        level0_kernel<<<n_blocks(cells / 8), BLOCK, 0, stream>>>(density + c * cells, thresh, finer, res, base, cells / 8);
        for (int m = 1; m < n_mips; ++m) {
            const int64_t nb = mip_offset[m + 1] - mip_offset[m];
            mip_kernel<<<n_blocks(nb), BLOCK, 0, stream>>>(base + mip_offset[m - 1], kn::mip_cells(res, m),
                                                           base + mip_offset[m], nb);
        }
    }
    return cudaGetLastError();
}

cudaError_t occ_query(const float* points, int64_t n, const kn::GridView& grid, bool* out, cudaStream_t stream) {
    KN_LAUNCH(query_kernel, n, stream, points, n, grid, out);
}

}  // namespace kn_cuda
