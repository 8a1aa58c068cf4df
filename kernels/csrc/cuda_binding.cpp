// torch binding for the CUDA launchers; same function names and arguments as cpu_ops.cpp so the
// Python side does not care which module it got. Built only where torch has CUDA.
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>

#include <vector>

#include "launchers.h"

namespace {

void check_cuda(const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
    TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

void ok(cudaError_t e, const char* op) { TORCH_CHECK(e == cudaSuccess, op, ": ", cudaGetErrorString(e)); }

int dtype_code(const at::Tensor& t) {
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble, "float32 or float64 expected");
    return t.scalar_type() == at::kDouble ? 1 : 0;
}

cudaStream_t stream() { return c10::cuda::getCurrentCUDAStream(); }

kn::HashGridMeta make_meta(const at::Tensor& offsets, const at::Tensor& resolution, const at::Tensor& scale,
                           const at::Tensor& hashed) {
    kn::HashGridMeta m{};
    const int64_t L = resolution.numel();
    TORCH_CHECK(L >= 1 && L <= kn::HASH_GRID_MAX_LEVELS, "hash grid: too many levels");
    auto o = offsets.cpu().to(at::kLong).contiguous();
    auto r = resolution.cpu().to(at::kLong).contiguous();
    auto s = scale.cpu().to(at::kFloat).contiguous();
    auto h = hashed.cpu().to(at::kBool).contiguous();
    m.n_levels = (int)L;
    for (int64_t l = 0; l < L; ++l) {
        m.offset[l] = (uint32_t)o.data_ptr<int64_t>()[l];
        m.resolution[l] = (uint32_t)r.data_ptr<int64_t>()[l];
        m.scale[l] = s.data_ptr<float>()[l];
        if (h.data_ptr<bool>()[l]) m.hashed_mask |= (1u << l);
    }
    m.offset[L] = (uint32_t)o.data_ptr<int64_t>()[L];
    return m;
}

at::Tensor hash_grid_forward(at::Tensor x, at::Tensor table, at::Tensor offsets, at::Tensor resolution,
                             at::Tensor scale, at::Tensor hashed) {
    check_cuda(x, "x");
    check_cuda(table, "table");
    const c10::cuda::CUDAGuard guard(x.device());
    auto m = make_meta(offsets, resolution, scale, hashed);
    const int64_t n = x.size(0), F = table.size(1);
    auto out = at::empty({n, m.n_levels * F}, x.options());
    ok(kn_cuda::hash_grid_forward((int)x.size(1), (int)F, dtype_code(x), x.data_ptr(), table.data_ptr(), m,
                                  out.data_ptr(), n, stream()),
       "hash_grid_forward");
    return out;
}

at::Tensor hash_grid_backward(at::Tensor x, at::Tensor grad_out, int64_t n_rows, int64_t F, at::Tensor offsets,
                              at::Tensor resolution, at::Tensor scale, at::Tensor hashed) {
    check_cuda(x, "x");
    check_cuda(grad_out, "grad_out");
    const c10::cuda::CUDAGuard guard(x.device());
    auto m = make_meta(offsets, resolution, scale, hashed);
    auto grad_table = at::zeros({n_rows, F}, grad_out.options());
    ok(kn_cuda::hash_grid_backward((int)x.size(1), (int)F, dtype_code(x), x.data_ptr(), grad_out.data_ptr(), m,
                                   grad_table.data_ptr(), x.size(0), stream()),
       "hash_grid_backward");
    return grad_table;
}

at::Tensor sh_encode(at::Tensor dirs, int64_t degree) {
    check_cuda(dirs, "dirs");
    TORCH_CHECK(degree >= 1 && degree <= 4, "sh_encode: degree must be 1..4");
    const c10::cuda::CUDAGuard guard(dirs.device());
    auto out = at::empty({dirs.size(0), degree * degree}, dirs.options());
    ok(kn_cuda::sh_encode(dtype_code(dirs), dirs.data_ptr(), (int)degree, out.data_ptr(), dirs.size(0), stream()),
       "sh_encode");
    return out;
}

std::vector<at::Tensor> composite_forward(at::Tensor sigmas, at::Tensor rgbs, at::Tensor t0, at::Tensor t1,
                                          at::Tensor offsets, double stop_T) {
    for (auto* t : {&sigmas, &rgbs, &t0, &t1, &offsets}) check_cuda(*t, "composite input");
    const c10::cuda::CUDAGuard guard(sigmas.device());
    const int64_t n = offsets.numel() - 1;
    auto rgb = at::empty({n, 3}, sigmas.options());
    auto depth = at::empty({n}, sigmas.options());
    auto opacity = at::empty({n}, sigmas.options());
    ok(kn_cuda::composite_forward(dtype_code(sigmas), offsets.data_ptr<int64_t>(), n, sigmas.data_ptr(),
                                  rgbs.data_ptr(), t0.data_ptr(), t1.data_ptr(), stop_T, rgb.data_ptr(),
                                  depth.data_ptr(), opacity.data_ptr(), stream()),
       "composite_forward");
    return {rgb, depth, opacity};
}

std::vector<at::Tensor> composite_backward(at::Tensor sigmas, at::Tensor rgbs, at::Tensor t0, at::Tensor t1,
                                           at::Tensor offsets, double stop_T, at::Tensor g_rgb, at::Tensor g_depth,
                                           at::Tensor g_opacity) {
    for (auto* t : {&sigmas, &rgbs, &t0, &t1, &offsets, &g_rgb, &g_depth, &g_opacity}) check_cuda(*t, "composite input");
    const c10::cuda::CUDAGuard guard(sigmas.device());
    auto gs = at::empty_like(sigmas);
    auto gc = at::empty_like(rgbs);
    ok(kn_cuda::composite_backward(dtype_code(sigmas), offsets.data_ptr<int64_t>(), offsets.numel() - 1,
                                   sigmas.data_ptr(), rgbs.data_ptr(), t0.data_ptr(), t1.data_ptr(), stop_T,
                                   g_rgb.data_ptr(), g_depth.data_ptr(), g_opacity.data_ptr(), gs.data_ptr(),
                                   gc.data_ptr(), stream()),
       "composite_backward");
    return {gs, gc};
}

struct Layout {
    int n_mips = 0;
    uint32_t offset[kn::OCC_MAX_MIPS + 1] = {};
};

Layout layout(int64_t res) {
    TORCH_CHECK(res >= 2 && res <= 1024 && (res & (res - 1)) == 0, "occupancy grid: resolution must be a power of two");
    Layout b;
    while ((res >> b.n_mips) >= 1) ++b.n_mips;
    for (int m = 0; m < b.n_mips; ++m)
        b.offset[m + 1] = b.offset[m] + std::max<uint32_t>(1, kn::mip_cells((uint32_t)res, m) / 8);
    return b;
}

at::Tensor occ_bitfield(at::Tensor density, double thresh) {
    check_cuda(density, "density");
    const c10::cuda::CUDAGuard guard(density.device());
    const int64_t C = density.size(0), cells = density.size(1);
    const int64_t res = (int64_t)std::llround(std::cbrt((double)cells));
    TORCH_CHECK(res * res * res == cells, "occupancy grid: density rows must hold R^3 cells");
    const Layout b = layout(res);
    auto bits = at::zeros({C, (int64_t)b.offset[b.n_mips]}, density.options().dtype(at::kByte));
    ok(kn_cuda::occ_bitfield(density.data_ptr<float>(), (float)thresh, (int)C, (uint32_t)res, b.n_mips, b.offset,
                             bits.data_ptr<uint8_t>(), stream()),
       "occ_bitfield");
    return bits;
}

kn::GridView make_view(const at::Tensor& bits, int64_t res, const std::vector<double>& center,
                       const std::vector<double>& half) {
    const Layout b = layout(res);
    kn::GridView g{};
    g.bits = bits.data_ptr<uint8_t>();
    g.n_cascades = (int)bits.size(0);
    g.res = (uint32_t)res;
    g.n_mips = b.n_mips;
    g.bytes_per_cascade = b.offset[b.n_mips];
    for (int m = 0; m < b.n_mips; ++m) g.mip_byte_offset[m] = b.offset[m];
    for (int k = 0; k < 3; ++k) {
        g.center[k] = (float)center[k];
        g.half[k] = (float)half[k];
    }
    return g;
}

at::Tensor occ_query(at::Tensor points, at::Tensor bits, int64_t res, std::vector<double> center,
                     std::vector<double> half) {
    check_cuda(points, "points");
    check_cuda(bits, "bitfield");
    const c10::cuda::CUDAGuard guard(points.device());
    auto out = at::empty({points.size(0)}, points.options().dtype(at::kBool));
    ok(kn_cuda::occ_query(points.data_ptr<float>(), points.size(0), make_view(bits, res, center, half),
                          out.data_ptr<bool>(), stream()),
       "occ_query");
    return out;
}

std::vector<at::Tensor> march_rays(at::Tensor rays_o, at::Tensor rays_d, at::Tensor near, at::Tensor far,
                                   at::Tensor jitter, std::vector<double> aabb, double step, double cone,
                                   double max_step, int64_t max_samples, c10::optional<at::Tensor> bits, int64_t res,
                                   std::vector<double> center, std::vector<double> half) {
    for (auto* t : {&rays_o, &rays_d, &near, &far, &jitter}) check_cuda(*t, "ray tensor");
    const c10::cuda::CUDAGuard guard(rays_o.device());
    kn::MarchParams p{};
    for (int k = 0; k < 3; ++k) {
        p.aabb_min[k] = (float)aabb[k];
        p.aabb_max[k] = (float)aabb[k + 3];
    }
    p.step = (float)step;
    p.cone = (float)cone;
    p.max_step = (float)max_step;
    p.max_samples = (int)max_samples;
    kn::GridView g{};
    p.use_grid = bits.has_value() ? 1 : 0;
    if (p.use_grid) {
        check_cuda(*bits, "bitfield");
        g = make_view(*bits, res, center, half);
    }
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
