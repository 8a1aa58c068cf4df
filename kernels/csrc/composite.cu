#include "composite.h"
#include "cuda_common.cuh"
#include "launchers.h"

namespace kn_cuda {
namespace {

// One thread per ray: rays are short (tens of samples after skipping) and need a sequential scan.
template <typename T>
__global__ void fwd_kernel(const int64_t* __restrict__ off, int64_t n_rays, const T* __restrict__ s,
                           const T* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b, T stop_T,
                           T* o_rgb, T* o_d, T* o_o) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rays) return;
    kn::composite_forward_ray<T>(off[r], off[r + 1], s, c, a, b, stop_T, o_rgb + 3 * r, o_d + r, o_o + r);
}

template <typename T>
__global__ void bwd_kernel(const int64_t* __restrict__ off, int64_t n_rays, const T* __restrict__ s,
                           const T* __restrict__ c, const T* __restrict__ a, const T* __restrict__ b, T stop_T,
                           const T* __restrict__ gr, const T* __restrict__ gd, const T* __restrict__ go, T* gs,
                           T* gc) {
    const int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rays) return;
    kn::composite_backward_ray<T>(off[r], off[r + 1], s, c, a, b, stop_T, gr + 3 * r, gd[r], go[r], gs, gc);
}

template <typename T>
cudaError_t fwd(const int64_t* off, int64_t n, const void* s, const void* c, const void* a, const void* b,
                double stop_T, void* o_rgb, void* o_d, void* o_o, cudaStream_t st) {
    KN_LAUNCH(fwd_kernel<T>, n, st, off, n, (const T*)s, (const T*)c, (const T*)a, (const T*)b, (T)stop_T, (T*)o_rgb,
              (T*)o_d, (T*)o_o);
}

template <typename T>
cudaError_t bwd(const int64_t* off, int64_t n, const void* s, const void* c, const void* a, const void* b,
                double stop_T, const void* gr, const void* gd, const void* go, void* gs, void* gc, cudaStream_t st) {
    KN_LAUNCH(bwd_kernel<T>, n, st, off, n, (const T*)s, (const T*)c, (const T*)a, (const T*)b, (T)stop_T,
              (const T*)gr, (const T*)gd, (const T*)go, (T*)gs, (T*)gc);
}

}  // namespace

cudaError_t composite_forward(int dtype, const int64_t* offsets, int64_t n_rays, const void* sigma, const void* rgb,
                              const void* t0, const void* t1, double stop_T, void* out_rgb, void* out_depth,
                              void* out_opacity, cudaStream_t stream) {
    if (dtype == 1) return fwd<double>(offsets, n_rays, sigma, rgb, t0, t1, stop_T, out_rgb, out_depth, out_opacity, stream);
    return fwd<float>(offsets, n_rays, sigma, rgb, t0, t1, stop_T, out_rgb, out_depth, out_opacity, stream);
}

cudaError_t composite_backward(int dtype, const int64_t* offsets, int64_t n_rays, const void* sigma, const void* rgb,
                               const void* t0, const void* t1, double stop_T, const void* g_rgb, const void* g_depth,
                               const void* g_opacity, void* grad_sigma, void* grad_rgb, cudaStream_t stream) {
    if (dtype == 1)
        return bwd<double>(offsets, n_rays, sigma, rgb, t0, t1, stop_T, g_rgb, g_depth, g_opacity, grad_sigma, grad_rgb, stream);
    return bwd<float>(offsets, n_rays, sigma, rgb, t0, t1, stop_T, g_rgb, g_depth, g_opacity, grad_sigma, grad_rgb, stream);
}

}  // namespace kn_cuda
