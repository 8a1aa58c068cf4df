// torch binding for the CUDA launchers; same function names, arguments and checks as cpu_ops.cpp
// (both validate through binding_checks.h), so the Python side does not care which module it got.
// Built only where torch has CUDA.
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <vector>

#include "binding_checks.h"
#include "launchers.h"

namespace {

void require_cuda(const at::Tensor& t, const char* op) {
    TORCH_CHECK(t.is_cuda(), op, ": this is the CUDA module, got a tensor on ", t.device());
}

void ok(cudaError_t e, const char* op) { TORCH_CHECK(e == cudaSuccess, op, ": ", cudaGetErrorString(e)); }

int dtype_code(at::ScalarType st) { return st == at::kDouble ? 1 : 0; }

// The current stream of the device the guard made current (the tensors' device, not device 0).
cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream().stream(); }

at::Tensor hash_grid_forward(at::Tensor x, at::Tensor table, at::Tensor offsets, at::Tensor resolution,
                             at::Tensor scale, at::Tensor hashed) {
    require_cuda(x, "hash grid");
    kn_bind::check_hash_forward(x, table);
    const c10::cuda::CUDAGuard guard(x.device());
    auto m = kn_bind::hash_grid_meta(offsets, resolution, scale, hashed, x.size(1), table.size(0));
    const int64_t n = x.size(0), F = table.size(1);
    auto out = at::empty({n, m.n_levels * F}, x.options());
    ok(kn_cuda::hash_grid_forward((int)x.size(1), (int)F, dtype_code(x.scalar_type()), x.data_ptr(),
                                  table.data_ptr(), m, out.data_ptr(), n, stream()),
       "hash_grid_forward");
    return out;
}

at::Tensor hash_grid_backward(at::Tensor x, at::Tensor grad_out, int64_t n_rows, int64_t F, at::Tensor offsets,
                              at::Tensor resolution, at::Tensor scale, at::Tensor hashed) {
    require_cuda(x, "hash grid");
    auto m = kn_bind::hash_grid_meta(offsets, resolution, scale, hashed, x.size(1), n_rows);
    kn_bind::check_hash_backward(x, grad_out, m.n_levels, F);
    const c10::cuda::CUDAGuard guard(x.device());
    auto grad_table = at::zeros({n_rows, F}, grad_out.options());  // the kernel scatters with atomics
    ok(kn_cuda::hash_grid_backward((int)x.size(1), (int)F, dtype_code(x.scalar_type()), x.data_ptr(),
                                   grad_out.data_ptr(), m, grad_table.data_ptr(), x.size(0), stream()),
       "hash_grid_backward");
    return grad_table;
}

at::Tensor sh_encode(at::Tensor dirs, int64_t degree) {
    require_cuda(dirs, "sh_encode");
    kn_bind::check_sh(dirs, degree);
    const c10::cuda::CUDAGuard guard(dirs.device());
    auto out = at::empty({dirs.size(0), degree * degree}, dirs.options());
    ok(kn_cuda::sh_encode(dtype_code(dirs.scalar_type()), dirs.data_ptr(), (int)degree, out.data_ptr(),
                          dirs.size(0), stream()),
       "sh_encode");
    return out;
}

std::vector<at::Tensor> composite_forward(at::Tensor sigmas, at::Tensor rgbs, at::Tensor t0, at::Tensor t1,
                                          at::Tensor offsets, double stop_T) {
    require_cuda(sigmas, "composite");
    const c10::cuda::CUDAGuard guard(sigmas.device());
    const auto st = kn_bind::check_composite(sigmas, rgbs, t0, t1, offsets);
    const int64_t n = offsets.numel() - 1;
    auto rgb = at::empty({n, 3}, sigmas.options());
    auto depth = at::empty({n}, sigmas.options());
    auto opacity = at::empty({n}, sigmas.options());
    ok(kn_cuda::composite_forward(dtype_code(st), offsets.data_ptr<int64_t>(), n, sigmas.data_ptr(),
                                  rgbs.data_ptr(), t0.data_ptr(), t1.data_ptr(), stop_T, rgb.data_ptr(),
                                  depth.data_ptr(), opacity.data_ptr(), stream()),
       "composite_forward");
    return {rgb, depth, opacity};
}

