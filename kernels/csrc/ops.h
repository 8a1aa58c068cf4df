// Every compiled op, written once: its schema (torch.library) and its front end (argument checks,
// output allocation, device guard), templated over the device that runs it. A device is a struct
// (`Cpu` in cpu_ops.cpp / splat_cpu.cpp, both on CpuDevice of cpu_device.h; `Cuda` in cuda_device.h) with
//   - `Guard`: constructed from the tensors' device (a CUDAGuard, or nothing on the CPU);
//   - one static launch function per name in KN_NERF_LAUNCHES / KN_SPLAT_LAUNCHES, taking the
//     arguments of the kn_cuda launcher of that name (launchers.h) without the stream;
//   - `march_rays(...)`, whose CPU and CUDA algorithms differ in shape (one pass vs count + fill).
// The CPU library defines the schemas (TORCH_LIBRARY) and registers the CPU kernels plus the
// CPU-only ops; the CUDA library, loaded after it, registers `impl_*<Cuda>` for the CUDA key.
// Python (kernels/_fake.py) registers each op's fake implementation for FakeTensor / torch.compile.
#pragma once

#include <torch/library.h>

#include <tuple>
#include <vector>

#include "binding_checks.h"

// The launches each device provides, by name (the kn_cuda launchers of launchers.h).
#define KN_NERF_LAUNCHES(X)                                                                        \
    X(hash_grid_forward) X(hash_grid_backward) X(sh_encode) X(composite_forward) X(composite_backward) \
        X(occ_bitfield) X(occ_query)
#define KN_SPLAT_LAUNCHES(X) \
    X(splat_naive_forward) X(splat_naive_backward) X(splat_tiled_forward) X(splat_tiled_backward)

