#include "cuda_common.cuh"
#include "launchers.h"

namespace kn_cuda {
namespace {

// A functor rather than a __device__ lambda, so no --extended-lambda flag is needed.
struct AtomicAdd {
    template <typename T>
    __device__ void operator()(T* p, T v) const { atomicAdd(p, v); }
};

// Thread per (point, level): neighbouring threads share a level's table slice.
template <int D, int F, typename T>
__global__ void fwd_kernel(const T* __restrict__ x, const T* __restrict__ table, kn::HashGridMeta m, T* out,
                           int64_t n) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= n * m.n_levels) return;
    const int l = (int)(tid / n);
    const int64_t i = tid - (int64_t)l * n;
    kn::hash_grid_forward_point_level<D, F, T>(x + i * D, table, m, l, out + i * m.n_levels * F + l * F);
}

template <int D, int F, typename T>
__global__ void bwd_kernel(const T* __restrict__ x, const T* __restrict__ grad_out, kn::HashGridMeta m,
                           T* grad_table, int64_t n) {
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (tid >= n * m.n_levels) return;
    const int l = (int)(tid / n);
    const int64_t i = tid - (int64_t)l * n;
    AtomicAdd add;
    kn::hash_grid_backward_point_level<D, F, T>(x + i * D, grad_out + i * m.n_levels * F + l * F, m, l, grad_table,
                                                add);
}

template <int D, int F, typename T>
cudaError_t run(bool backward, const void* x, const void* a, const kn::HashGridMeta& m, void* out, int64_t n,
                cudaStream_t s) {
    const int64_t work = n * m.n_levels;
    if (backward) KN_LAUNCH((bwd_kernel<D, F, T>), work, s, (const T*)x, (const T*)a, m, (T*)out, n);
    KN_LAUNCH((fwd_kernel<D, F, T>), work, s, (const T*)x, (const T*)a, m, (T*)out, n);
}

template <typename T>
cudaError_t dispatch(bool backward, int dims, int f, const void* x, const void* a, const kn::HashGridMeta& m, void* out,
                     int64_t n, cudaStream_t s) {
#define KN_CASE(DD, FF) \
    if (dims == DD && f == FF) return run<DD, FF, T>(backward, x, a, m, out, n, s);
    KN_CASE(2, 1) KN_CASE(2, 2) KN_CASE(2, 4) KN_CASE(2, 8)
    KN_CASE(3, 1) KN_CASE(3, 2) KN_CASE(3, 4) KN_CASE(3, 8)
#undef KN_CASE
    return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t hash_grid_forward(int dims, int features, int dtype, const void* x, const void* table,
                              const kn::HashGridMeta& meta, void* out, int64_t n, cudaStream_t stream) {
    if (dtype == 1) return dispatch<double>(false, dims, features, x, table, meta, out, n, stream);
    return dispatch<float>(false, dims, features, x, table, meta, out, n, stream);
}

cudaError_t hash_grid_backward(int dims, int features, int dtype, const void* x, const void* grad_out,
                               const kn::HashGridMeta& meta, void* grad_table, int64_t n, cudaStream_t stream) {
    if (dtype == 1) return dispatch<double>(true, dims, features, x, grad_out, meta, grad_table, n, stream);
    return dispatch<float>(true, dims, features, x, grad_out, meta, grad_table, n, stream);
}

}  // namespace kn_cuda
