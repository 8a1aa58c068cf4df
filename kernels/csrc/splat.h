// Gaussian-splat compositing: per-pixel bodies shared by the CPU extension (splat_cpu.cpp) and
// the CUDA launchers (splat.cu). No torch headers.
//
// Splats arrive sorted near to far: means (N, 2) in pixels, conics (N, 3) = (A, B, C) of the
// inverse 2D covariance, colours (N, 3), opacities (N,). Pixel (x, y) has its centre at
// (x + 0.5, y + 0.5). Per splat: power = -0.5 (A dx^2 + C dy^2) - B dx dy,
// alpha = min(o exp(power), alpha_max), skipped when below alpha_min (seed 002), and a pixel stops
// right after the splat that takes its transmittance below stop_T.
#pragma once

#include "common.h"

namespace kn {

constexpr int SPLAT_TILE = 16;                     // tiles are SPLAT_TILE x SPLAT_TILE pixels
constexpr int SPLAT_BATCH = SPLAT_TILE * SPLAT_TILE;  // splats staged per batch (one per thread)
// du dv dA dB dC dr dg db do |du| |dv|, packed per splat; the last two sum each pixel's |dL/du|,
// |dL/dv| (gsplat's absgrad: densification on them does not cancel opposite pixels' pulls)
constexpr int SPLAT_GRADS = 11;

template <typename T>
struct SplatParams {
    T alpha_min, alpha_max, stop_T;
};

// One splat as staged in a batch (shared memory on the GPU, a stack array on the CPU).
template <typename T>
struct SplatRec {
    T u, v, A, B, C, r, g, b, o;
};

template <typename T>
KN_HD SplatRec<T> load_splat(int64_t i, const T* means, const T* conics, const T* colors, const T* opac) {
    SplatRec<T> s;
    s.u = means[2 * i];
    s.v = means[2 * i + 1];
    s.A = conics[3 * i];
    s.B = conics[3 * i + 1];
    s.C = conics[3 * i + 2];
    s.r = colors[3 * i];
    s.g = colors[3 * i + 1];
    s.b = colors[3 * i + 2];
    s.o = opac[i];
    return s;
}

// Raw o*exp(power) at pixel offset (dx, dy); -1 when the splat does not touch the pixel at all
// (power > 0 only happens for a conic that is not positive definite).
template <typename T>
KN_HD T splat_raw_alpha(const SplatRec<T>& s, T dx, T dy, T* gauss) {
    const T power = T(-0.5) * (s.A * dx * dx + s.C * dy * dy) - s.B * dx * dy;
    if (power > T(0)) return T(-1);
    *gauss = kn_exp(power);
    return s.o * *gauss;
}

template <typename T>
struct PixelFwd {
    T r, g, b, trans;
    int32_t n;     // splats walked: the list index after the last contributing splat
    bool done;
};

template <typename T>
KN_HD PixelFwd<T> pixel_fwd_init() {
    PixelFwd<T> p;
    p.r = p.g = p.b = T(0);
    p.trans = T(1);
    p.n = 0;
    p.done = false;
    return p;
}

// Composite list entry `idx` (splat s) into pixel p at centre (px, py).
template <typename T>
KN_HD void pixel_fwd_step(PixelFwd<T>& p, const SplatRec<T>& s, T px, T py, const SplatParams<T>& prm, int32_t idx) {
    T gauss;
    T alpha = splat_raw_alpha(s, px - s.u, py - s.v, &gauss);
    if (alpha < prm.alpha_min) return;
    alpha = kn_min(alpha, prm.alpha_max);
    const T w = alpha * p.trans;
    p.r += w * s.r;
    p.g += w * s.g;
    p.b += w * s.b;
    p.trans *= T(1) - alpha;
    p.n = idx + 1;
    if (p.trans < prm.stop_T) p.done = true;
}

// Backward state of one pixel, walked from its last contributing splat towards the first.
// With R the colour composited behind splat i (normalised to unit transmittance in front of it):
//   dL/dc_i = alpha_i T_i g,  dL/dalpha_i = T_i g.(c_i - R) - gT T_final / (1 - alpha_i),
// T_i recovered by division (alpha <= alpha_max < 1 keeps it finite).
template <typename T>
struct PixelBwd {
    T trans, t_final;
    T acc_r, acc_g, acc_b;
    T gr, gg, gb, gT;
};

template <typename T>
KN_HD PixelBwd<T> pixel_bwd_init(T t_final, const T* g_rgb, T g_trans) {
    PixelBwd<T> p;
    p.trans = t_final;
    p.t_final = t_final;
    p.acc_r = p.acc_g = p.acc_b = T(0);
    p.gr = g_rgb[0];
    p.gg = g_rgb[1];
    p.gb = g_rgb[2];
    p.gT = g_trans;
    return p;
}

// Fills out[SPLAT_GRADS] and returns true when splat s contributed to the pixel.
template <typename T>
KN_HD bool pixel_bwd_step(PixelBwd<T>& p, const SplatRec<T>& s, T px, T py, const SplatParams<T>& prm, T* out) {
    const T dx = px - s.u, dy = py - s.v;
    T gauss;
    T raw = splat_raw_alpha(s, dx, dy, &gauss);
    if (raw < prm.alpha_min) return false;
    const bool clamped = raw > prm.alpha_max;
    const T alpha = clamped ? prm.alpha_max : raw;
    const T one_m = T(1) - alpha;
    p.trans = p.trans / one_m;  // T_i, transmittance in front of this splat
    const T w = alpha * p.trans;
    out[5] = w * p.gr;
    out[6] = w * p.gg;
    out[7] = w * p.gb;
    const T g_alpha = p.trans * (p.gr * (s.r - p.acc_r) + p.gg * (s.g - p.acc_g) + p.gb * (s.b - p.acc_b)) -
                      p.gT * p.t_final / one_m;
    p.acc_r = alpha * s.r + one_m * p.acc_r;
    p.acc_g = alpha * s.g + one_m * p.acc_g;
    p.acc_b = alpha * s.b + one_m * p.acc_b;
    if (clamped) {  // min(., alpha_max) passes no gradient once it clamps
        out[0] = out[1] = out[2] = out[3] = out[4] = out[8] = out[9] = out[10] = T(0);
        return true;
    }
    out[8] = g_alpha * gauss;
    const T g_power = g_alpha * alpha;
    out[0] = g_power * (s.A * dx + s.B * dy);  // d power / d u = -d power / d dx
    out[1] = g_power * (s.C * dy + s.B * dx);
    out[9] = out[0] < T(0) ? -out[0] : out[0];
    out[10] = out[1] < T(0) ? -out[1] : out[1];
    out[2] = g_power * T(-0.5) * dx * dx;
    out[3] = g_power * -(dx * dy);
    out[4] = g_power * T(-0.5) * dy * dy;
    return true;
}

// ---------------------------------------------------------------------------------------------
// Whole-pixel drivers (naive: every pixel walks every splat, straight from global memory).

template <typename T>
KN_HD void naive_forward_pixel(int64_t pix, int W, int64_t n, const T* means, const T* conics, const T* colors,
                               const T* opac, const SplatParams<T>& prm, T* out_rgb, T* out_T, int32_t* out_n) {
    const T px = T(pix % W) + T(0.5), py = T(pix / W) + T(0.5);
    PixelFwd<T> p = pixel_fwd_init<T>();
    for (int64_t i = 0; i < n && !p.done; ++i)
        pixel_fwd_step(p, load_splat(i, means, conics, colors, opac), px, py, prm, (int32_t)i);
    out_rgb[3 * pix] = p.r;
    out_rgb[3 * pix + 1] = p.g;
    out_rgb[3 * pix + 2] = p.b;
    out_T[pix] = p.trans;
    out_n[pix] = p.n;
}

// add(ptr, value): a plain += into a per-thread buffer (the CPU loops; the CUDA kernel walks the
// splats in warp lockstep instead, see splat.cu).
template <typename T, typename Add>
KN_HD void naive_backward_pixel(int64_t pix, int W, const T* means, const T* conics, const T* colors, const T* opac,
                                const SplatParams<T>& prm, const T* fin_T, const int32_t* fin_n, const T* g_rgb,
                                const T* g_T, T* grads, Add add) {
    const T px = T(pix % W) + T(0.5), py = T(pix / W) + T(0.5);
    PixelBwd<T> p = pixel_bwd_init<T>(fin_T[pix], g_rgb + 3 * pix, g_T[pix]);
    T out[SPLAT_GRADS];
    for (int64_t i = (int64_t)fin_n[pix] - 1; i >= 0; --i) {
        if (!pixel_bwd_step(p, load_splat(i, means, conics, colors, opac), px, py, prm, out)) continue;
        for (int k = 0; k < SPLAT_GRADS; ++k) add(grads + SPLAT_GRADS * i + k, out[k]);
    }
}

// Tile geometry.
KN_HD int splat_tiles_x(int W) { return (W + SPLAT_TILE - 1) / SPLAT_TILE; }
KN_HD int splat_tiles_y(int H) { return (H + SPLAT_TILE - 1) / SPLAT_TILE; }

}  // namespace kn
