// Argument checks and kernel meta shared by every torch binding (CPU and CUDA, NeRF and splat).
// A binding validates everything here before touching a pointer, so the CPU and CUDA modules
// refuse the same arguments with the same messages, and no kernel reads past a tensor it was
// given. Only torch headers: the CUDA bindings add their stream and guard on top.
#pragma once

#include <torch/extension.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <vector>

#include "hash_grid.h"
#include "marching.h"
#include "occupancy.h"
#include "splat.h"

namespace kn_bind {

// torch.set_num_threads() must govern our OpenMP loops too, whichever OpenMP runtime torch ships.
inline int n_threads() { return std::max(1, at::get_num_threads()); }

inline std::string shape_str(const at::Tensor& t) {
    std::ostringstream s;
    s << t.sizes();
    return s.str();
}

// t is a contiguous tensor on `dev` with dtype `st` and the given shape (-1: any size).
inline void expect(const at::Tensor& t, const char* op, const char* name, const at::Device& dev,
                   at::ScalarType st, std::initializer_list<int64_t> shape) {
    TORCH_CHECK_VALUE(t.defined(), op, ": ", name, " is missing");
    TORCH_CHECK_VALUE(t.device() == dev, op, ": ", name, " must be on ", dev, ", got ", t.device());
    TORCH_CHECK_VALUE(t.scalar_type() == st, op, ": ", name, " must be ", st, ", got ", t.scalar_type());
    bool ok = t.dim() == (int64_t)shape.size();
    int64_t d = 0;
    for (int64_t want : shape) {
        if (!ok) break;
        ok = want < 0 || t.size(d) == want;
        ++d;
    }
    if (!ok) {
        std::ostringstream w;
        w << "(";
        d = 0;
        for (int64_t want : shape) w << (d++ ? ", " : "") << (want < 0 ? std::string("*") : std::to_string(want));
        w << (shape.size() == 1 ? ",)" : ")");
        TORCH_CHECK_VALUE(false, op, ": ", name, " must have shape ", w.str(), ", got ", shape_str(t));
    }
    TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name, " must be contiguous");
}

// The floating dtype the kernels run in: float32 or float64, anything else (fp16, bf16) refused.
inline at::ScalarType float_dtype(const at::Tensor& t, const char* op, const char* name) {
    const auto st = t.scalar_type();
    TORCH_CHECK_VALUE(st == at::kFloat || st == at::kDouble, op, ": ", name,
                " must be float32 or float64, got ", st, " (cast before calling)");
    return st;
}

// Whether the checks that read a GPU tensor's values (offsets, index ranges) run: each is a host
// synchronisation, several a training step, so on a GPU they are a debug mode, NF_KERNEL_CHECKS=1
// in the environment (read once per process). On the CPU they always run: there they cost no wait.
inline bool device_checks() {
    static const bool on = [] {
        const char* v = std::getenv("NF_KERNEL_CHECKS");
        return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
    }();
    return on;
}

// Packed segments: offsets (n_segments + 1,) int64, 0 first, n_items last, non-decreasing. On a
// GPU only with device_checks(); without it a bad offset would send a kernel past the sample
// arrays, which Python's callers build from the same counts.
inline void check_offsets(const at::Tensor& offsets, int64_t n_items, const char* op, const char* name,
                          const at::Device& dev) {
    expect(offsets, op, name, dev, at::kLong, {-1});
    const int64_t n = offsets.numel();
    TORCH_CHECK_VALUE(n >= 1, op, ": ", name, " must hold at least one entry");
    bool ok;
    if (offsets.is_cpu()) {
        const int64_t* o = offsets.data_ptr<int64_t>();
        ok = o[0] == 0 && o[n - 1] == n_items;
        for (int64_t i = 1; ok && i < n; ++i) ok = o[i] >= o[i - 1];
    } else {
        if (!device_checks()) return;
        at::Tensor good = (offsets[0] == 0).logical_and(offsets[n - 1] == n_items);
        if (n > 1) good = good.logical_and((offsets.slice(0, 1) >= offsets.slice(0, 0, n - 1)).all());
        ok = good.item<bool>();
    }
    TORCH_CHECK_VALUE(ok, op, ": ", name, " must start at 0, end at ", n_items, " and never decrease");
}

