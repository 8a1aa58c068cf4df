// CPU loops of the hash grid over the shared bodies of hash_grid.h.
//
// Forward: blocks of points, each thread encoding whole blocks level by level, so a block's inputs
// and outputs stay in L1/L2 while the level's table slice is walked. Fine levels are tables the
// L2 cannot hold and a point's corner rows are only known after hashing, so the hardware
// prefetchers cannot help: both directions hash a group of points ahead and prefetch its rows
// (an AVX2 gather body was no faster than this once the gathers were prefetched).
// Backward: each thread owns whole levels and walks the points in order, so the table gradient
// is the same bit for bit whatever the thread count, without atomics. `hash_bwd_rows_impl` adds
// into a persistent gradient and flags the rows it touched, and `hash_adam_impl` updates only
// those rows and clears them again: no dense zero-fill and no dense optimiser pass per step.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "hash_grid.h"

namespace kn_cpu {

// Points per block: 8 KiB of outputs at 32 features.
constexpr int64_t HASH_BLOCK = 64;
// Points whose corner rows are prefetched ahead of their use (see hash_bwd_rows_impl).
constexpr int PREFETCH_GROUP = 16;

inline void prefetch_write(const void* p) {
#if defined(__GNUC__)
    __builtin_prefetch(p, 1, 3);
#endif
}

inline void prefetch_read(const void* p) {
#if defined(__GNUC__)
    __builtin_prefetch(p, 0, 3);
#endif
}


// A block level by level: each group's corners are hashed and their rows prefetched one group
// ahead of the gathers, which then run in the scalar body's order (same bits).
template <int D, int F, typename T>
void hash_fwd_block_prefetch(const T* x, const T* table, const kn::HashGridMeta& m, T* out, int64_t i0,
                             int64_t i1) {
    const int64_t stride = (int64_t)m.n_levels * F;
    constexpr int C = 1 << D;
    uint32_t idx[2][PREFETCH_GROUP][C];
    T w[2][PREFETCH_GROUP][C];
    for (int l = 0; l < m.n_levels; ++l) {
        const T* level_table = table + (size_t)m.offset[l] * F;
        auto stage = [&](int buf, int64_t g0) {
            const int64_t g1 = std::min(i1, g0 + PREFETCH_GROUP);
            for (int64_t i = g0; i < g1; ++i) {
                const int k = (int)(i - g0);
                kn::hash_grid_corners<D, T>(x + i * D, m, l, idx[buf][k], w[buf][k]);
                for (int c = 0; c < C; ++c) prefetch_read(level_table + (size_t)idx[buf][k][c] * F);
            }
        };
        stage(0, i0);
        for (int64_t g0 = i0, b = 0; g0 < i1; g0 += PREFETCH_GROUP, b ^= 1) {
            if (g0 + PREFETCH_GROUP < i1) stage((int)(b ^ 1), g0 + PREFETCH_GROUP);
            const int64_t g1 = std::min(i1, g0 + PREFETCH_GROUP);
            for (int64_t i = g0; i < g1; ++i) {
                const int k = (int)(i - g0);
                T acc[F];
                for (int f = 0; f < F; ++f) acc[f] = T(0);
                for (int c = 0; c < C; ++c) {
                    const T* row = level_table + (size_t)idx[b][k][c] * F;
                    for (int f = 0; f < F; ++f) acc[f] += w[b][k][c] * row[f];
                }
                for (int f = 0; f < F; ++f) out[i * stride + l * F + f] = acc[f];
            }
        }
    }
}


template <int D, int F, typename T>
void hash_fwd_impl(const T* x, const T* table, const kn::HashGridMeta& m, T* out, int64_t n, int n_threads) {
    const int64_t n_blocks = (n + HASH_BLOCK - 1) / HASH_BLOCK;
#pragma omp parallel for schedule(static) num_threads(n_threads)
    for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t i0 = b * HASH_BLOCK, i1 = std::min(n, i0 + HASH_BLOCK);
        hash_fwd_block_prefetch<D, F, T>(x, table, m, out, i0, i1);
    }
}

template <int D, int F, typename T>
void hash_bwd_impl(const T* x, const T* grad_out, const kn::HashGridMeta& m, T* grad_table, int64_t n,
                   int n_threads) {
    const int64_t stride = (int64_t)m.n_levels * F;
    auto add = [](T* p, T v) { *p += v; };
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
    for (int l = 0; l < m.n_levels; ++l)
        for (int64_t i = 0; i < n; ++i)
            kn::hash_grid_backward_point_level<D, F, T>(x + i * D, grad_out + i * stride + l * F, m, l, grad_table,
                                                        add);
}

