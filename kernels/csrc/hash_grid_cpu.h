// CPU loops of the hash grid over the shared bodies of hash_grid.h.
//
// Forward: blocks of points, each thread encoding whole blocks level by level, so a block's inputs
// and outputs stay in L1/L2 while the level's table slice is walked. The 3-D float case with two
// features per level (the NeRF field) has an AVX2 body, chosen at run time when the CPU has AVX2;
// it does the same multiplies and adds in the same order as the scalar body (no FMA), so both give
// the same bits.
// Backward: each thread owns whole levels and walks the points in order, so the table gradient
// is the same bit for bit whatever the thread count, without atomics. `hash_bwd_rows_impl` adds
// into a persistent gradient and flags the rows it touched, and `hash_adam_impl` updates only
// those rows and clears them again: no dense zero-fill and no dense optimiser pass per step.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KN_HAVE_X86 1
#endif

#include "hash_grid.h"

namespace kn_cpu {

// Points per block: 8 KiB of outputs at 32 features, and a multiple of the AVX2 width.
constexpr int64_t HASH_BLOCK = 64;

inline bool cpu_has_avx2() {
#if defined(KN_HAVE_X86)
    static const bool has = __builtin_cpu_supports("avx2");
    return has;
#else
    return false;
#endif
}

template <int D, int F, typename T>
void hash_fwd_block_scalar(const T* x, const T* table, const kn::HashGridMeta& m, T* out, int64_t i0, int64_t i1) {
    const int64_t stride = (int64_t)m.n_levels * F;
    for (int l = 0; l < m.n_levels; ++l)
        for (int64_t i = i0; i < i1; ++i)
            kn::hash_grid_forward_point_level<D, F, T>(x + i * D, table, m, l, out + i * stride + l * F);
}

#if defined(KN_HAVE_X86)
// Eight points per iteration; same arithmetic as hash_grid_corners + hash_grid_forward_point_level.
__attribute__((target("avx2"))) inline void hash_fwd_block_avx2_3d2f(const float* x, const float* table,
                                                                     const kn::HashGridMeta& m, float* out,
                                                                     int64_t i0, int64_t i1) {
    const int64_t stride = (int64_t)m.n_levels * 2;
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.f), half = _mm256_set1_ps(0.5f);
    const __m256i p1 = _mm256_set1_epi32((int)2654435761u), p2 = _mm256_set1_epi32((int)805459861u);
    const __m256i lane3 = _mm256_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21);
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        __m256 xc[3];
        for (int d = 0; d < 3; ++d) {
            const __m256 v = _mm256_i32gather_ps(x + i * 3 + d, lane3, 4);
            // max(v, 0) returns 0 for NaN (second operand), like clamp01.
            xc[d] = _mm256_min_ps(_mm256_max_ps(v, zero), one);
        }
        for (int l = 0; l < m.n_levels; ++l) {
            const __m256 scale = _mm256_set1_ps(m.scale[l]);
            const uint32_t res = m.resolution[l];
            const uint32_t size = m.offset[l + 1] - m.offset[l];
            const bool hashed = (m.hashed_mask >> l) & 1u;
            __m256i base[3];
            __m256 frac[3], omf[3];
            for (int d = 0; d < 3; ++d) {
                const __m256 pos = _mm256_add_ps(_mm256_mul_ps(xc[d], scale), half);
                const __m256 fl = _mm256_floor_ps(pos);
                base[d] = _mm256_cvttps_epi32(fl);
                frac[d] = _mm256_sub_ps(pos, fl);
                omf[d] = _mm256_sub_ps(one, frac[d]);
            }
            const float* lt = table + (size_t)m.offset[l] * 2;
            const __m256i mask = _mm256_set1_epi32((int)(size - 1u));
            const __m256i r1 = _mm256_set1_epi32((int)res), r2 = _mm256_set1_epi32((int)(res * res));
            __m256 acc0 = zero, acc1 = zero;
            for (int c = 0; c < 8; ++c) {
                const __m256i gx = (c & 1) ? _mm256_add_epi32(base[0], _mm256_set1_epi32(1)) : base[0];
                const __m256i gy = (c & 2) ? _mm256_add_epi32(base[1], _mm256_set1_epi32(1)) : base[1];
                const __m256i gz = (c & 4) ? _mm256_add_epi32(base[2], _mm256_set1_epi32(1)) : base[2];
                __m256i idx;
                if (hashed) {
                    idx = _mm256_xor_si256(gx, _mm256_mullo_epi32(gy, p1));
                    idx = _mm256_xor_si256(idx, _mm256_mullo_epi32(gz, p2));
                    idx = _mm256_and_si256(idx, mask);
                } else {
                    idx = _mm256_add_epi32(gx, _mm256_mullo_epi32(gy, r1));
                    idx = _mm256_add_epi32(idx, _mm256_mullo_epi32(gz, r2));
                }
                // weight = ((1 * wx) * wy) * wz, as the scalar body multiplies.
                __m256 w = (c & 1) ? frac[0] : omf[0];
                w = _mm256_mul_ps(w, (c & 2) ? frac[1] : omf[1]);
                w = _mm256_mul_ps(w, (c & 4) ? frac[2] : omf[2]);
                const __m256i row = _mm256_slli_epi32(idx, 1);
                const __m256 f0 = _mm256_i32gather_ps(lt, row, 4);
                const __m256 f1 = _mm256_i32gather_ps(lt + 1, row, 4);
                acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(w, f0));
                acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(w, f1));
            }
            // Interleave (f0, f1) per point and store the eight pairs.
            const __m256 lo = _mm256_unpacklo_ps(acc0, acc1);  // p0 p1 | p4 p5
            const __m256 hi = _mm256_unpackhi_ps(acc0, acc1);  // p2 p3 | p6 p7
            float* o = out + i * stride + l * 2;
            const __m128 lo0 = _mm256_castps256_ps128(lo), lo1 = _mm256_extractf128_ps(lo, 1);
            const __m128 hi0 = _mm256_castps256_ps128(hi), hi1 = _mm256_extractf128_ps(hi, 1);
            _mm_storel_pi((__m64*)(o + 0 * stride), lo0);
            _mm_storeh_pi((__m64*)(o + 1 * stride), lo0);
            _mm_storel_pi((__m64*)(o + 2 * stride), hi0);
            _mm_storeh_pi((__m64*)(o + 3 * stride), hi0);
            _mm_storel_pi((__m64*)(o + 4 * stride), lo1);
            _mm_storeh_pi((__m64*)(o + 5 * stride), lo1);
            _mm_storel_pi((__m64*)(o + 6 * stride), hi1);
            _mm_storeh_pi((__m64*)(o + 7 * stride), hi1);
        }
    }
    if (i < i1) hash_fwd_block_scalar<3, 2, float>(x, table, m, out, i, i1);
}
#endif