// Every value of idx (int32 or int64) lies in [lo, hi]. On a GPU only with device_checks().
inline void check_range(const at::Tensor& idx, int64_t lo, int64_t hi, const char* op, const char* name) {
    if (idx.numel() == 0 || (!idx.is_cpu() && !device_checks())) return;
    const auto mm = at::aminmax(idx);
    const int64_t mn = std::get<0>(mm).item<int64_t>(), mx = std::get<1>(mm).item<int64_t>();
    TORCH_CHECK_VALUE(mn >= lo && mx <= hi, op, ": ", name, " values must lie in [", lo, ", ", hi, "], got [", mn,
                ", ", mx, "]");
}

// ---- hash grid --------------------------------------------------------------------------------

// Level layout from the CPU tensors kernels/hash_grid.py keeps (scales, resolution, offsets,
// hashed), validated so that no corner index can leave the table.
inline kn::HashGridMeta hash_grid_meta(const at::Tensor& offsets, const at::Tensor& resolution,
                                       const at::Tensor& scale, const at::Tensor& hashed, int64_t dims,
                                       int64_t table_rows) {
    const char* op = "hash grid";
    const int64_t L = resolution.numel();
    TORCH_CHECK_VALUE(L >= 1 && L <= kn::HASH_GRID_MAX_LEVELS, op, ": 1..", kn::HASH_GRID_MAX_LEVELS, " levels, got ", L);
    TORCH_CHECK_VALUE(offsets.numel() == L + 1 && scale.numel() == L && hashed.numel() == L, op,
                ": offsets (L + 1,), scale, resolution and hashed (L,) expected");
    auto o = offsets.cpu().to(at::kLong).contiguous();
    auto r = resolution.cpu().to(at::kLong).contiguous();
    auto s = scale.cpu().to(at::kFloat).contiguous();
    auto h = hashed.cpu().to(at::kBool).contiguous();
    const int64_t* op_ = o.data_ptr<int64_t>();
    TORCH_CHECK_VALUE(op_[0] == 0, op, ": offsets must start at 0");
    TORCH_CHECK_VALUE(op_[L] == table_rows, op, ": table has ", table_rows, " rows, offsets end at ", op_[L]);
    TORCH_CHECK_VALUE(table_rows <= (int64_t)std::numeric_limits<uint32_t>::max(), op, ": table too large");
    kn::HashGridMeta m{};
    m.n_levels = (int)L;
    m.hashed_mask = 0;
    for (int64_t l = 0; l < L; ++l) {
        const int64_t rows = op_[l + 1] - op_[l];
        const int64_t res = r.data_ptr<int64_t>()[l];
        const float sc = s.data_ptr<float>()[l];
        const bool is_hashed = h.data_ptr<bool>()[l];
        TORCH_CHECK_VALUE(rows >= 1, op, ": level ", l, " has no rows");
        TORCH_CHECK_VALUE(std::isfinite(sc) && sc >= 0.f && (int64_t)std::floor(sc + 0.5f) + 2 <= res, op, ": level ", l,
                    " scale ", sc, " does not fit resolution ", res);
        if (is_hashed) {
            TORCH_CHECK_VALUE((rows & (rows - 1)) == 0, op, ": hashed level ", l, " must hold 2^k rows, has ", rows);
        } else {
            double cells = 1;
            for (int64_t d = 0; d < dims; ++d) cells *= (double)res;
            TORCH_CHECK_VALUE(cells <= (double)rows, op, ": dense level ", l, " needs ", cells, " rows, has ", rows);
        }
        m.offset[l] = (uint32_t)op_[l];
        m.resolution[l] = (uint32_t)res;
        m.scale[l] = sc;
        if (is_hashed) m.hashed_mask |= (1u << l);
    }
    m.offset[L] = (uint32_t)op_[L];
    return m;
}

inline void check_grid_dims(int64_t D, int64_t F) {
    TORCH_CHECK_VALUE((D == 2 || D == 3) && (F == 1 || F == 2 || F == 4 || F == 8),
                "hash grid: unsupported n_input_dims=", D, " n_features_per_level=", F,
                " (supported: dims 2|3, features 1|2|4|8)");
}

// x (N, D) and table (rows, F) share a float dtype and device.
inline void check_hash_forward(const at::Tensor& x, const at::Tensor& table) {
    const auto st = float_dtype(x, "hash grid", "x");
    TORCH_CHECK_VALUE(x.dim() == 2 && table.dim() == 2, "hash grid: x (N, D) and table (rows, F) expected");
    check_grid_dims(x.size(1), table.size(1));
    expect(x, "hash grid", "x", x.device(), st, {-1, x.size(1)});
    expect(table, "hash grid", "table", x.device(), st, {-1, table.size(1)});
}

