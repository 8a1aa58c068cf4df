// Multi-resolution hash encoding (instant-ngp / tiny-cuda-nn layout).
// One table holds every level: rows [offset[l], offset[l+1]) belong to level l, F features per row.
// Levels whose grid fits in the table are indexed densely, the others through the spatial hash.
#pragma once

#include "common.h"

namespace kn {

constexpr int HASH_GRID_MAX_LEVELS = 32;

// Passed by value so a CUDA kernel gets it in constant parameter space without extra copies.
struct HashGridMeta {
    int n_levels;
    uint32_t offset[HASH_GRID_MAX_LEVELS + 1];
    uint32_t resolution[HASH_GRID_MAX_LEVELS];
    float scale[HASH_GRID_MAX_LEVELS];
    uint32_t hashed_mask;  // bit l set: level l uses the spatial hash
};

// Primes from the instant-ngp paper; the first is 1 so that x stays coherent in memory.
KN_HD uint32_t grid_hash(const uint32_t* g, int d) {
    uint32_t h = g[0];
    if (d > 1) h ^= g[1] * 2654435761u;
    if (d > 2) h ^= g[2] * 805459861u;
    return h;
}

// Row indices (relative to the level) and interpolation weights of the 2^D corners around x.
template <int D, typename T>
KN_HD void hash_grid_corners(const T* x, const HashGridMeta& m, int level, uint32_t* idx, T* w) {
    const T scale = (T)m.scale[level];
    const uint32_t res = m.resolution[level];
    const uint32_t size = m.offset[level + 1] - m.offset[level];
    const bool hashed = (m.hashed_mask >> level) & 1u;
    uint32_t base[D];
    T frac[D];
    for (int d = 0; d < D; ++d) {
        // floor, not round: rounding would make some interpolation weights negative.
        const T pos = clamp01(x[d]) * scale + T(0.5);
        const T fl = kn_floor(pos);
        base[d] = (uint32_t)fl;
        frac[d] = pos - fl;
    }
    for (int c = 0; c < (1 << D); ++c) {
        uint32_t g[D];
        T weight = T(1);
        for (int d = 0; d < D; ++d) {
            const bool hi = (c >> d) & 1;
            g[d] = base[d] + (hi ? 1u : 0u);
            weight *= hi ? frac[d] : T(1) - frac[d];
        }
        uint32_t i;
        if (hashed) {
            i = grid_hash(g, D) & (size - 1u);  // hashed levels hold exactly 2^k rows
        } else {
            i = g[0];
            uint32_t stride = res;
            for (int d = 1; d < D; ++d) {
                i += g[d] * stride;
                stride *= res;
            }
        }
        idx[c] = i;
        w[c] = weight;
    }
}

// Encodes one point at one level: out[f] for the level's F features.
template <int D, int F, typename T>
KN_HD void hash_grid_forward_point_level(const T* x, const T* table, const HashGridMeta& m, int l, T* out) {
    {
        uint32_t idx[1 << D];
        T w[1 << D];
        hash_grid_corners<D, T>(x, m, l, idx, w);
        T acc[F];
        for (int f = 0; f < F; ++f) acc[f] = T(0);
        const T* level_table = table + (size_t)m.offset[l] * F;
        for (int c = 0; c < (1 << D); ++c) {
            const T* row = level_table + (size_t)idx[c] * F;
            for (int f = 0; f < F; ++f) acc[f] += w[c] * row[f];
        }
        for (int f = 0; f < F; ++f) out[f] = acc[f];
    }
}

// Scatters one point's output gradient of one level into the table gradient.
// `Add` is a plain add on the CPU (each thread owns whole levels, so no two threads touch one row)
// and atomicAdd on the GPU.
template <int D, int F, typename T, typename Add>
KN_HD void hash_grid_backward_point_level(const T* x, const T* grad_out_level, const HashGridMeta& m,
                                          int l, T* grad_table, Add add) {
    uint32_t idx[1 << D];
    T w[1 << D];
    hash_grid_corners<D, T>(x, m, l, idx, w);
    T* level_grad = grad_table + (size_t)m.offset[l] * F;
    for (int c = 0; c < (1 << D); ++c) {
        T* row = level_grad + (size_t)idx[c] * F;
        for (int f = 0; f < F; ++f) add(row + f, w[c] * grad_out_level[f]);
    }
}

// One Adam update of a table row that received a gradient (tiny-cuda-nn's Adam: hash entries with
// a zero gradient are skipped and keep their own step count for bias correction). The update
// itself is torch.optim.Adam's: w -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps), with
// bc1 = 1 - b1^t and bc2 = 1 - b2^t looked up for the row's step t by the caller.
template <int F, typename T>
KN_HD void adam_row(T* w, const T* g, T* m, T* v, T bc1, T bc2_sqrt, T lr, T b1, T b2, T eps) {
    for (int f = 0; f < F; ++f) {
        m[f] = b1 * m[f] + (T(1) - b1) * g[f];
        v[f] = b2 * v[f] + (T(1) - b2) * g[f] * g[f];
        const T denom = kn_sqrt(v[f]) / bc2_sqrt + eps;
        w[f] -= (lr / bc1) * m[f] / denom;
    }
}

}  // namespace kn