template <int D, int F, typename T>
void hash_fwd_impl(const T* x, const T* table, const kn::HashGridMeta& m, T* out, int64_t n, int n_threads) {
    const int64_t n_blocks = (n + HASH_BLOCK - 1) / HASH_BLOCK;
    bool simd = false;
#if defined(KN_HAVE_X86)
    simd = D == 3 && F == 2 && std::is_same<T, float>::value && cpu_has_avx2();
#endif
#pragma omp parallel for schedule(static) num_threads(n_threads)
    for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t i0 = b * HASH_BLOCK, i1 = std::min(n, i0 + HASH_BLOCK);
#if defined(KN_HAVE_X86)
        if constexpr (D == 3 && F == 2 && std::is_same<T, float>::value) {
            if (simd) {
                hash_fwd_block_avx2_3d2f(x, table, m, out, i0, i1);
                continue;
            }
        }
#endif
        hash_fwd_block_scalar<D, F, T>(x, table, m, out, i0, i1);
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
template <int D, int F, typename T>
void hash_bwd_rows_impl(const T* x, const T* grad_out, const kn::HashGridMeta& m, T* grad_table, uint8_t* touched,
                        int64_t n, int n_threads) {
    const int64_t stride = (int64_t)m.n_levels * F;
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads)
    for (int l = 0; l < m.n_levels; ++l) {
        T* level_grad = grad_table + (size_t)m.offset[l] * F;
        uint8_t* level_touched = touched + m.offset[l];
        for (int64_t i = 0; i < n; ++i) {
            const T* g = grad_out + i * stride + l * F;
            bool any = false;
            for (int f = 0; f < F; ++f) any |= g[f] != T(0);
            if (!any) continue;
            uint32_t idx[1 << D];
            T w[1 << D];
            kn::hash_grid_corners<D, T>(x + i * D, m, l, idx, w);
            for (int c = 0; c < (1 << D); ++c) {
                T* row = level_grad + (size_t)idx[c] * F;
                for (int f = 0; f < F; ++f) row[f] += w[c] * g[f];
                level_touched[idx[c]] = 1;
            }
        }
    }
}

// Adam on the touched rows only, then their gradient and flag are cleared for the next step.
// bc1[t] = 1 - b1^t and bc2_sqrt[t] = sqrt(1 - b2^t) for every step count t a row can have.
template <int F, typename T>
void hash_adam_impl(T* w, T* grad, uint8_t* touched, T* m, T* v, int32_t* steps, const T* bc1, const T* bc2_sqrt,
                    int64_t rows, T lr, T b1, T b2, T eps, int n_threads) {
#pragma omp parallel for schedule(static, 4096) num_threads(n_threads)
    for (int64_t r = 0; r < rows; ++r) {
        if (!touched[r]) continue;
        const int32_t t = ++steps[r];
        kn::adam_row<F, T>(w + r * F, grad + r * F, m + r * F, v + r * F, bc1[t], bc2_sqrt[t], lr, b1, b2, eps);
        for (int f = 0; f < F; ++f) grad[r * F + f] = T(0);
        touched[r] = 0;
    }
}

}  // namespace kn_cpu