inline void check_hash_backward(const at::Tensor& x, const at::Tensor& grad_out, int64_t n_levels, int64_t F) {
    const auto st = float_dtype(x, "hash grid", "x");
    TORCH_CHECK_VALUE(x.dim() == 2, "hash grid: x must be (N, D)");
    check_grid_dims(x.size(1), F);
    expect(x, "hash grid", "x", x.device(), st, {-1, x.size(1)});
    expect(grad_out, "hash grid", "grad_out", x.device(), st, {x.size(0), n_levels * F});
}

// ---- SH -----------------------------------------------------------------------------------------

inline void check_sh(const at::Tensor& dirs, int64_t degree) {
    const auto st = float_dtype(dirs, "sh_encode", "dirs");
    expect(dirs, "sh_encode", "dirs", dirs.device(), st, {-1, 3});
    TORCH_CHECK_VALUE(degree >= 1 && degree <= 4, "sh_encode: degree must be 1..4, got ", degree);
}

// ---- compositing --------------------------------------------------------------------------------

// sigmas (S,), rgbs (S, 3), t_starts, t_ends (S,) in one float dtype; offsets (n_rays + 1,) valid.
inline at::ScalarType check_composite(const at::Tensor& sigmas, const at::Tensor& rgbs, const at::Tensor& t0,
                                      const at::Tensor& t1, const at::Tensor& offsets) {
    const char* op = "composite";
    const auto st = float_dtype(sigmas, op, "sigmas");
    const auto dev = sigmas.device();
    const int64_t s = sigmas.numel();
    expect(sigmas, op, "sigmas", dev, st, {s});
    expect(rgbs, op, "rgbs", dev, st, {s, 3});
    expect(t0, op, "t_starts", dev, st, {s});
    expect(t1, op, "t_ends", dev, st, {s});
    check_offsets(offsets, s, op, "ray offsets", dev);
    return st;
}

inline void check_composite_grads(const at::Tensor& sigmas, int64_t n_rays, const at::Tensor& g_rgb,
                                  const at::Tensor& g_depth, const at::Tensor& g_opacity) {
    const char* op = "composite backward";
    const auto st = sigmas.scalar_type();
    expect(g_rgb, op, "grad rgb", sigmas.device(), st, {n_rays, 3});
    expect(g_depth, op, "grad depth", sigmas.device(), st, {n_rays});
    expect(g_opacity, op, "grad opacity", sigmas.device(), st, {n_rays});
}

// ---- occupancy grid -----------------------------------------------------------------------------

constexpr int64_t OCC_MAX_CASCADES = 16;

struct BitLayout {
    int n_mips = 0;
    uint32_t offset[kn::OCC_MAX_MIPS + 1] = {};  // byte offsets of each mip inside one cascade
};

inline BitLayout bit_layout(int64_t res) {
    TORCH_CHECK_VALUE(res >= 2 && res <= 1024 && (res & (res - 1)) == 0,
                "occupancy grid: resolution must be a power of two in 2..1024, got ", res);
    BitLayout b;
    while ((res >> b.n_mips) >= 1) ++b.n_mips;
    for (int m = 0; m < b.n_mips; ++m)
        b.offset[m + 1] = b.offset[m] + std::max<uint32_t>(1, kn::mip_cells((uint32_t)res, m) / 8);
    return b;
}

// density (C, R^3) float32 -> R.
inline int64_t check_density(const at::Tensor& density) {
    const char* op = "occupancy grid";
    TORCH_CHECK_VALUE(density.dim() == 2, op, ": density must be (C, R^3), got ", shape_str(density));
    expect(density, op, "density", density.device(), at::kFloat, {-1, density.size(1)});
    TORCH_CHECK_VALUE(density.size(0) >= 1 && density.size(0) <= OCC_MAX_CASCADES, op, ": 1..", OCC_MAX_CASCADES,
                " cascades, got ", density.size(0));
    const int64_t cells = density.size(1);
    const int64_t res = (int64_t)std::llround(std::cbrt((double)cells));
    TORCH_CHECK_VALUE(res * res * res == cells, op, ": density rows must hold R^3 cells, got ", cells);
    bit_layout(res);
    return res;
}

