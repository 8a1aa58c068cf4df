// Bookkeeping of marching in rounds (worker/nerf/rendering.py): per-ray transmittance culling of a
// round's samples, and moving rows into the packed order. Host bodies only for now: on CUDA the
// pure-torch reference runs, as fast there as a kernel would be for work this light.
#pragma once

#include <cstdint>
#include <cmath>

namespace kn {

// Culls one ray's samples [s0, s1) of a round (nerfacc's visibility test, continued across
// rounds). `tau` holds the ray's optical depth before them and is advanced past them; a sample is
// kept while the depth before it is at most tau_max (transmittance >= exp(-tau_max)) and, when
// alpha_min > 0, its own alpha is at least alpha_min. Each sample's depth is sigma * dt rounded to
// float first, as the reference computes it. Returns the samples kept.
inline int64_t cull_ray(const float* sigma, const float* t0, const float* t1, int64_t s0, int64_t s1,
                        double tau_max, double alpha_min, double* tau, bool* keep) {
    double acc = *tau;
    int64_t n = 0;
    for (int64_t j = s0; j < s1; ++j) {
        const double dt = (double)(sigma[j] * (t1[j] - t0[j]));
        bool k = acc <= tau_max;
        if (alpha_min > 0) k = k && (1.0 - std::exp(-dt)) >= alpha_min;
        keep[j] = k;
        n += k;
        acc += dt;
    }
    *tau = acc;
    return n;
}

}  // namespace kn
