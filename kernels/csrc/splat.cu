// CUDA launchers for the splat compositors over the bodies in splat.h. Raw pointers + stream, no
// torch headers: `nvcc -c -arch=sm_80 splat.cu` must compile on a machine without torch CUDA.
#include <cuda_runtime.h>

#include "launchers.h"

namespace kn_cuda {
namespace {

constexpr int NAIVE_BLOCK = 256;  // whole warps: the backward's reductions use every lane

template <typename T>
__device__ __forceinline__ void atomic_add(T* p, T v) {
    atomicAdd(p, v);
}

// Sum of v over the 32 lanes of a warp, complete in lane 0.
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    return v;
}

// Seed 002's kernel: one thread per pixel, every thread reads every splat from global memory.
template <typename T>
__global__ void naive_fwd_kernel(int H, int W, int64_t n, const T* __restrict__ means, const T* __restrict__ conics,
                                 const T* __restrict__ colors, const T* __restrict__ opac, kn::SplatParams<T> prm,
                                 T* out_rgb, T* out_T, int32_t* out_n) {
    const int64_t pix = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (pix >= (int64_t)H * W) return;
    kn::naive_forward_pixel<T>(pix, W, n, means, conics, colors, opac, prm, out_rgb, out_T, out_n);
}

// One thread per pixel as well, but the lanes of a warp walk the splats in lockstep (from the
// warp's deepest stop down), so each warp sums its pixels' gradients for a splat before one lane
// adds them. Threads past the image stay to the end: the shuffles need every lane.
template <typename T>
__global__ void naive_bwd_kernel(int H, int W, const T* __restrict__ means, const T* __restrict__ conics,
                                 const T* __restrict__ colors, const T* __restrict__ opac, kn::SplatParams<T> prm,
                                 const T* __restrict__ fin_T, const int32_t* __restrict__ fin_n,
                                 const T* __restrict__ g_rgb, const T* __restrict__ g_T, T* grads) {
    const int64_t pix = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool inside = pix < (int64_t)H * W;
    const T zero3[3] = {T(0), T(0), T(0)};
    kn::PixelBwd<T> p = inside ? kn::pixel_bwd_init<T>(fin_T[pix], g_rgb + 3 * pix, g_T[pix])
                               : kn::pixel_bwd_init<T>(T(1), zero3, T(0));
    const int32_t my_n = inside ? fin_n[pix] : 0;
    const T px = T(pix % W) + T(0.5), py = T(pix / W) + T(0.5);
    int32_t warp_n = my_n;
    for (int off = 16; off > 0; off >>= 1) warp_n = max(warp_n, __shfl_xor_sync(0xffffffffu, warp_n, off));
    T out[kn::SPLAT_GRADS];
    for (int32_t i = warp_n - 1; i >= 0; --i) {
        const bool mine =
            i < my_n && kn::pixel_bwd_step(p, kn::load_splat<T>(i, means, conics, colors, opac), px, py, prm, out);
        if (!__any_sync(0xffffffffu, mine)) continue;
        T* g = grads + (int64_t)kn::SPLAT_GRADS * i;
        for (int q = 0; q < kn::SPLAT_GRADS; ++q) {
            const T sum = warp_sum(mine ? out[q] : T(0));
            if ((threadIdx.x & 31) == 0) atomic_add(g + q, sum);
        }
    }
}

// Tiled: one block of SPLAT_TILE^2 threads per tile; each batch of the tile's depth-sorted list
// is staged in shared memory once (one splat per thread) and then read by every pixel of the tile.
// The block leaves as soon as every pixel has stopped.
template <typename T>
__global__ void tiled_fwd_kernel(int H, int W, const int64_t* __restrict__ tile_offsets,
                                 const int32_t* __restrict__ tile_ids, const T* __restrict__ means,
                                 const T* __restrict__ conics, const T* __restrict__ colors,
                                 const T* __restrict__ opac, kn::SplatParams<T> prm, T* out_rgb, T* out_T,
                                 int32_t* out_n) {
    __shared__ kn::SplatRec<T> batch[kn::SPLAT_BATCH];
    const int tile = blockIdx.x;
    const int tx = kn::splat_tiles_x(W);
    const int x = (tile % tx) * kn::SPLAT_TILE + threadIdx.x % kn::SPLAT_TILE;
    const int y = (tile / tx) * kn::SPLAT_TILE + threadIdx.x / kn::SPLAT_TILE;
    const bool inside = x < W && y < H;
    const T px = T(x) + T(0.5), py = T(y) + T(0.5);
    const int64_t start = tile_offsets[tile], end = tile_offsets[tile + 1];
    kn::PixelFwd<T> p = kn::pixel_fwd_init<T>();
    p.done = !inside;
    for (int64_t b = start; b < end; b += kn::SPLAT_BATCH) {
        if (__syncthreads_count(!p.done) == 0) break;
        const int64_t j = b + threadIdx.x;
        if (j < end) batch[threadIdx.x] = kn::load_splat<T>(tile_ids[j], means, conics, colors, opac);
        __syncthreads();
        const int nb = (int)min((int64_t)kn::SPLAT_BATCH, end - b);
        for (int k = 0; k < nb && !p.done; ++k) kn::pixel_fwd_step(p, batch[k], px, py, prm, (int32_t)(b - start + k));
    }
    if (!inside) return;
    const int64_t pix = (int64_t)y * W + x;
    out_rgb[3 * pix] = p.r;
    out_rgb[3 * pix + 1] = p.g;
    out_rgb[3 * pix + 2] = p.b;
    out_T[pix] = p.trans;
    out_n[pix] = p.n;
}

template <typename T>
__global__ void tiled_bwd_kernel(int H, int W, const int64_t* __restrict__ tile_offsets,
                                 const int32_t* __restrict__ tile_ids, const T* __restrict__ means,
                                 const T* __restrict__ conics, const T* __restrict__ colors,
                                 const T* __restrict__ opac, kn::SplatParams<T> prm, const T* __restrict__ fin_T,
                                 const int32_t* __restrict__ fin_n, const T* __restrict__ g_rgb,
                                 const T* __restrict__ g_T, T* grads) {
    static_assert(kn::SPLAT_BATCH % 32 == 0, "whole warps: the gradient reduction uses every lane");
    __shared__ kn::SplatRec<T> batch[kn::SPLAT_BATCH];
    __shared__ int32_t batch_id[kn::SPLAT_BATCH];
    const int tile = blockIdx.x;
    const int tx = kn::splat_tiles_x(W);
    const int x = (tile % tx) * kn::SPLAT_TILE + threadIdx.x % kn::SPLAT_TILE;
    const int y = (tile / tx) * kn::SPLAT_TILE + threadIdx.x / kn::SPLAT_TILE;
    const bool inside = x < W && y < H;
    const T px = T(x) + T(0.5), py = T(y) + T(0.5);
    const int64_t start = tile_offsets[tile], end = tile_offsets[tile + 1];
    const int64_t pix = (int64_t)y * W + x;
    const T zero3[3] = {T(0), T(0), T(0)};
    kn::PixelBwd<T> p = inside ? kn::pixel_bwd_init<T>(fin_T[pix], g_rgb + 3 * pix, g_T[pix])
                               : kn::pixel_bwd_init<T>(T(1), zero3, T(0));
    const int32_t my_n = inside ? fin_n[pix] : 0;
    // Only the batches up to the deepest pixel's stop matter.
    int32_t deepest = my_n;
    __shared__ int32_t block_max;
    if (threadIdx.x == 0) block_max = 0;
    __syncthreads();
    atomicMax(&block_max, deepest);
    __syncthreads();
    deepest = block_max;
    T out[kn::SPLAT_GRADS];
    const int64_t n_batches = (deepest + kn::SPLAT_BATCH - 1) / kn::SPLAT_BATCH;
    for (int64_t bi = n_batches - 1; bi >= 0; --bi) {
        const int64_t b = start + bi * kn::SPLAT_BATCH;
        __syncthreads();  // the previous batch is no longer read
        const int64_t j = b + threadIdx.x;
        if (j < end) {
            const int32_t id = tile_ids[j];
            batch_id[threadIdx.x] = id;
            batch[threadIdx.x] = kn::load_splat<T>(id, means, conics, colors, opac);
        }
        __syncthreads();
        const int nb = (int)min((int64_t)kn::SPLAT_BATCH, end - b);
        for (int k = nb - 1; k >= 0; --k) {
            // Every thread of the block walks the same k, so each warp sums its pixels' gradients
            // for splat k and one lane adds them: SPLAT_GRADS atomics per warp instead of per
            // pixel, as gsplat reduces before its atomics.
            const bool mine =
                bi * kn::SPLAT_BATCH + k < my_n && kn::pixel_bwd_step(p, batch[k], px, py, prm, out);
            if (!__any_sync(0xffffffffu, mine)) continue;
            T* g = grads + (int64_t)kn::SPLAT_GRADS * batch_id[k];
            for (int q = 0; q < kn::SPLAT_GRADS; ++q) {
                const T sum = warp_sum(mine ? out[q] : T(0));
                if ((threadIdx.x & 31) == 0) atomic_add(g + q, sum);
            }
        }
    }
}

template <typename T>
kn::SplatParams<T> params(double a0, double a1, double st) {
    return kn::SplatParams<T>{(T)a0, (T)a1, (T)st};
}

unsigned int blocks_for(int64_t n) { return (unsigned int)((n + NAIVE_BLOCK - 1) / NAIVE_BLOCK); }

template <typename T>
cudaError_t naive_fwd(int H, int W, int64_t n, const void* m, const void* c, const void* col, const void* o,
                      double a0, double a1, double st, void* rgb, void* tr, int32_t* cnt, cudaStream_t s) {
    const int64_t P = (int64_t)H * W;
    if (P > 0)
        naive_fwd_kernel<T><<<blocks_for(P), NAIVE_BLOCK, 0, s>>>(H, W, n, (const T*)m, (const T*)c, (const T*)col,
                                                                 (const T*)o, params<T>(a0, a1, st), (T*)rgb, (T*)tr,
                                                                 cnt);
    return cudaGetLastError();
}

template <typename T>
cudaError_t naive_bwd(int H, int W, const void* m, const void* c, const void* col, const void* o, double a0,
                      double a1, double st, const void* fT, const int32_t* fn, const void* gr, const void* gT,
                      void* grads, cudaStream_t s) {
    const int64_t P = (int64_t)H * W;
    if (P > 0)
        naive_bwd_kernel<T><<<blocks_for(P), NAIVE_BLOCK, 0, s>>>(H, W, (const T*)m, (const T*)c, (const T*)col,
                                                                 (const T*)o, params<T>(a0, a1, st), (const T*)fT, fn,
                                                                 (const T*)gr, (const T*)gT, (T*)grads);
    return cudaGetLastError();
}

template <typename T>
cudaError_t tiled_fwd(int H, int W, const int64_t* off, const int32_t* ids, const void* m, const void* c,
                      const void* col, const void* o, double a0, double a1, double st, void* rgb, void* tr,
                      int32_t* cnt, cudaStream_t s) {
    const int n_tiles = kn::splat_tiles_x(W) * kn::splat_tiles_y(H);
    if (n_tiles > 0)
        tiled_fwd_kernel<T><<<n_tiles, kn::SPLAT_BATCH, 0, s>>>(H, W, off, ids, (const T*)m, (const T*)c,
                                                               (const T*)col, (const T*)o, params<T>(a0, a1, st),
                                                               (T*)rgb, (T*)tr, cnt);
    return cudaGetLastError();
}

template <typename T>
cudaError_t tiled_bwd(int H, int W, const int64_t* off, const int32_t* ids, const void* m, const void* c,
                      const void* col, const void* o, double a0, double a1, double st, const void* fT,
                      const int32_t* fn, const void* gr, const void* gT, void* grads, cudaStream_t s) {
    const int n_tiles = kn::splat_tiles_x(W) * kn::splat_tiles_y(H);
    if (n_tiles > 0)
        tiled_bwd_kernel<T><<<n_tiles, kn::SPLAT_BATCH, 0, s>>>(H, W, off, ids, (const T*)m, (const T*)c,
                                                               (const T*)col, (const T*)o, params<T>(a0, a1, st),
                                                               (const T*)fT, fn, (const T*)gr, (const T*)gT,
                                                               (T*)grads);
    return cudaGetLastError();
}

}  // namespace