// A view of bits (C, bytes per cascade) uint8 on `dev`, with the grid's centre and half extent.
inline kn::GridView grid_view(const at::Tensor& bits, int64_t res, at::ArrayRef<double> center,
                              at::ArrayRef<double> half, const at::Device& dev) {
    const char* op = "occupancy grid";
    const BitLayout b = bit_layout(res);
    expect(bits, op, "bitfield", dev, at::kByte, {-1, (int64_t)b.offset[b.n_mips]});
    TORCH_CHECK_VALUE(bits.size(0) >= 1 && bits.size(0) <= OCC_MAX_CASCADES, op, ": 1..", OCC_MAX_CASCADES,
                " cascades, got ", bits.size(0));
    TORCH_CHECK_VALUE(center.size() == 3 && half.size() == 3, op, ": center and half must have 3 numbers");
    kn::GridView g{};
    g.bits = bits.data_ptr<uint8_t>();
    g.n_cascades = (int)bits.size(0);
    g.res = (uint32_t)res;
    g.n_mips = b.n_mips;
    g.bytes_per_cascade = b.offset[b.n_mips];
    for (int m = 0; m < b.n_mips; ++m) g.mip_byte_offset[m] = b.offset[m];
    for (int k = 0; k < 3; ++k) {
        TORCH_CHECK_VALUE(std::isfinite(center[k]) && half[k] > 0 && std::isfinite(half[k]), op,
                    ": center must be finite and half extents positive");
        g.center[k] = (float)center[k];
        g.half[k] = (float)half[k];
    }
    return g;
}

inline void check_points(const at::Tensor& points) {
    expect(points, "occupancy query", "points", points.device(), at::kFloat, {-1, 3});
}

// ---- marching -----------------------------------------------------------------------------------

inline void check_rays(const at::Tensor& o, const at::Tensor& d, const at::Tensor& near, const at::Tensor& far,
                       const at::Tensor& jitter) {
    const char* op = "march_rays";
    const auto dev = o.device();
    const int64_t n = o.size(0);
    expect(o, op, "rays_o", dev, at::kFloat, {n, 3});
    expect(d, op, "rays_d", dev, at::kFloat, {n, 3});
    expect(near, op, "near", dev, at::kFloat, {n});
    expect(far, op, "far", dev, at::kFloat, {n});
    expect(jitter, op, "jitter", dev, at::kFloat, {n});
}

inline kn::MarchParams march_params(at::ArrayRef<double> aabb, double step, double cone, double max_step,
                                    int64_t max_samples, bool use_grid) {
    const char* op = "march_rays";
    TORCH_CHECK_VALUE(aabb.size() == 6, op, ": aabb has 6 numbers, got ", aabb.size());
    // A zero or NaN step would never advance t.
    TORCH_CHECK_VALUE(step > 0 && std::isfinite(step), op, ": render step must be finite and > 0, got ", step);
    TORCH_CHECK_VALUE(cone >= 0 && std::isfinite(cone), op, ": cone angle must be finite and >= 0, got ", cone);
    TORCH_CHECK_VALUE(max_step > 0, op, ": max step must be > 0, got ", max_step);
    TORCH_CHECK_VALUE(max_samples >= 1 && max_samples <= std::numeric_limits<int>::max(), op,
                ": max_samples must be >= 1, got ", max_samples);
    kn::MarchParams p{};
    for (int k = 0; k < 3; ++k) {
        p.aabb_min[k] = (float)aabb[k];
        p.aabb_max[k] = (float)aabb[k + 3];
    }
    p.step = (float)step;
    p.cone = (float)cone;
    p.max_step = (float)max_step;
    p.max_samples = (int)max_samples;
    p.use_grid = use_grid ? 1 : 0;
    return p;
}

// ---- splats -------------------------------------------------------------------------------------

// means2d (N, 2), conics (N, 3), colors (N, 3), opacities (N,) in one float dtype on one device.
inline at::ScalarType check_splats(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                                   const at::Tensor& opac) {
    const char* op = "splat";
    const auto st = float_dtype(means, op, "means2d");
    const auto dev = means.device();
    TORCH_CHECK_VALUE(means.dim() == 2, op, ": means2d must be (N, 2), got ", shape_str(means));
    const int64_t n = means.size(0);
    TORCH_CHECK_VALUE(n <= (int64_t)std::numeric_limits<int32_t>::max(), op, ": too many splats");
    expect(means, op, "means2d", dev, st, {n, 2});
    expect(conics, op, "conics", dev, st, {n, 3});
    expect(colors, op, "colors", dev, st, {n, 3});
    expect(opac, op, "opacities", dev, st, {n});
    return st;
}

