// CPU library of the NeRF ops: defines the `nf` schemas (ops.h) and registers the CPU kernels,
// OpenMP loops over the same __host__ __device__ bodies the CUDA launchers use, plus the ops only
// the CPU runs (fused MLPs, marching rounds, row-sparse Adam). One translation unit on purpose: CI
// builds it from scratch on two cores.
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "binding_checks.h"
#include "cpu_device.h"
#include "hash_adam_cpu.h"
#include "hash_grid_cpu.h"
#include "marching_cpu.h"
#include "composite.h"
#include "mlp_cpu.h"
#include "ops.h"
#include "rounds.h"
#include "sh.h"

namespace {

using kn_bind::n_threads;

template <typename Fn>
void dispatch_grid(int64_t D, int64_t F, at::ScalarType st, Fn&& fn) {
    // Fn is a generic lambda taking (std::integral_constant D, std::integral_constant F, T*).
#define KN_CASE_F(DD, FF)                                                                                \
    if (D == DD && F == FF) {                                                                            \
        if (st == at::kFloat) return fn(std::integral_constant<int, DD>{}, std::integral_constant<int, FF>{}, (float*)nullptr);  \
        if (st == at::kDouble) return fn(std::integral_constant<int, DD>{}, std::integral_constant<int, FF>{}, (double*)nullptr); \
    }
    KN_CASE_F(2, 1) KN_CASE_F(2, 2) KN_CASE_F(2, 4) KN_CASE_F(2, 8)
    KN_CASE_F(3, 1) KN_CASE_F(3, 2) KN_CASE_F(3, 4) KN_CASE_F(3, 8)
#undef KN_CASE_F
    TORCH_CHECK(false, "hash grid: unsupported n_input_dims=", D, " n_features_per_level=", F, " dtype=", st,
                " (supported: dims 2|3, features 1|2|4|8, float32|float64)");
}

template <typename Fn>
void dispatch_float(at::ScalarType st, const char* op, Fn&& fn) {
    if (st == at::kFloat) return fn((float*)nullptr);
    if (st == at::kDouble) return fn((double*)nullptr);
    TORCH_CHECK(false, op, ": unsupported dtype ", st, " (float32 or float64)");
}

// Accumulates into a persistent (rows, F) gradient and flags the touched rows (uint8 per row).
void hash_grid_backward_rows(at::Tensor x, at::Tensor grad_out, at::Tensor grad_table, at::Tensor touched,
                             at::Tensor offsets, at::Tensor resolution, at::Tensor scale, at::Tensor hashed) {
    const char* op = "hash grid backward";
    auto m = kn_bind::hash_grid_meta(offsets, resolution, scale, hashed, x.size(1), grad_table.size(0));
    const int64_t F = grad_table.size(1), rows = grad_table.size(0);
    kn_bind::check_hash_backward(x, grad_out, m.n_levels, F);
    kn_bind::expect(grad_table, op, "grad_table", x.device(), x.scalar_type(), {rows, F});
    kn_bind::expect(touched, op, "touched", x.device(), at::kByte, {rows});
    const int64_t n = x.size(0), D = x.size(1);
    dispatch_grid(D, F, x.scalar_type(), [&](auto Dc, auto Fc, auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        kn_cpu::hash_bwd_rows_impl<decltype(Dc)::value, decltype(Fc)::value, T>(
            x.data_ptr<T>(), grad_out.data_ptr<T>(), m, grad_table.data_ptr<T>(), touched.data_ptr<uint8_t>(), n,
            n_threads());
    });
}

// Row-sparse Adam over the rows flagged by hash_grid_backward_rows (which it clears).
void hash_grid_adam(at::Tensor w, at::Tensor grad, at::Tensor touched, at::Tensor m, at::Tensor v, at::Tensor steps,
                    at::Tensor bc1, at::Tensor bc2_sqrt, double lr, double b1, double b2, double eps) {
    const char* op = "hash grid adam";
    const auto st = kn_bind::float_dtype(w, op, "table");
    TORCH_CHECK_VALUE(w.dim() == 2, op, ": table must be (rows, F)");
    const int64_t rows = w.size(0), F = w.size(1);
    const auto cpu = w.device();
    kn_bind::expect(w, op, "table", cpu, st, {rows, F});
    kn_bind::expect(grad, op, "grad", cpu, st, {rows, F});
    kn_bind::expect(m, op, "exp_avg", cpu, st, {rows, F});
    kn_bind::expect(v, op, "exp_avg_sq", cpu, st, {rows, F});
    kn_bind::expect(touched, op, "touched", cpu, at::kByte, {rows});
    kn_bind::expect(steps, op, "steps", cpu, at::kInt, {rows});
    kn_bind::expect(bc1, op, "bc1", cpu, st, {-1});
    kn_bind::expect(bc2_sqrt, op, "bc2_sqrt", cpu, st, {bc1.numel()});
    // Every touched row's next count must index the bias tables; the kernel checks it per row
    // (a scan of all the counts here would cost as much as the update of the touched rows).
    dispatch_float(st, op, [&](auto* tag) {
        using T = std::remove_pointer_t<decltype(tag)>;
        auto run = [&](auto Fc) {
            const bool ok = kn_cpu::hash_adam<decltype(Fc)::value, T>(
                w.data_ptr<T>(), grad.data_ptr<T>(), touched.data_ptr<uint8_t>(), m.data_ptr<T>(), v.data_ptr<T>(),
                steps.data_ptr<int32_t>(), bc1.data_ptr<T>(), bc2_sqrt.data_ptr<T>(), bc1.numel(), rows, (T)lr,
                (T)b1, (T)b2, (T)eps, n_threads());
            TORCH_CHECK_VALUE(ok, op, ": a touched row's step count does not index the bias tables (",
                              bc1.numel(), " entries); those rows were left unchanged");
        };
        if (F == 1) return run(std::integral_constant<int, 1>{});
        if (F == 2) return run(std::integral_constant<int, 2>{});
        if (F == 4) return run(std::integral_constant<int, 4>{});
        if (F == 8) return run(std::integral_constant<int, 8>{});
        TORCH_CHECK_VALUE(false, op, ": features per row must be 1, 2, 4 or 8");
    });
}

template <typename T>
void sh_impl(const T* d, int degree, T* o, int64_t n) {
    const int k = degree * degree;
#pragma omp parallel for schedule(static) num_threads(n_threads())
    for (int64_t i = 0; i < n; ++i) kn::sh_encode_dir<T>(d + 3 * i, degree, o + k * i);
}

template <typename T>
void composite_fwd_impl(const int64_t* off, int64_t n_rays, const T* s, const T* c, const T* a, const T* b, T stop_T,
                        T* o_rgb, T* o_d, T* o_o) {
#pragma omp parallel for schedule(static) num_threads(n_threads())
    for (int64_t r = 0; r < n_rays; ++r)
        kn::composite_forward_ray<T>(off[r], off[r + 1], s, c, a, b, stop_T, o_rgb + 3 * r, o_d + r, o_o + r);
}

template <typename T>
void composite_bwd_impl(const int64_t* off, int64_t n_rays, const T* s, const T* c, const T* a, const T* b, T stop_T,
                        const T* gr, const T* gd, const T* go, T* gs, T* gc) {
#pragma omp parallel for schedule(static) num_threads(n_threads())
    for (int64_t r = 0; r < n_rays; ++r)
        kn::composite_backward_ray<T>(off[r], off[r + 1], s, c, a, b, stop_T, gr + 3 * r, gd[r], go[r], gs, gc);
}

// Start offsets of each ray's samples, validating that ray_indices is sorted and in range.
at::Tensor ray_offsets(at::Tensor ray_indices, int64_t n_rays) {
    kn_bind::expect(ray_indices, "ray_offsets", "ray_indices", at::Device(at::kCPU), at::kLong, {-1});
    TORCH_CHECK(n_rays >= 0, "ray_offsets: n_rays must be >= 0");
    const int64_t s = ray_indices.numel();
    const int64_t* ri = ray_indices.data_ptr<int64_t>();
    auto offsets = at::empty({n_rays + 1}, ray_indices.options());
    int64_t* off = offsets.data_ptr<int64_t>();
    int64_t r = 0;
    off[0] = 0;
    for (int64_t i = 0; i < s; ++i) {
        const int64_t v = ri[i];
        TORCH_CHECK_VALUE(v >= 0 && v < n_rays && (i == 0 || v >= ri[i - 1]),
                          "ray_indices must be sorted (samples packed per ray) and within [0, n_rays)");
        while (r < v) off[++r] = i;
    }
    while (r < n_rays) off[++r] = s;
    return offsets;
}

// ---- occupancy grid ---------------------------------------------------------------------------

// ---- the CPU device of ops.h: launchers over raw pointers, as kn_cuda's (launchers.h) -------------

struct Cpu : kn_ops::CpuDevice {
    static void hash_grid_forward(int D, int F, int dtype, const void* x, const void* table,
                                  const kn::HashGridMeta& m, void* out, int64_t n) {
        dispatch_grid(D, F, dtype ? at::kDouble : at::kFloat, [&](auto Dc, auto Fc, auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            kn_cpu::hash_fwd_impl<decltype(Dc)::value, decltype(Fc)::value, T>((const T*)x, (const T*)table, m,
                                                                               (T*)out, n, n_threads());
        });
    }

