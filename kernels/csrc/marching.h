// Ray marching through the occupancy grid, one ray per call. Run twice: once counting, once
// writing into the packed arrays at the ray's offset (same arithmetic, so the counts agree).
#pragma once

#include "common.h"
#include "occupancy.h"

namespace kn {

struct MarchParams {
    float aabb_min[3];
    float aabb_max[3];
    float step;       // render step size (the minimum step with a cone angle)
    float cone;       // 0: constant steps; >0: dt = clamp(t * cone, step, max_step)
    float max_step;
    int max_samples;
    int use_grid;
};

KN_HD float calc_dt(float t, const MarchParams& p) {
    if (p.cone > 0.f) return kn_min(kn_max(t * p.cone, p.step), p.max_step);
    return p.step;
}

// Slab test; divisions (not reciprocal multiplies) so the reference can reproduce it exactly.
KN_HD bool ray_aabb(const float* o, const float* d, const float* lo, const float* hi, float* t_near, float* t_far) {
    float tn = -INFINITY, tf = INFINITY;
    for (int k = 0; k < 3; ++k) {
        if (d[k] == 0.f) {
            if (o[k] < lo[k] || o[k] > hi[k]) return false;
            continue;
        }
        const float a = (lo[k] - o[k]) / d[k];
        const float b = (hi[k] - o[k]) / d[k];
        tn = kn_max(tn, kn_min(a, b));
        tf = kn_min(tf, kn_max(a, b));
    }
    *t_near = tn;
    *t_far = tf;
    return tn <= tf;
}

// Ray parameter where the ray leaves the mip-`mip` cell of `cascade` that contains ijk.
KN_HD float cell_exit(const GridView& g, int cascade, int mip, const uint32_t* ijk, const float* o, const float* d) {
    float te = INFINITY;
    for (int k = 0; k < 3; ++k) {
        if (d[k] == 0.f) continue;
        const float ext = ldexpf(g.half[k], cascade);
        const float size = ldexpf(2.f * ext / (float)g.res, mip);
        const float lo = (g.center[k] - ext) + (float)(ijk[k] >> mip) * size;
        const float bound = d[k] > 0.f ? lo + size : lo;
        te = kn_min(te, (bound - o[k]) / d[k]);
    }
    return te;
}

// Returns the number of samples; writes [t_start, t_end) pairs when t0 is non-null.
// Occupancy is tested at each interval's midpoint; an empty cell is skipped at the coarsest
// empty mip around it, advancing in whole steps so samples stay on the same lattice along the ray.
KN_HD int march_ray(const float* o, const float* d, float near, float far, float jitter, const MarchParams& p,
                    const GridView& g, float* t0, float* t1) {
    float tmin, tmax;
    if (!ray_aabb(o, d, p.aabb_min, p.aabb_max, &tmin, &tmax)) return 0;
    tmin = kn_max(tmin, near);
    tmax = kn_min(tmax, far);
    if (!(tmin < tmax)) return 0;
    float t = tmin + jitter * calc_dt(tmin, p);
    int n = 0;
    // Every pass advances t by at least one step, so a ray needs at most (tmax - tmin) / step of
    // them. The budget (with slack for rounding) caps the passes that emit nothing, outside every
    // cascade or where t + dt rounds back to t far from the origin; it never binds otherwise.
    const float span = (tmax - tmin) / p.step;
    long long budget = span < 1e9f ? (long long)(span * 1.0625f) + 16 : 1000000000LL;
    float t_last = -INFINITY;
    while (n < p.max_samples && --budget >= 0) {
        if (!(t > t_last)) break;  // t + dt rounded back to t: the ray would repeat this pass forever
        t_last = t;
        float dt = calc_dt(t, p);
        const float tm = t + 0.5f * dt;
        if (!(tm < tmax)) break;
        if (p.use_grid) {
            float pos[3];
            for (int k = 0; k < 3; ++k) pos[k] = o[k] + tm * d[k];
            int c;
            uint32_t ijk[3];
            if (!locate_cell(g, pos, &c, ijk)) {
                t += dt;
                continue;
            }
            if (!occupied_at(g, c, 0, ijk)) {
                int mip = 0;
                while (mip + 1 < g.n_mips && !occupied_at(g, c, mip + 1, ijk)) ++mip;
                const float te = cell_exit(g, c, mip, ijk, o, d);
                if (p.cone > 0.f) {
                    do {
                        t += dt;
                        dt = calc_dt(t, p);
                    } while (t + 0.5f * dt < te && t + 0.5f * dt < tmax && --budget >= 0);
                } else {
                    float k = ceilf((te - tm) / dt);
                    if (!(k >= 1.f)) k = 1.f;
                    t += k * dt;
                }
                continue;
            }
        }
        if (t0) {
            t0[n] = t;
            t1[n] = t + dt;
        }
        ++n;
        t += dt;
    }
    return n;
}

}  // namespace kn
