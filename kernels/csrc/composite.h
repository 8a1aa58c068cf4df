// Volume rendering over packed samples: samples of ray r are [start, end) in the flat arrays.
#pragma once

#include "common.h"

namespace kn {

// alpha = 1 - exp(-tau) without cancellation for tiny tau (early training has sigma*dt ~ 1e-4,
// where 1 - expf() would be off by 1e-3 relative); one transcendental at most per sample.
template <typename T>
KN_HD T alpha_of(T tau) {
    if (tau < T(0.01)) return tau * (T(1) - tau * (T(0.5) - tau * (T(1.0 / 6.0) - tau * T(1.0 / 24.0))));
    return T(1) - kn_exp(-tau);
}

// Sums w*rgb, w*t_mid and w along one ray, stopping once transmittance drops below stop_T.
template <typename T>
KN_HD void composite_forward_ray(int64_t start, int64_t end, const T* sigma, const T* rgb, const T* t0,
                                 const T* t1, T stop_T, T* out_rgb, T* out_depth, T* out_opacity) {
    T trans = T(1), r = T(0), g = T(0), b = T(0), depth = T(0), opacity = T(0);
    for (int64_t i = start; i < end; ++i) {
        if (trans < stop_T) break;  // early stop: later samples cannot change the pixel visibly
        const T alpha = alpha_of(sigma[i] * (t1[i] - t0[i]));
        const T w = trans * alpha;
        r += w * rgb[3 * i + 0];
        g += w * rgb[3 * i + 1];
        b += w * rgb[3 * i + 2];
        depth += w * T(0.5) * (t0[i] + t1[i]);
        opacity += w;
        trans *= T(1) - alpha;
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
    T trans = T(1), total = T(0);
    int64_t stop = end;
    for (int64_t i = start; i < end; ++i) {
        if (trans < stop_T) {
            stop = i;
            break;
        }
        const T alpha = alpha_of(sigma[i] * (t1[i] - t0[i]));
        const T v = g_rgb[0] * rgb[3 * i] + g_rgb[1] * rgb[3 * i + 1] + g_rgb[2] * rgb[3 * i + 2] +
                    g_depth * T(0.5) * (t0[i] + t1[i]) + g_opacity;
        total += trans * alpha * v;
        trans *= T(1) - alpha;
    }
    trans = T(1);
    T prefix = T(0);
    for (int64_t i = start; i < stop; ++i) {
        const T dt = t1[i] - t0[i];
        const T alpha = alpha_of(sigma[i] * dt);
        const T w = trans * alpha;
        const T v = g_rgb[0] * rgb[3 * i] + g_rgb[1] * rgb[3 * i + 1] + g_rgb[2] * rgb[3 * i + 2] +
                    g_depth * T(0.5) * (t0[i] + t1[i]) + g_opacity;
        prefix += w * v;
        trans *= T(1) - alpha;
        grad_sigma[i] = dt * (trans * v - (total - prefix));
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