inline void check_image(int64_t H, int64_t W) {
    TORCH_CHECK_VALUE(H >= 1 && W >= 1 && H * W <= (int64_t)std::numeric_limits<int32_t>::max(),
                "splat: image size must be positive and fit int32 pixels, got ", W, "x", H);
}

// tile_offsets (n_tiles + 1,) int64 over tile_ids (M,) int32, each id a splat index.
inline void check_tiles(const at::Tensor& off, const at::Tensor& ids, int64_t H, int64_t W, int64_t n_splats,
                        const at::Device& dev) {
    const char* op = "splat tiles";
    const int64_t n_tiles = (int64_t)kn::splat_tiles_x((int)W) * kn::splat_tiles_y((int)H);
    expect(off, op, "tile_offsets", dev, at::kLong, {n_tiles + 1});
    expect(ids, op, "tile_ids", dev, at::kInt, {-1});
    check_offsets(off, ids.numel(), op, "tile_offsets", dev);
    check_range(ids, 0, n_splats - 1, op, "tile_ids");
}

// The forward's saved buffers and the incoming gradients, sized to the image. n_contrib counts
// splats walked per pixel; it may not exceed the list the backward walks (all splats, or the
// longest tile list), or the backward would index past it.
inline void check_splat_backward(const at::Tensor& fT, const at::Tensor& fn, const at::Tensor& gr,
                                 const at::Tensor& gT, int64_t H, int64_t W, const at::Tensor& like,
                                 int64_t max_contrib) {
    const char* op = "splat backward";
    const auto st = like.scalar_type();
    const auto dev = like.device();
    expect(fT, op, "final_T", dev, st, {H, W});
    expect(fn, op, "n_contrib", dev, at::kInt, {H, W});
    expect(gr, op, "grad_rgb", dev, st, {H, W, 3});
    expect(gT, op, "grad_T", dev, st, {H, W});
    check_range(fn, 0, max_contrib, op, "n_contrib");
}

// Longest per-tile list (the most any pixel of the tiled compositor can walk), the bound of
// check_splat_backward's range check; that check is all it serves, so it reads a GPU tensor only
// where the check runs.
inline int64_t longest_tile(const at::Tensor& off) {
    if (off.numel() < 2 || (!off.is_cpu() && !device_checks())) return 0;
    return (off.slice(0, 1) - off.slice(0, 0, off.numel() - 1)).max().item<int64_t>();
}

// ---- fused NeRF MLPs ----------------------------------------------------------------------------

constexpr int64_t MLP_MAX_LAYERS = 16;  // kn_mlp::MAX_LAYERS

// One network as [W0, b0, W1, b1, ...] (nn.Linear layouts: W (out, in), b (out,)), float32 and
// contiguous on `dev`, chained from n_in inputs. Returns the last layer's width.
inline int64_t check_mlp_layers(at::TensorList p, int64_t n_in, const at::Device& dev,
                                const char* net) {
    const char* op = "nerf_mlp";
    const int64_t n = (int64_t)p.size();
    TORCH_CHECK_VALUE(n % 2 == 0 && n >= 2 && n <= 2 * MLP_MAX_LAYERS, op, ": the ", net, " network needs 1..",
                      MLP_MAX_LAYERS, " (weight, bias) pairs, got ", n, " tensors");
    int64_t width = n_in;
    for (int64_t l = 0; l < n; l += 2) {
        TORCH_CHECK_VALUE(p[l].defined() && p[l].dim() == 2, op, ": ", net, " layer ", l / 2,
                          " weight must be (out, in)");
        const int64_t out = p[l].size(0);
        TORCH_CHECK_VALUE(out >= 1, op, ": ", net, " layer ", l / 2, " has no outputs");
        expect(p[l], op, l == 0 ? "first weight" : "weight", dev, at::kFloat, {out, width});
        expect(p[l + 1], op, "bias", dev, at::kFloat, {out});
        width = out;
    }
    return width;
}

// enc (N, n_in) float32; density net n_in -> 1 + G; with sh (N, S): colour net S + G -> 3.
// ---- marching rounds (rounds.h) ----------------------------------------------------------------