cudaError_t splat_naive_forward(int dtype, int H, int W, int64_t n, const void* means, const void* conics,
                                const void* colors, const void* opac, double alpha_min, double alpha_max,
                                double stop_T, void* out_rgb, void* out_T, int32_t* out_n, cudaStream_t stream) {
    if (dtype == 1)
        return naive_fwd<double>(H, W, n, means, conics, colors, opac, alpha_min, alpha_max, stop_T, out_rgb, out_T,
                                 out_n, stream);
    return naive_fwd<float>(H, W, n, means, conics, colors, opac, alpha_min, alpha_max, stop_T, out_rgb, out_T, out_n,
                            stream);
}

cudaError_t splat_naive_backward(int dtype, int H, int W, int64_t n, const void* means, const void* conics, const void* colors,
                                 const void* opac, double alpha_min, double alpha_max, double stop_T,
                                 const void* fin_T, const int32_t* fin_n, const void* g_rgb, const void* g_T,
                                 void* grads, cudaStream_t stream) {
    if (dtype == 1)
        return naive_bwd<double>(H, W, means, conics, colors, opac, alpha_min, alpha_max, stop_T, fin_T, fin_n, g_rgb,
                                 g_T, grads, stream);
    return naive_bwd<float>(H, W, means, conics, colors, opac, alpha_min, alpha_max, stop_T, fin_T, fin_n, g_rgb, g_T,
                            grads, stream);
}