std::vector<at::Tensor> composite_backward(at::Tensor sigmas, at::Tensor rgbs, at::Tensor t0, at::Tensor t1,
                                           at::Tensor offsets, double stop_T, at::Tensor g_rgb, at::Tensor g_depth,
                                           at::Tensor g_opacity) {
    require_cuda(sigmas, "composite");
    const c10::cuda::CUDAGuard guard(sigmas.device());
    const auto st = kn_bind::check_composite(sigmas, rgbs, t0, t1, offsets);
    const int64_t n = offsets.numel() - 1;
    kn_bind::check_composite_grads(sigmas, n, g_rgb, g_depth, g_opacity);
    auto gs = at::zeros_like(sigmas);
    auto gc = at::zeros_like(rgbs);
    ok(kn_cuda::composite_backward(dtype_code(st), offsets.data_ptr<int64_t>(), n, sigmas.data_ptr(),
                                   rgbs.data_ptr(), t0.data_ptr(), t1.data_ptr(), stop_T, g_rgb.data_ptr(),
                                   g_depth.data_ptr(), g_opacity.data_ptr(), gs.data_ptr(), gc.data_ptr(), stream()),
       "composite_backward");
    return {gs, gc};
}

at::Tensor occ_bitfield(at::Tensor density, double thresh) {
    require_cuda(density, "occupancy grid");
    const int64_t res = kn_bind::check_density(density);
    const c10::cuda::CUDAGuard guard(density.device());
    const int64_t C = density.size(0);
    const kn_bind::BitLayout b = kn_bind::bit_layout(res);
    auto bits = at::zeros({C, (int64_t)b.offset[b.n_mips]}, density.options().dtype(at::kByte));
    ok(kn_cuda::occ_bitfield(density.data_ptr<float>(), (float)thresh, (int)C, (uint32_t)res, b.n_mips, b.offset,
                             bits.data_ptr<uint8_t>(), stream()),
       "occ_bitfield");
    return bits;
}

at::Tensor occ_query(at::Tensor points, at::Tensor bits, int64_t res, std::vector<double> center,
                     std::vector<double> half) {
    require_cuda(points, "occupancy query");
    kn_bind::check_points(points);
    const c10::cuda::CUDAGuard guard(points.device());
    const kn::GridView g = kn_bind::grid_view(bits, res, center, half, points.device());
    auto out = at::empty({points.size(0)}, points.options().dtype(at::kBool));
    ok(kn_cuda::occ_query(points.data_ptr<float>(), points.size(0), g, out.data_ptr<bool>(), stream()), "occ_query");
    return out;
}

std::vector<at::Tensor> march_rays(at::Tensor rays_o, at::Tensor rays_d, at::Tensor near, at::Tensor far,
                                   at::Tensor jitter, std::vector<double> aabb, double step, double cone,
                                   double max_step, int64_t max_samples, c10::optional<at::Tensor> bits, int64_t res,
                                   std::vector<double> center, std::vector<double> half) {
    require_cuda(rays_o, "march_rays");
    kn_bind::check_rays(rays_o, rays_d, near, far, jitter);
    const c10::cuda::CUDAGuard guard(rays_o.device());
    const kn::MarchParams p = kn_bind::march_params(aabb, step, cone, max_step, max_samples, bits.has_value());
    kn::GridView g{};
    if (p.use_grid) g = kn_bind::grid_view(*bits, res, center, half, rays_o.device());
    const int64_t n = rays_o.size(0);
    auto counts = at::empty({n}, rays_o.options().dtype(at::kLong));
    const float *o = rays_o.data_ptr<float>(), *d = rays_d.data_ptr<float>();
    ok(kn_cuda::march_count(o, d, near.data_ptr<float>(), far.data_ptr<float>(), jitter.data_ptr<float>(), n, p, g,
                            counts.data_ptr<int64_t>(), stream()),
       "march_count");
    auto offsets = at::zeros({n + 1}, counts.options());
    offsets.slice(0, 1).copy_(at::cumsum(counts, 0));
    const int64_t total = n ? offsets[n].item<int64_t>() : 0;  // the one host sync: output size
    auto t0 = at::empty({total}, rays_o.options());
    auto t1 = at::empty({total}, rays_o.options());
    auto ri = at::empty({total}, counts.options());
    ok(kn_cuda::march_fill(o, d, near.data_ptr<float>(), far.data_ptr<float>(), jitter.data_ptr<float>(), n, p, g,
                           offsets.data_ptr<int64_t>(), t0.data_ptr<float>(), t1.data_ptr<float>(),
                           ri.data_ptr<int64_t>(), stream()),
       "march_fill");
    return {ri, t0, t1, offsets, counts};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("hash_grid_forward", &hash_grid_forward);
    m.def("hash_grid_backward", &hash_grid_backward);
    m.def("sh_encode", &sh_encode);
    m.def("composite_forward", &composite_forward);
    m.def("composite_backward", &composite_backward);
    m.def("occ_bitfield", &occ_bitfield);
    m.def("occ_query", &occ_query);
    m.def("march_rays", &march_rays);
}
