// CUDA torch binding of the splat compositors (launchers in splat.cu). Same functions and checks
// (binding_checks.h) as splat_cpu.cpp. Every launch runs on the splats' device under a device
// guard, on that device's current stream. Built only where torch has CUDA.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "binding_checks.h"
#include "launchers.h"

namespace {

at::ScalarType check_inputs(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                            const at::Tensor& opac, int64_t H, int64_t W) {
    TORCH_CHECK(means.is_cuda(), "splat: this is the CUDA module, got a tensor on ", means.device());
    kn_bind::check_image(H, W);
    return kn_bind::check_splats(means, conics, colors, opac);
}

void ok(cudaError_t e, const char* op) { TORCH_CHECK(e == cudaSuccess, op, ": ", cudaGetErrorString(e)); }

int dtype_code(at::ScalarType st) { return st == at::kDouble ? 1 : 0; }

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

std::vector<at::Tensor> alloc_fwd(int64_t H, int64_t W, const at::Tensor& like) {
    return {at::zeros({H, W, 3}, like.options()), at::ones({H, W}, like.options()),
            at::zeros({H, W}, like.options().dtype(at::kInt))};
}

std::vector<at::Tensor> naive_forward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                                      const at::Tensor& opac, int64_t H, int64_t W, double a0, double a1, double st) {
    const auto dt = check_inputs(means, conics, colors, opac, H, W);
    const c10::cuda::CUDAGuard guard(means.device());
    auto out = alloc_fwd(H, W, means);
    ok(kn_cuda::splat_naive_forward(dtype_code(dt), (int)H, (int)W, means.size(0), means.data_ptr(),
                                    conics.data_ptr(), colors.data_ptr(), opac.data_ptr(), a0, a1, st,
                                    out[0].data_ptr(), out[1].data_ptr(), out[2].data_ptr<int32_t>(), stream()),
       "splat naive forward");
    return out;
}

at::Tensor naive_backward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opac, int64_t H, int64_t W, double a0, double a1, double st,
                          const at::Tensor& fT, const at::Tensor& fn, const at::Tensor& gr, const at::Tensor& gT) {
    const auto dt = check_inputs(means, conics, colors, opac, H, W);
    const c10::cuda::CUDAGuard guard(means.device());
    kn_bind::check_splat_backward(fT, fn, gr, gT, H, W, means, means.size(0));
    auto grads = at::zeros({means.size(0), kn::SPLAT_GRADS}, means.options());  // atomics add into it
    ok(kn_cuda::splat_naive_backward(dtype_code(dt), (int)H, (int)W, means.data_ptr(), conics.data_ptr(),
                                     colors.data_ptr(), opac.data_ptr(), a0, a1, st, fT.data_ptr(),
                                     fn.data_ptr<int32_t>(), gr.data_ptr(), gT.data_ptr(), grads.data_ptr(), stream()),
       "splat naive backward");
    return grads;
}

std::vector<at::Tensor> tiled_forward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                                      const at::Tensor& opac, int64_t H, int64_t W, const at::Tensor& off,
                                      const at::Tensor& ids, double a0, double a1, double st) {
    const auto dt = check_inputs(means, conics, colors, opac, H, W);
    const c10::cuda::CUDAGuard guard(means.device());
    kn_bind::check_tiles(off, ids, H, W, means.size(0), means.device());
    auto out = alloc_fwd(H, W, means);
    ok(kn_cuda::splat_tiled_forward(dtype_code(dt), (int)H, (int)W, off.data_ptr<int64_t>(),
                                    ids.data_ptr<int32_t>(), means.data_ptr(), conics.data_ptr(), colors.data_ptr(),
                                    opac.data_ptr(), a0, a1, st, out[0].data_ptr(), out[1].data_ptr(),
                                    out[2].data_ptr<int32_t>(), stream()),
       "splat tiled forward");
    return out;
}

at::Tensor tiled_backward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opac, int64_t H, int64_t W, const at::Tensor& off, const at::Tensor& ids,
                          double a0, double a1, double st, const at::Tensor& fT, const at::Tensor& fn,
                          const at::Tensor& gr, const at::Tensor& gT) {
    const auto dt = check_inputs(means, conics, colors, opac, H, W);
    const c10::cuda::CUDAGuard guard(means.device());
    kn_bind::check_tiles(off, ids, H, W, means.size(0), means.device());
    kn_bind::check_splat_backward(fT, fn, gr, gT, H, W, means, kn_bind::longest_tile(off));
    auto grads = at::zeros({means.size(0), kn::SPLAT_GRADS}, means.options());  // atomics add into it
    ok(kn_cuda::splat_tiled_backward(dtype_code(dt), (int)H, (int)W, off.data_ptr<int64_t>(),
                                     ids.data_ptr<int32_t>(), means.data_ptr(), conics.data_ptr(),
                                     colors.data_ptr(), opac.data_ptr(), a0, a1, st, fT.data_ptr(),
                                     fn.data_ptr<int32_t>(), gr.data_ptr(), gT.data_ptr(), grads.data_ptr(), stream()),
       "splat tiled backward");
    return grads;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("naive_forward", &naive_forward);
    m.def("naive_backward", &naive_backward);
    m.def("tiled_forward", &tiled_forward);
    m.def("tiled_backward", &tiled_backward);
}
