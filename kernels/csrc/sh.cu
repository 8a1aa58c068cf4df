#include "cuda_common.cuh"
#include "launchers.h"
#include "sh.h"

namespace kn_cuda {
namespace {

template <typename T>
__global__ void sh_kernel(const T* __restrict__ dirs, int degree, T* out, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    kn::sh_encode_dir<T>(dirs + 3 * i, degree, out + (int64_t)degree * degree * i);
}

}  // namespace

cudaError_t sh_encode(int dtype, const void* dirs, int degree, void* out, int64_t n, cudaStream_t stream) {
    if (dtype == 1) KN_LAUNCH(sh_kernel<double>, n, stream, (const double*)dirs, degree, (double*)out, n);
    KN_LAUNCH(sh_kernel<float>, n, stream, (const float*)dirs, degree, (float*)out, n);
}

}  // namespace kn_cuda