inline void check_cull_round(const at::Tensor& offsets, const at::Tensor& alive, const at::Tensor& sigma,
                             const at::Tensor& t0, const at::Tensor& t1, const at::Tensor& tau,
                             const at::Tensor& near) {
    const char* op = "cull_round";
    const auto dev = sigma.device();
    expect(sigma, op, "sigma", dev, at::kFloat, {-1});
    const int64_t m = sigma.size(0);
    expect(t0, op, "t_starts", dev, at::kFloat, {m});
    expect(t1, op, "t_ends", dev, at::kFloat, {m});
    expect(alive, op, "alive", dev, at::kLong, {-1});
    expect(tau, op, "tau", dev, at::kDouble, {-1});
    expect(near, op, "near", dev, at::kFloat, {tau.size(0)});
    TORCH_CHECK_VALUE(offsets.numel() == alive.numel() + 1, op, ": offsets must hold len(alive) + 1 entries");
    check_offsets(offsets, m, op, "offsets", dev);
    check_range(alive, 0, tau.size(0) - 1, op, "alive");
}

inline void check_move_rows(const at::Tensor& dst, const at::Tensor& dest, const at::Tensor& src,
                            const at::Tensor& idx) {
    const char* op = "move_rows";
    const auto dev = src.device();
    TORCH_CHECK_VALUE(src.dim() == 1 || src.dim() == 2, op, ": src must be 1-D or 2-D, got ", shape_str(src));
    TORCH_CHECK_VALUE(dst.dim() == src.dim() && (src.dim() == 1 || dst.size(1) == src.size(1)), op,
                      ": dst must have src's row shape, got ", shape_str(dst), " and ", shape_str(src));
    TORCH_CHECK_VALUE(dst.scalar_type() == src.scalar_type(), op, ": dst and src must share a dtype");
    TORCH_CHECK_VALUE(dst.device() == dev && dst.is_contiguous() && src.is_contiguous(), op,
                      ": dst and src must be contiguous, on one device");
    expect(idx, op, "idx", dev, at::kLong, {-1});
    expect(dest, op, "dest", dev, at::kLong, {idx.size(0)});
    check_range(idx, 0, src.size(0) - 1, op, "idx");
    check_range(dest, 0, dst.size(0) - 1, op, "dest");
}

inline void check_nerf_mlp(const at::Tensor& enc, const c10::optional<at::Tensor>& sh,
                           at::TensorList density, at::TensorList color) {
    const char* op = "nerf_mlp";
    TORCH_CHECK_VALUE(enc.dim() == 2, op, ": enc must be (N, features), got ", shape_str(enc));
    const auto dev = enc.device();
    expect(enc, op, "enc", dev, at::kFloat, {-1, enc.size(1)});
    const int64_t geo = check_mlp_layers(density, enc.size(1), dev, "density") - 1;
    if (!sh.has_value()) {
        TORCH_CHECK_VALUE(color.empty(), op, ": a colour network needs sh");
        return;
    }
    TORCH_CHECK_VALUE(sh->dim() == 2, op, ": sh must be (N, coefficients), got ", shape_str(*sh));
    expect(*sh, op, "sh", dev, at::kFloat, {enc.size(0), sh->size(1)});
    const int64_t out = check_mlp_layers(color, sh->size(1) + geo, dev, "colour");
    TORCH_CHECK_VALUE(out == 3, op, ": the colour network must end in 3 outputs, got ", out);
}

inline void check_nerf_mlp_grads(const at::Tensor& enc, const c10::optional<at::Tensor>& sigma,
                                 const c10::optional<at::Tensor>& rgb, const c10::optional<at::Tensor>& grad_sigma,
                                 const c10::optional<at::Tensor>& grad_rgb) {
    const char* op = "nerf_mlp backward";
    if (sigma.has_value()) expect(*sigma, op, "sigma", enc.device(), at::kFloat, {enc.size(0)});
    if (rgb.has_value()) expect(*rgb, op, "rgb", enc.device(), at::kFloat, {enc.size(0), 3});
    if (grad_sigma.has_value()) expect(*grad_sigma, op, "grad_sigma", enc.device(), at::kFloat, {enc.size(0)});
    if (grad_rgb.has_value()) expect(*grad_rgb, op, "grad_rgb", enc.device(), at::kFloat, {enc.size(0), 3});
}

}  // namespace kn_bind