cudaError_t splat_tiled_forward(int dtype, int H, int W, int64_t n, const int64_t* tile_offsets, const int32_t* tile_ids,
                                const void* means, const void* conics, const void* colors, const void* opac,
                                double alpha_min, double alpha_max, double stop_T, void* out_rgb, void* out_T,
                                int32_t* out_n, cudaStream_t stream) {
    if (dtype == 1)
        return tiled_fwd<double>(H, W, tile_offsets, tile_ids, means, conics, colors, opac, alpha_min, alpha_max,
                                 stop_T, out_rgb, out_T, out_n, stream);
    return tiled_fwd<float>(H, W, tile_offsets, tile_ids, means, conics, colors, opac, alpha_min, alpha_max, stop_T,
                            out_rgb, out_T, out_n, stream);
}

cudaError_t splat_tiled_backward(int dtype, int H, int W, int64_t n, const int64_t* tile_offsets, const int32_t* tile_ids,
                                 const void* means, const void* conics, const void* colors, const void* opac,
                                 double alpha_min, double alpha_max, double stop_T, const void* fin_T,
                                 const int32_t* fin_n, const void* g_rgb, const void* g_T, void* grads,
                                 cudaStream_t stream) {
    if (dtype == 1)
        return tiled_bwd<double>(H, W, tile_offsets, tile_ids, means, conics, colors, opac, alpha_min, alpha_max,
                                 stop_T, fin_T, fin_n, g_rgb, g_T, grads, stream);
    return tiled_bwd<float>(H, W, tile_offsets, tile_ids, means, conics, colors, opac, alpha_min, alpha_max, stop_T,
                            fin_T, fin_n, g_rgb, g_T, grads, stream);
}

}  // namespace kn_cuda