    static void hash_grid_backward(int D, int F, int dtype, const void* x, const void* grad_out,
                                   const kn::HashGridMeta& m, void* grad_table, int64_t n) {
        dispatch_grid(D, F, dtype ? at::kDouble : at::kFloat, [&](auto Dc, auto Fc, auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            kn_cpu::hash_bwd_impl<decltype(Dc)::value, decltype(Fc)::value, T>((const T*)x, (const T*)grad_out, m,
                                                                               (T*)grad_table, n, n_threads());
        });
    }

    static void sh_encode(int dtype, const void* dirs, int degree, void* out, int64_t n) {
        by_dtype(dtype, [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            sh_impl<T>((const T*)dirs, degree, (T*)out, n);
        });
    }

    static void composite_forward(int dtype, const int64_t* off, int64_t n_rays, const void* s, const void* c,
                                  const void* a, const void* b, double stop_T, void* rgb, void* depth,
                                  void* opacity) {
        by_dtype(dtype, [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            composite_fwd_impl<T>(off, n_rays, (const T*)s, (const T*)c, (const T*)a, (const T*)b, (T)stop_T,
                                  (T*)rgb, (T*)depth, (T*)opacity);
        });
    }

    static void composite_backward(int dtype, const int64_t* off, int64_t n_rays, const void* s, const void* c,
                                   const void* a, const void* b, double stop_T, const void* gr, const void* gd,
                                   const void* go, void* gs, void* gc) {
        by_dtype(dtype, [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            composite_bwd_impl<T>(off, n_rays, (const T*)s, (const T*)c, (const T*)a, (const T*)b, (T)stop_T,
                                  (const T*)gr, (const T*)gd, (const T*)go, (T*)gs, (T*)gc);
        });
    }

