// The CUDA device of ops.h: each launch goes to the kn_cuda launcher of the same name (launchers.h)
// on the current stream of the tensors' device (the guard makes it current), and a launch error
// becomes a torch error naming the launcher. Included by the CUDA libraries only (built where torch
// has CUDA).
#pragma once

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <utility>

#include "launchers.h"
#include "ops.h"

namespace kn_ops {

inline void cuda_ok(cudaError_t e, const char* launcher) {
    TORCH_CHECK(e == cudaSuccess, launcher, ": ", cudaGetErrorString(e));
}

#define KN_CUDA_LAUNCH(name)                                                                  \
    template <typename... Args>                                                               \
    static void name(Args&&... args) {                                                        \
        cuda_ok(kn_cuda::name(std::forward<Args>(args)..., stream()), #name);                 \
    }

struct Cuda {
    using Guard = c10::cuda::CUDAGuard;

    static cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

    KN_NERF_LAUNCHES(KN_CUDA_LAUNCH)
    KN_SPLAT_LAUNCHES(KN_CUDA_LAUNCH)

    // Count, scan, then fill: the one host sync is the total, which sizes the outputs.
    static T5 march_rays(const at::Tensor& rays_o, const at::Tensor& rays_d, const at::Tensor& near,
                         const at::Tensor& far, const at::Tensor& jitter, const kn::MarchParams& p,
                         const kn::GridView& g) {
        const int64_t n = rays_o.size(0);
        auto counts = at::empty({n}, rays_o.options().dtype(at::kLong));
        const float *o = rays_o.data_ptr<float>(), *d = rays_d.data_ptr<float>();
        const float *tn = near.data_ptr<float>(), *tf = far.data_ptr<float>(), *u = jitter.data_ptr<float>();
        cuda_ok(kn_cuda::march_count(o, d, tn, tf, u, n, p, g, counts.data_ptr<int64_t>(), stream()), "march_count");
        auto offsets = at::zeros({n + 1}, counts.options());
        offsets.slice(0, 1).copy_(at::cumsum(counts, 0));
        const int64_t total = n ? offsets[n].item<int64_t>() : 0;
        auto t0 = at::empty({total}, rays_o.options());
        auto t1 = at::empty({total}, rays_o.options());
        auto ri = at::empty({total}, counts.options());
        cuda_ok(kn_cuda::march_fill(o, d, tn, tf, u, n, p, g, offsets.data_ptr<int64_t>(), t0.data_ptr<float>(),
                                    t1.data_ptr<float>(), ri.data_ptr<int64_t>(), stream()),
                "march_fill");
        return {ri, t0, t1, offsets, counts};
    }
};

#undef KN_CUDA_LAUNCH

}  // namespace kn_ops