namespace kn_ops {

// dtype code of the launchers: 0 = float32, 1 = float64.
inline int dtype_code(at::ScalarType st) { return st == at::kDouble ? 1 : 0; }

// ---- schemas ------------------------------------------------------------------------------------
// (a!) marks an argument the op writes in place; `-> ()` returns nothing.

inline void define_nerf(torch::Library& m) {
    m.def("hash_grid_forward(Tensor x, Tensor table, Tensor offsets, Tensor resolution, Tensor scale, "
          "Tensor hashed) -> Tensor");
    m.def("hash_grid_backward(Tensor x, Tensor grad_out, int n_rows, int n_features, Tensor offsets, "
          "Tensor resolution, Tensor scale, Tensor hashed) -> Tensor");
    m.def("hash_grid_backward_rows(Tensor x, Tensor grad_out, Tensor(a!) grad_table, Tensor(b!) touched, "
          "Tensor offsets, Tensor resolution, Tensor scale, Tensor hashed) -> ()");
    m.def("hash_grid_adam(Tensor(a!) table, Tensor(b!) grad, Tensor(c!) touched, Tensor(d!) exp_avg, "
          "Tensor(e!) exp_avg_sq, Tensor(f!) steps, Tensor bc1, Tensor bc2_sqrt, float lr, float beta1, "
          "float beta2, float eps) -> ()");
    m.def("sh_encode(Tensor dirs, int degree) -> Tensor");
    m.def("composite_forward(Tensor sigmas, Tensor rgbs, Tensor t_starts, Tensor t_ends, Tensor offsets, "
          "float stop_T) -> (Tensor, Tensor, Tensor)");
    m.def("composite_backward(Tensor sigmas, Tensor rgbs, Tensor t_starts, Tensor t_ends, Tensor offsets, "
          "float stop_T, Tensor grad_rgb, Tensor grad_depth, Tensor grad_opacity) -> (Tensor, Tensor)");
    m.def("ray_offsets(Tensor ray_indices, int n_rays) -> Tensor");
    m.def("occ_bitfield(Tensor density, float threshold) -> Tensor");
    m.def("occ_query(Tensor points, Tensor bits, int resolution, float[] center, float[] half) -> Tensor");
    // -> ray_indices (S,), t_starts (S,), t_ends (S,), offsets (N + 1,), counts (N,); S data-dependent.
    m.def("march_rays(Tensor rays_o, Tensor rays_d, Tensor near, Tensor far, Tensor jitter, float[] aabb, "
          "float step, float cone, float max_step, int max_samples, Tensor? bits, int resolution, "
          "float[] center, float[] half) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
    m.def("cull_round(Tensor offsets, Tensor alive, Tensor sigma, Tensor t_starts, Tensor t_ends, "
          "Tensor(a!) tau, Tensor(b!) near, int cap, float tau_max, float alpha_min) -> (Tensor, Tensor)");
    m.def("move_rows(Tensor(a!) dst, Tensor dest, Tensor src, Tensor idx) -> ()");
    // -> sigma (N,), rgb (N, 3) ((0, 3) without sh).
    m.def("nerf_mlp_forward(Tensor enc, Tensor? sh, Tensor[] density, Tensor[] color, float shift, int block, "
          "int isa) -> (Tensor, Tensor)");
    // -> grad_enc, grad_sh (each (0,) unless asked for), then one gradient per parameter if need_params.
    m.def("nerf_mlp_backward(Tensor enc, Tensor? sh, Tensor[] density, Tensor[] color, float shift, "
          "Tensor? sigma, Tensor? rgb, Tensor? grad_sigma, Tensor? grad_rgb, bool need_enc, bool need_sh, "
          "bool need_params, int block, int isa) -> Tensor[]");
    m.def("mlp_isa() -> int");
    m.def("mlp_bf16_supported() -> bool");
}

inline void define_splat(torch::Library& m) {
    // -> rgb (H, W, 3), final transmittance (H, W), n_contrib (H, W) int32.
    m.def("naive_forward(Tensor means2d, Tensor conics, Tensor colors, Tensor opacities, int H, int W, "
          "float alpha_min, float alpha_max, float stop_T) -> (Tensor, Tensor, Tensor)");
    // -> grads (N, 11): du dv dA dB dC dr dg db do per splat, then |du| |dv| summed over pixels.
    m.def("naive_backward(Tensor means2d, Tensor conics, Tensor colors, Tensor opacities, int H, int W, "
          "float alpha_min, float alpha_max, float stop_T, Tensor final_T, Tensor n_contrib, Tensor grad_rgb, "
          "Tensor grad_T) -> Tensor");
    m.def("tiled_forward(Tensor means2d, Tensor conics, Tensor colors, Tensor opacities, int H, int W, "
          "Tensor tile_offsets, Tensor tile_ids, float alpha_min, float alpha_max, float stop_T) "
          "-> (Tensor, Tensor, Tensor)");
    m.def("tiled_backward(Tensor means2d, Tensor conics, Tensor colors, Tensor opacities, int H, int W, "
          "Tensor tile_offsets, Tensor tile_ids, float alpha_min, float alpha_max, float stop_T, "
          "Tensor final_T, Tensor n_contrib, Tensor grad_rgb, Tensor grad_T) -> Tensor");
}

using T2 = std::tuple<at::Tensor, at::Tensor>;
using T3 = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using T5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// ---- NeRF front ends ----------------------------------------------------------------------------

template <class Dev>
at::Tensor hash_grid_forward(const at::Tensor& x, const at::Tensor& table, const at::Tensor& offsets,
                             const at::Tensor& resolution, const at::Tensor& scale, const at::Tensor& hashed) {
    kn_bind::check_hash_forward(x, table);
    const typename Dev::Guard guard(x.device());
    const auto m = kn_bind::hash_grid_meta(offsets, resolution, scale, hashed, x.size(1), table.size(0));
    const int64_t n = x.size(0), F = table.size(1);
    auto out = at::empty({n, m.n_levels * F}, x.options());
    Dev::hash_grid_forward((int)x.size(1), (int)F, dtype_code(x.scalar_type()), x.data_ptr(), table.data_ptr(), m,
                           out.data_ptr(), n);
    return out;
}

template <class Dev>
at::Tensor hash_grid_backward(const at::Tensor& x, const at::Tensor& grad_out, int64_t n_rows, int64_t F,
                              const at::Tensor& offsets, const at::Tensor& resolution, const at::Tensor& scale,
                              const at::Tensor& hashed) {
    const auto m = kn_bind::hash_grid_meta(offsets, resolution, scale, hashed, x.size(1), n_rows);
    kn_bind::check_hash_backward(x, grad_out, m.n_levels, F);
    const typename Dev::Guard guard(x.device());
    auto grad_table = at::zeros({n_rows, F}, grad_out.options());  // scattered into (atomics on the GPU)
    Dev::hash_grid_backward((int)x.size(1), (int)F, dtype_code(x.scalar_type()), x.data_ptr(), grad_out.data_ptr(),
                            m, grad_table.data_ptr(), x.size(0));
    return grad_table;
}

template <class Dev>
at::Tensor sh_encode(const at::Tensor& dirs, int64_t degree) {
    kn_bind::check_sh(dirs, degree);
    const typename Dev::Guard guard(dirs.device());
    auto out = at::empty({dirs.size(0), degree * degree}, dirs.options());
    Dev::sh_encode(dtype_code(dirs.scalar_type()), dirs.data_ptr(), (int)degree, out.data_ptr(), dirs.size(0));
    return out;
}

template <class Dev>
T3 composite_forward(const at::Tensor& sigmas, const at::Tensor& rgbs, const at::Tensor& t0, const at::Tensor& t1,
                     const at::Tensor& offsets, double stop_T) {
    const typename Dev::Guard guard(sigmas.device());
    const auto st = kn_bind::check_composite(sigmas, rgbs, t0, t1, offsets);
    const int64_t n = offsets.numel() - 1;
    auto rgb = at::empty({n, 3}, sigmas.options());
    auto depth = at::empty({n}, sigmas.options());
    auto opacity = at::empty({n}, sigmas.options());
    Dev::composite_forward(dtype_code(st), offsets.data_ptr<int64_t>(), n, sigmas.data_ptr(), rgbs.data_ptr(),
                           t0.data_ptr(), t1.data_ptr(), stop_T, rgb.data_ptr(), depth.data_ptr(),
                           opacity.data_ptr());
    return {rgb, depth, opacity};
}

template <class Dev>
T2 composite_backward(const at::Tensor& sigmas, const at::Tensor& rgbs, const at::Tensor& t0, const at::Tensor& t1,
                      const at::Tensor& offsets, double stop_T, const at::Tensor& g_rgb, const at::Tensor& g_depth,
                      const at::Tensor& g_opacity) {
    const typename Dev::Guard guard(sigmas.device());
    const auto st = kn_bind::check_composite(sigmas, rgbs, t0, t1, offsets);
    const int64_t n = offsets.numel() - 1;
    kn_bind::check_composite_grads(sigmas, n, g_rgb, g_depth, g_opacity);
    // Zeroed: a sample no ray owns must not leak uninitialised memory into autograd.
    auto gs = at::zeros_like(sigmas);
    auto gc = at::zeros_like(rgbs);
    Dev::composite_backward(dtype_code(st), offsets.data_ptr<int64_t>(), n, sigmas.data_ptr(), rgbs.data_ptr(),
                            t0.data_ptr(), t1.data_ptr(), stop_T, g_rgb.data_ptr(), g_depth.data_ptr(),
                            g_opacity.data_ptr(), gs.data_ptr(), gc.data_ptr());
    return {gs, gc};
}

template <class Dev>
at::Tensor occ_bitfield(const at::Tensor& density, double thresh) {
    const int64_t res = kn_bind::check_density(density);
    const typename Dev::Guard guard(density.device());
    const int64_t C = density.size(0);
    const kn_bind::BitLayout b = kn_bind::bit_layout(res);
    auto bits = at::zeros({C, (int64_t)b.offset[b.n_mips]}, density.options().dtype(at::kByte));
    Dev::occ_bitfield(density.data_ptr<float>(), (float)thresh, (int)C, (uint32_t)res, b.n_mips, b.offset,
                      bits.data_ptr<uint8_t>());
    return bits;
}

template <class Dev>
at::Tensor occ_query(const at::Tensor& points, const at::Tensor& bits, int64_t res, at::ArrayRef<double> center,
                     at::ArrayRef<double> half) {
    kn_bind::check_points(points);
    const typename Dev::Guard guard(points.device());
    const kn::GridView g = kn_bind::grid_view(bits, res, center, half, points.device());
    auto out = at::empty({points.size(0)}, points.options().dtype(at::kBool));
    Dev::occ_query(points.data_ptr<float>(), points.size(0), g, out.data_ptr<bool>());
    return out;
}

template <class Dev>
T5 march_rays(const at::Tensor& rays_o, const at::Tensor& rays_d, const at::Tensor& near, const at::Tensor& far,
              const at::Tensor& jitter, at::ArrayRef<double> aabb, double step, double cone, double max_step,
              int64_t max_samples, const c10::optional<at::Tensor>& bits, int64_t res, at::ArrayRef<double> center,
              at::ArrayRef<double> half) {
    kn_bind::check_rays(rays_o, rays_d, near, far, jitter);
    const typename Dev::Guard guard(rays_o.device());
    const kn::MarchParams p = kn_bind::march_params(aabb, step, cone, max_step, max_samples, bits.has_value());
    kn::GridView g{};
    if (p.use_grid) g = kn_bind::grid_view(*bits, res, center, half, rays_o.device());
    return Dev::march_rays(rays_o, rays_d, near, far, jitter, p, g);
}

// The ops every device runs; the CPU-only ones (MLPs, rounds, row-sparse Adam) register themselves.
template <class Dev>
void impl_nerf(torch::Library& m) {
    m.impl("hash_grid_forward", &hash_grid_forward<Dev>);
    m.impl("hash_grid_backward", &hash_grid_backward<Dev>);
    m.impl("sh_encode", &sh_encode<Dev>);
    m.impl("composite_forward", &composite_forward<Dev>);
    m.impl("composite_backward", &composite_backward<Dev>);
    m.impl("occ_bitfield", &occ_bitfield<Dev>);
    m.impl("occ_query", &occ_query<Dev>);
    m.impl("march_rays", &march_rays<Dev>);
}

// ---- splat front ends ---------------------------------------------------------------------------

inline at::ScalarType check_splat_inputs(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                                         const at::Tensor& opac, int64_t H, int64_t W) {
    kn_bind::check_image(H, W);
    return kn_bind::check_splats(means, conics, colors, opac);
}

inline T3 alloc_splat_forward(int64_t H, int64_t W, const at::Tensor& like) {
    return {at::zeros({H, W, 3}, like.options()), at::ones({H, W}, like.options()),
            at::zeros({H, W}, like.options().dtype(at::kInt))};
}

template <class Dev>
T3 naive_forward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors, const at::Tensor& opac,
                 int64_t H, int64_t W, double a0, double a1, double st) {
    const auto dt = check_splat_inputs(means, conics, colors, opac, H, W);
    const typename Dev::Guard guard(means.device());
    auto out = alloc_splat_forward(H, W, means);
    Dev::splat_naive_forward(dtype_code(dt), (int)H, (int)W, means.size(0), means.data_ptr(), conics.data_ptr(),
                             colors.data_ptr(), opac.data_ptr(), a0, a1, st, std::get<0>(out).data_ptr(),
                             std::get<1>(out).data_ptr(), std::get<2>(out).data_ptr<int32_t>());
    return out;
}

template <class Dev>
at::Tensor naive_backward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opac, int64_t H, int64_t W, double a0, double a1, double st,
                          const at::Tensor& fT, const at::Tensor& fn, const at::Tensor& gr, const at::Tensor& gT) {
    const auto dt = check_splat_inputs(means, conics, colors, opac, H, W);
    const typename Dev::Guard guard(means.device());
    kn_bind::check_splat_backward(fT, fn, gr, gT, H, W, means, means.size(0));
    auto grads = at::zeros({means.size(0), kn::SPLAT_GRADS}, means.options());  // added into
    Dev::splat_naive_backward(dtype_code(dt), (int)H, (int)W, means.size(0), means.data_ptr(), conics.data_ptr(), colors.data_ptr(),
                              opac.data_ptr(), a0, a1, st, fT.data_ptr(), fn.data_ptr<int32_t>(), gr.data_ptr(),
                              gT.data_ptr(), grads.data_ptr());
    return grads;
}

