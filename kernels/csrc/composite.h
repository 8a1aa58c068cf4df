// Volume rendering over packed samples: samples of ray r are [start, end) in the flat arrays.
#pragma once

#include "common.h"

namespace kn {

// Sums w*rgb, w*t_mid and w along one ray. Transmittance comes from the accumulated optical depth
// (not a running product) so that it matches the reference's cumulative sum.
template <typename T>
KN_HD void composite_forward_ray(int64_t start, int64_t end, const T* sigma, const T* rgb, const T* t0,
                                 const T* t1, T stop_T, T* out_rgb, T* out_depth, T* out_opacity) {
    T acc = T(0), r = T(0), g = T(0), b = T(0), depth = T(0), opacity = T(0);
    for (int64_t i = start; i < end; ++i) {
        const T trans = kn_exp(-acc);
        if (trans < stop_T) break;  // early stop: later samples cannot change the pixel visibly
        const T dt = t1[i] - t0[i];
        const T tau = sigma[i] * dt;
        const T w = trans * -kn_expm1(-tau);
        r += w * rgb[3 * i + 0];
        g += w * rgb[3 * i + 1];
        b += w * rgb[3 * i + 2];
        depth += w * T(0.5) * (t0[i] + t1[i]);
        opacity += w;
        acc += tau;
    }
    out_rgb[0] = r;
    out_rgb[1] = g;
    out_rgb[2] = b;
    *out_depth = depth;
    *out_opacity = opacity;
}

// With v_i = g_rgb.rgb_i + g_depth*t_mid_i + g_opacity, the loss is sum_i w_i v_i and
// dL/dsigma_k = dt_k * (T_{k+1} v_k - sum_{i>k} w_i v_i), dL/drgb_k = w_k g_rgb.
// Samples after the early stop have zero weight and get zero gradient.
template <typename T>
KN_HD void composite_backward_ray(int64_t start, int64_t end, const T* sigma, const T* rgb, const T* t0,
                                  const T* t1, T stop_T, const T* g_rgb, T g_depth, T g_opacity,
                                  T* grad_sigma, T* grad_rgb) {
    T acc = T(0), total = T(0);
    int64_t stop = end;
    for (int64_t i = start; i < end; ++i) {
        const T trans = kn_exp(-acc);
        if (trans < stop_T) {
            stop = i;
            break;
        }
        const T tau = sigma[i] * (t1[i] - t0[i]);
        const T w = trans * -kn_expm1(-tau);
        const T v = g_rgb[0] * rgb[3 * i] + g_rgb[1] * rgb[3 * i + 1] + g_rgb[2] * rgb[3 * i + 2] +
                    g_depth * T(0.5) * (t0[i] + t1[i]) + g_opacity;
        total += w * v;
        acc += tau;
    }
    acc = T(0);
    T prefix = T(0);
    for (int64_t i = start; i < stop; ++i) {
        const T dt = t1[i] - t0[i];
        const T tau = sigma[i] * dt;
        const T trans = kn_exp(-acc);
        const T w = trans * -kn_expm1(-tau);
        const T v = g_rgb[0] * rgb[3 * i] + g_rgb[1] * rgb[3 * i + 1] + g_rgb[2] * rgb[3 * i + 2] +
                    g_depth * T(0.5) * (t0[i] + t1[i]) + g_opacity;
        prefix += w * v;
        acc += tau;
        grad_sigma[i] = dt * (kn_exp(-acc) * v - (total - prefix));
        grad_rgb[3 * i + 0] = w * g_rgb[0];
        grad_rgb[3 * i + 1] = w * g_rgb[1];
        grad_rgb[3 * i + 2] = w * g_rgb[2];
    }
    for (int64_t i = stop; i < end; ++i) {
        grad_sigma[i] = T(0);
        grad_rgb[3 * i + 0] = T(0);
        grad_rgb[3 * i + 1] = T(0);
        grad_rgb[3 * i + 2] = T(0);
    }
}

}  // namespace kn