    static void occ_bitfield(const float* dens, float th, int C, uint32_t res, int n_mips, const uint32_t* offset,
                             uint8_t* out) {
        const uint32_t per = offset[n_mips];
        const int64_t cells = (int64_t)res * res * res;
        const int nt = n_threads();
        for (int64_t c = 0; c < C; ++c) {
            uint8_t* level0 = out + c * per;
            const uint8_t* finer = c > 0 ? out + (c - 1) * per : nullptr;
            const float* dc = dens + c * cells;
#pragma omp parallel for schedule(static) num_threads(nt)
            for (int64_t j = 0; j < cells / 8; ++j) {
                uint8_t v = kn::threshold_byte(dc, (uint32_t)j, th);
                // The finer cascade's occupancy, pooled, is ORed in so that a coarse mip never claims
                // emptiness that the finer cascade contradicts.
                if (finer) v |= kn::pooled_from_finer(finer, (uint32_t)j, res);
                level0[j] = v;
            }
            for (int m = 1; m < n_mips; ++m) {
                const uint8_t* src = out + c * per + offset[m - 1];
                uint8_t* dst = out + c * per + offset[m];
                const uint32_t n = kn::mip_cells(res, m);
                for (uint32_t j = 0; j < offset[m + 1] - offset[m]; ++j) dst[j] = kn::mip_byte(src, j, n);
            }
        }
    }

