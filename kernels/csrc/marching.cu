#include "cuda_common.cuh"
#include "launchers.h"

namespace kn_cuda {
namespace {

__global__ void count_kernel(const float* __restrict__ o, const float* __restrict__ d, const float* __restrict__ tn,
                             const float* __restrict__ tf, const float* __restrict__ u, int64_t n, kn::MarchParams p,
                             kn::GridView g, int64_t* counts) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    counts[i] = kn::march_ray(o + 3 * i, d + 3 * i, tn[i], tf[i], u[i], p, g, nullptr, nullptr);
}

__global__ void fill_kernel(const float* __restrict__ o, const float* __restrict__ d, const float* __restrict__ tn,
                            const float* __restrict__ tf, const float* __restrict__ u, int64_t n, kn::MarchParams p,
                            kn::GridView g, const int64_t* __restrict__ off, float* t0, float* t1, int64_t* ri) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    kn::march_ray(o + 3 * i, d + 3 * i, tn[i], tf[i], u[i], p, g, t0 + off[i], t1 + off[i]);
    for (int64_t k = off[i]; k < off[i + 1]; ++k) ri[k] = i;
}

}  // namespace

cudaError_t march_count(const float* o, const float* d, const float* near, const float* far, const float* jitter,
                        int64_t n, const kn::MarchParams& p, const kn::GridView& g, int64_t* counts,
                        cudaStream_t stream) {
    KN_LAUNCH(count_kernel, n, stream, o, d, near, far, jitter, n, p, g, counts);
}

cudaError_t march_fill(const float* o, const float* d, const float* near, const float* far, const float* jitter,
                       int64_t n, const kn::MarchParams& p, const kn::GridView& g, const int64_t* offsets,
                       float* t0, float* t1, int64_t* ray_indices, cudaStream_t stream) {
    KN_LAUNCH(fill_kernel, n, stream, o, d, near, far, jitter, n, p, g, offsets, t0, t1, ray_indices);
}

}  // namespace kn_cuda
