// Plain CUDA launchers over raw device pointers + a stream. No torch types, so the .cu files
// compile with nvcc alone; cuda_binding.cpp (built only on GPU machines) wraps them for torch.
#pragma once

#include <cstdint>
#include <cuda_runtime_api.h>

#include "hash_grid.h"
#include "marching.h"
#include "occupancy.h"
#include "splat.h"

namespace kn_cuda {

// dtype: 0 = float32, 1 = float64. grad_table must be zeroed by the caller.
cudaError_t hash_grid_forward(int dims, int features, int dtype, const void* x, const void* table,
                              const kn::HashGridMeta& meta, void* out, int64_t n, cudaStream_t stream);
cudaError_t hash_grid_backward(int dims, int features, int dtype, const void* x, const void* grad_out,
                               const kn::HashGridMeta& meta, void* grad_table, int64_t n, cudaStream_t stream);

cudaError_t sh_encode(int dtype, const void* dirs, int degree, void* out, int64_t n, cudaStream_t stream);

cudaError_t composite_forward(int dtype, const int64_t* offsets, int64_t n_rays, const void* sigma, const void* rgb,
                              const void* t0, const void* t1, double stop_T, void* out_rgb, void* out_depth,
                              void* out_opacity, cudaStream_t stream);
cudaError_t composite_backward(int dtype, const int64_t* offsets, int64_t n_rays, const void* sigma, const void* rgb,
                               const void* t0, const void* t1, double stop_T, const void* g_rgb, const void* g_depth,
                               const void* g_opacity, void* grad_sigma, void* grad_rgb, cudaStream_t stream);

// bits: (n_cascades, bytes_per_cascade) with mip byte offsets mip_offset[0..n_mips].
cudaError_t occ_bitfield(const float* density, float thresh, int n_cascades, uint32_t res, int n_mips,
                         const uint32_t* mip_offset, uint8_t* bits, cudaStream_t stream);
cudaError_t occ_query(const float* points, int64_t n, const kn::GridView& grid, bool* out, cudaStream_t stream);

// Two passes: counts per ray, then (after the caller's exclusive scan into offsets) the samples.
cudaError_t march_count(const float* o, const float* d, const float* near, const float* far, const float* jitter,
                        int64_t n, const kn::MarchParams& p, const kn::GridView& g, int64_t* counts,
                        cudaStream_t stream);
cudaError_t march_fill(const float* o, const float* d, const float* near, const float* far, const float* jitter,
                       int64_t n, const kn::MarchParams& p, const kn::GridView& g, const int64_t* offsets,
                       float* t0, float* t1, int64_t* ray_indices, cudaStream_t stream);

// Splat compositors (splat.cu); dtype 0 = float32, 1 = float64; n: the number of splats. grads (N, SPLAT_GRADS) must be
// zeroed by the caller. Tiled: tile_offsets (n_tiles + 1), tile_ids (per-tile splat indices, each
// tile's run in depth order).

cudaError_t splat_naive_forward(int dtype, int H, int W, int64_t n, const void* means, const void* conics,
                                const void* colors, const void* opac, double alpha_min, double alpha_max,
                                double stop_T, void* out_rgb, void* out_T, int32_t* out_n, cudaStream_t stream);
cudaError_t splat_naive_backward(int dtype, int H, int W, int64_t n, const void* means, const void* conics, const void* colors,
                                 const void* opac, double alpha_min, double alpha_max, double stop_T,
                                 const void* fin_T, const int32_t* fin_n, const void* g_rgb, const void* g_T,
                                 void* grads, cudaStream_t stream);
cudaError_t splat_tiled_forward(int dtype, int H, int W, int64_t n, const int64_t* tile_offsets, const int32_t* tile_ids,
                                const void* means, const void* conics, const void* colors, const void* opac,
                                double alpha_min, double alpha_max, double stop_T, void* out_rgb, void* out_T,
                                int32_t* out_n, cudaStream_t stream);
cudaError_t splat_tiled_backward(int dtype, int H, int W, int64_t n, const int64_t* tile_offsets, const int32_t* tile_ids,
                                 const void* means, const void* conics, const void* colors, const void* opac,
                                 double alpha_min, double alpha_max, double stop_T, const void* fin_T,
                                 const int32_t* fin_n, const void* g_rgb, const void* g_T, void* grads,
                                 cudaStream_t stream);

}  // namespace kn_cuda