    static void occ_query(const float* p, int64_t n, const kn::GridView& g, bool* o) {
#pragma omp parallel for schedule(static) num_threads(n_threads())
        for (int64_t i = 0; i < n; ++i) {
            int c;
            uint32_t ijk[3];
            o[i] = kn::locate_cell(g, p + 3 * i, &c, ijk) && kn::occupied_at(g, c, 0, ijk);
        }
    }

    // One pass into per-block buffers when a ray's samples fit the scratch; else count, then fill.
    static kn_ops::T5 march_rays(const at::Tensor& rays_o, const at::Tensor& rays_d, const at::Tensor& near,
                                 const at::Tensor& far, const at::Tensor& jitter, const kn::MarchParams& p,
                                 const kn::GridView& g) {
        const int64_t n = rays_o.size(0);
        const float *o = rays_o.data_ptr<float>(), *d = rays_d.data_ptr<float>();
        const float *tn = near.data_ptr<float>(), *tf = far.data_ptr<float>(), *u = jitter.data_ptr<float>();
        auto counts = at::empty({n}, rays_o.options().dtype(at::kLong));
        int64_t* cnt = counts.data_ptr<int64_t>();
        const int nt = n_threads();
        const bool one_pass = kn_cpu::march_cap(p) <= kn_cpu::MARCH_MAX_SCRATCH;
        std::vector<kn_cpu::MarchBlock> blocks;
        if (one_pass) {
            blocks = kn_cpu::march_blocks(o, d, tn, tf, u, p, g, n, cnt, nt);
        } else {
#pragma omp parallel for schedule(dynamic, 64) num_threads(nt)
            for (int64_t i = 0; i < n; ++i)
                cnt[i] = kn::march_ray(o + 3 * i, d + 3 * i, tn[i], tf[i], u[i], p, g, nullptr, nullptr);
        }
        auto offsets = at::zeros({n + 1}, counts.options());
        int64_t* off = offsets.data_ptr<int64_t>();
        for (int64_t i = 0; i < n; ++i) off[i + 1] = off[i] + cnt[i];
        const int64_t total = off[n];
        auto t0 = at::empty({total}, rays_o.options());
        auto t1 = at::empty({total}, rays_o.options());
        auto ray_indices = at::empty({total}, counts.options());
        float *a = t0.data_ptr<float>(), *b = t1.data_ptr<float>();
        int64_t* ri = ray_indices.data_ptr<int64_t>();
        if (one_pass) {
            kn_cpu::pack_blocks(blocks, off, n, a, b, ri, nt);
        } else {
#pragma omp parallel for schedule(dynamic, 64) num_threads(nt)
            for (int64_t i = 0; i < n; ++i) {
                kn::march_ray(o + 3 * i, d + 3 * i, tn[i], tf[i], u[i], p, g, a + off[i], b + off[i]);
                for (int64_t k = off[i]; k < off[i + 1]; ++k) ri[k] = i;
            }
        }
        return {ray_indices, t0, t1, offsets, counts};
    }
};

// ---- fused NeRF MLPs ----------------------------------------------------------------------------

int mlp_isa_for(int64_t isa) {
    if (isa < 0) return kn_mlp::best_isa();
    TORCH_CHECK_VALUE(isa == kn_mlp::ISA_PORTABLE || isa == kn_mlp::ISA_AVX2 || isa == kn_mlp::ISA_AVX512 ||
                          isa == kn_mlp::ISA_AVX512_BF16,
                      "nerf_mlp: isa must be -1 (best float32), 0, 256, 512 or 1024 (bfloat16 products), got ",
                      isa);
    TORCH_CHECK_VALUE(kn_mlp::isa_supported((int)isa), "nerf_mlp: this CPU cannot run isa ", isa);
    return (int)isa;
}

// The field's layout from the checked tensors; wts keeps the transposed weights alive.
kn_mlp::Field mlp_field(const at::Tensor& enc, const c10::optional<at::Tensor>& sh, at::TensorList density,
                        at::TensorList color, double shift, std::vector<at::Tensor>& wts) {
    kn_bind::check_nerf_mlp(enc, sh, density, color);
    kn_mlp::Field f;
    f.n_in = enc.size(1);
    f.n_sh = sh.has_value() ? sh->size(1) : 0;
    f.n_geo = density[density.size() - 2].size(0) - 1;
    f.shift = (float)shift;
    int64_t off = 0;
    auto fill = [&](kn_mlp::Net& net, at::TensorList p) {
        net.n_layers = (int)(p.size() / 2);
        for (int l = 0; l < net.n_layers; ++l) {
            const at::Tensor& w = p[2 * l];
            wts.push_back(w.t().contiguous());
            kn_mlp::Layer& L = net.layer[l];
            L.out = w.size(0);
            L.in = w.size(1);
            L.w = w.data_ptr<float>();
            L.wt = wts.back().data_ptr<float>();
            L.b = p[2 * l + 1].data_ptr<float>();
            L.gw = off;
            off += L.out * L.in;
            L.gb = off;
            off += L.out;
        }
    };
    fill(f.density, density);
    fill(f.color, color);
    f.n_params = off;
    return f;
}

// sigma (N,) and rgb (N, 3) ((0, 3) without sh: an op's outputs are always tensors).
std::tuple<at::Tensor, at::Tensor> nerf_mlp_forward(const at::Tensor& enc, const c10::optional<at::Tensor>& sh,
                                                    at::TensorList density, at::TensorList color, double shift,
                                                    int64_t block, int64_t isa) {
    const int use = mlp_isa_for(isa);
    TORCH_CHECK_VALUE(block >= 0, "nerf_mlp: block must be >= 0 (0: automatic)");
    std::vector<at::Tensor> wts;
    const kn_mlp::Field f = mlp_field(enc, sh, density, color, shift, wts);
    const int64_t n = enc.size(0);
    auto sigma = at::empty({n}, enc.options());
    auto rgb = at::empty({f.has_color() ? n : 0, 3}, enc.options());
    kn_mlp::field_forward(use, f, enc.data_ptr<float>(), f.has_color() ? sh->data_ptr<float>() : nullptr, n,
                          sigma.data_ptr<float>(), f.has_color() ? rgb.data_ptr<float>() : nullptr, block,
                          n_threads());
    return {sigma, rgb};
}

// grad_enc (or (0,)), grad_sh (or (0,)), then one gradient per parameter (density's then colour's,
// in the order given) when need_params. sigma and rgb: what the forward returned for these inputs
// (saves recomputing them), or None.
std::vector<at::Tensor> nerf_mlp_backward(const at::Tensor& enc, const c10::optional<at::Tensor>& sh,
                                          at::TensorList density, at::TensorList color, double shift,
                                          const c10::optional<at::Tensor>& sigma, const c10::optional<at::Tensor>& rgb,
                                          const c10::optional<at::Tensor>& grad_sigma,
                                          const c10::optional<at::Tensor>& grad_rgb, bool need_enc, bool need_sh,
                                          bool need_params, int64_t block, int64_t isa) {
    const int use = mlp_isa_for(isa);
    TORCH_CHECK_VALUE(block >= 0, "nerf_mlp: block must be >= 0 (0: automatic)");
    std::vector<at::Tensor> wts;
    const kn_mlp::Field f = mlp_field(enc, sh, density, color, shift, wts);
    kn_bind::check_nerf_mlp_grads(enc, sigma, rgb, grad_sigma, grad_rgb);
    TORCH_CHECK_VALUE(!need_sh || f.has_color(), "nerf_mlp backward: no sh to take the gradient of");
    const int64_t n = enc.size(0);
    auto g_enc = at::empty({need_enc ? n * f.n_in : 0}, enc.options());
    auto g_sh = at::empty({need_sh ? n * f.n_sh : 0}, enc.options());
    at::Tensor flat;
    if (need_params) flat = at::empty({f.n_params}, enc.options());
    kn_mlp::Grads gr{grad_sigma.has_value() ? grad_sigma->data_ptr<float>() : nullptr,
                     grad_rgb.has_value() && f.has_color() ? grad_rgb->data_ptr<float>() : nullptr,
                     need_enc ? g_enc.data_ptr<float>() : nullptr, need_sh ? g_sh.data_ptr<float>() : nullptr,
                     sigma.has_value() ? sigma->data_ptr<float>() : nullptr,
                     rgb.has_value() && f.has_color() ? rgb->data_ptr<float>() : nullptr};
    kn_mlp::field_backward(use, f, enc.data_ptr<float>(), f.has_color() ? sh->data_ptr<float>() : nullptr, n, gr,
                           need_params ? flat.data_ptr<float>() : nullptr, block, n_threads());
    std::vector<at::Tensor> out{need_enc ? g_enc.view({n, f.n_in}) : g_enc, need_sh ? g_sh.view({n, f.n_sh}) : g_sh};
    if (need_params) {
        int64_t off = 0;
        for (const auto* p : {&density, &color})
            for (const at::Tensor& t : *p) {
                out.push_back(flat.narrow(0, off, t.numel()).view(t.sizes()).clone());
                off += t.numel();
            }
    }
    return out;
}

// One marching round's culling: keep (m,) bool per sample, go (A,) bool per live ray (it filled
// the round and still sees through). tau (n,) float64 and near (n,) float32 are updated in place.
std::tuple<at::Tensor, at::Tensor> cull_round(at::Tensor offsets, at::Tensor alive, at::Tensor sigma, at::Tensor t0,
                                   at::Tensor t1, at::Tensor tau, at::Tensor near, int64_t cap, double tau_max,
                                   double alpha_min) {
    kn_bind::check_cull_round(offsets, alive, sigma, t0, t1, tau, near);
    const int64_t A = alive.size(0), m = sigma.size(0);
    auto keep = at::empty({m}, sigma.options().dtype(at::kBool));
    auto go = at::empty({A}, sigma.options().dtype(at::kBool));
    const int64_t* off = offsets.data_ptr<int64_t>();
    const int64_t* al = alive.data_ptr<int64_t>();
    const float *sg = sigma.data_ptr<float>(), *a0 = t0.data_ptr<float>(), *a1 = t1.data_ptr<float>();
    double* tp = tau.data_ptr<double>();
    float* np = near.data_ptr<float>();
    bool *kp = keep.data_ptr<bool>(), *gp = go.data_ptr<bool>();
#pragma omp parallel for schedule(static) num_threads(n_threads())
    for (int64_t a = 0; a < A; ++a) {
        const int64_t r = al[a], s0 = off[a], s1 = off[a + 1];
        kn::cull_ray(sg, a0, a1, s0, s1, tau_max, alpha_min, tp + r, kp);
        if (s1 > s0) np[r] = a1[s1 - 1];
        gp[a] = s1 - s0 == cap && tp[r] <= tau_max;
    }
    return {keep, go};
}

// dst[dest[j]] = src[idx[j]] (rows), one pass instead of index_select then index_copy_.
void move_rows(at::Tensor dst, at::Tensor dest, at::Tensor src, at::Tensor idx) {
    kn_bind::check_move_rows(dst, dest, src, idx);
    const int64_t k = idx.size(0);
    const int64_t w = src.dim() == 2 ? src.size(1) : 1;
    const size_t bytes = (size_t)w * src.element_size();
    const int64_t *dp = dest.data_ptr<int64_t>(), *ip = idx.data_ptr<int64_t>();
    char* out = (char*)dst.data_ptr();
    const char* in = (const char*)src.data_ptr();
#pragma omp parallel for schedule(static) num_threads(k > 4096 ? n_threads() : 1)
    for (int64_t j = 0; j < k; ++j) std::memcpy(out + dp[j] * bytes, in + ip[j] * bytes, bytes);
}

}  // namespace

TORCH_LIBRARY(nf, m) { kn_ops::define_nerf(m); }

TORCH_LIBRARY_IMPL(nf, CPU, m) {
    kn_ops::impl_nerf<Cpu>(m);
    m.impl("hash_grid_backward_rows", &hash_grid_backward_rows);
    m.impl("hash_grid_adam", &hash_grid_adam);
    m.impl("ray_offsets", &ray_offsets);
    m.impl("cull_round", &cull_round);
    m.impl("move_rows", &move_rows);
    m.impl("nerf_mlp_forward", &nerf_mlp_forward);
    m.impl("nerf_mlp_backward", &nerf_mlp_backward);
}

// No tensor arguments, so no device to dispatch on: what this CPU's MLP tiles can run.
TORCH_LIBRARY_IMPL(nf, CompositeExplicitAutograd, m) {
    m.impl("mlp_isa", []() { return (int64_t)kn_mlp::best_isa(); });
    m.impl("mlp_bf16_supported", []() { return kn_mlp::isa_supported(kn_mlp::ISA_AVX512_BF16); });
}