template <class Dev>
T3 tiled_forward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors, const at::Tensor& opac,
                 int64_t H, int64_t W, const at::Tensor& off, const at::Tensor& ids, double a0, double a1, double st) {
    const auto dt = check_splat_inputs(means, conics, colors, opac, H, W);
    const typename Dev::Guard guard(means.device());
    kn_bind::check_tiles(off, ids, H, W, means.size(0), means.device());
    auto out = alloc_splat_forward(H, W, means);
    Dev::splat_tiled_forward(dtype_code(dt), (int)H, (int)W, means.size(0), off.data_ptr<int64_t>(), ids.data_ptr<int32_t>(),
                             means.data_ptr(), conics.data_ptr(), colors.data_ptr(), opac.data_ptr(), a0, a1, st,
                             std::get<0>(out).data_ptr(), std::get<1>(out).data_ptr(),
                             std::get<2>(out).data_ptr<int32_t>());
    return out;
}

template <class Dev>
at::Tensor tiled_backward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opac, int64_t H, int64_t W, const at::Tensor& off, const at::Tensor& ids,
                          double a0, double a1, double st, const at::Tensor& fT, const at::Tensor& fn,
                          const at::Tensor& gr, const at::Tensor& gT) {
    const auto dt = check_splat_inputs(means, conics, colors, opac, H, W);
    const typename Dev::Guard guard(means.device());
    kn_bind::check_tiles(off, ids, H, W, means.size(0), means.device());
    kn_bind::check_splat_backward(fT, fn, gr, gT, H, W, means, kn_bind::longest_tile(off));
    auto grads = at::zeros({means.size(0), kn::SPLAT_GRADS}, means.options());  // added into
    Dev::splat_tiled_backward(dtype_code(dt), (int)H, (int)W, means.size(0), off.data_ptr<int64_t>(), ids.data_ptr<int32_t>(),
                              means.data_ptr(), conics.data_ptr(), colors.data_ptr(), opac.data_ptr(), a0, a1, st,
                              fT.data_ptr(), fn.data_ptr<int32_t>(), gr.data_ptr(), gT.data_ptr(), grads.data_ptr());
    return grads;
}

template <class Dev>
void impl_splat(torch::Library& m) {
    m.impl("naive_forward", &naive_forward<Dev>);
    m.impl("naive_backward", &naive_backward<Dev>);
    m.impl("tiled_forward", &tiled_forward<Dev>);
    m.impl("tiled_backward", &tiled_backward<Dev>);
}

}  // namespace kn_ops