// Adds the table gradient into `grad_table` (kept between steps) and sets touched[row] = 1.
// Points whose output gradient is zero at a level (samples the loss never reached) are skipped.
// Fine levels are 4 MB tables the L2 cannot hold, and the corner rows of one point are only known
// after hashing, so the hardware prefetchers never help: each group's corners are hashed and their
// rows prefetched one group ahead of the adds (the adds keep their order: same bits).
template <int D, int F, typename T>
void hash_bwd_rows_impl(const T* x, const T* grad_out, const kn::HashGridMeta& m, T* grad_table, uint8_t* touched,
                        int64_t n, int n_threads) {
    const int64_t stride = (int64_t)m.n_levels * F;
    constexpr int C = 1 << D;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
    for (int l = 0; l < m.n_levels; ++l) {
        T* level_grad = grad_table + (size_t)m.offset[l] * F;
        uint8_t* level_touched = touched + m.offset[l];
        uint32_t idx[2][PREFETCH_GROUP][C];
        T w[2][PREFETCH_GROUP][C];
        bool live[2][PREFETCH_GROUP];
        auto stage = [&](int buf, int64_t g0) {
            const int64_t g1 = std::min(n, g0 + PREFETCH_GROUP);
            for (int64_t i = g0; i < g1; ++i) {
                const T* g = grad_out + i * stride + l * F;
                bool any = false;
                for (int f = 0; f < F; ++f) any |= g[f] != T(0);
                const int k = (int)(i - g0);
                live[buf][k] = any;
                if (!any) continue;
                kn::hash_grid_corners<D, T>(x + i * D, m, l, idx[buf][k], w[buf][k]);
                for (int c = 0; c < C; ++c) {
                    prefetch_write(level_grad + (size_t)idx[buf][k][c] * F);
                    prefetch_write(level_touched + idx[buf][k][c]);
                }
            }
        };
        if (n > 0) stage(0, 0);
        for (int64_t g0 = 0, b = 0; g0 < n; g0 += PREFETCH_GROUP, b ^= 1) {
            if (g0 + PREFETCH_GROUP < n) stage((int)(b ^ 1), g0 + PREFETCH_GROUP);
            const int64_t g1 = std::min(n, g0 + PREFETCH_GROUP);
            for (int64_t i = g0; i < g1; ++i) {
                const int k = (int)(i - g0);
                if (!live[b][k]) continue;
                const T* g = grad_out + i * stride + l * F;
                for (int c = 0; c < C; ++c) {
                    T* row = level_grad + (size_t)idx[b][k][c] * F;
                    for (int f = 0; f < F; ++f) row[f] += w[b][k][c] * g[f];
                    level_touched[idx[b][k][c]] = 1;
                }
            }
        }
    }
}

// Adam on the touched rows only, then their gradient and flag are cleared for the next step.
// bc1[t] = 1 - b1^t and bc2_sqrt[t] = sqrt(1 - b2^t) for every step count t a row can have.
// Returns false (and leaves such rows alone) when a row's next count is outside the tables, so
// the caller need not scan every row's count beforehand.
template <int F, typename T>
bool hash_adam_impl(T* w, T* grad, uint8_t* touched, T* m, T* v, int32_t* steps, const T* bc1, const T* bc2_sqrt,
                    int64_t n_bias, int64_t rows, T lr, T b1, T b2, T eps, int n_threads) {
    int bad = 0;
#pragma omp parallel for schedule(static, 4096) num_threads(n_threads) reduction(| : bad)
    for (int64_t r = 0; r < rows; ++r) {
        if (!touched[r]) continue;
        const int32_t t = steps[r] + 1;
        if (t < 1 || t >= n_bias) {
            bad = 1;
            continue;
        }
        steps[r] = t;
        kn::adam_row<F, T>(w + r * F, grad + r * F, m + r * F, v + r * F, bc1[t], bc2_sqrt[t], lr, b1, b2, eps);
        for (int f = 0; f < F; ++f) grad[r * F + f] = T(0);
        touched[r] = 0;
    }
    return !bad;
}

}  // namespace kn_cpu
