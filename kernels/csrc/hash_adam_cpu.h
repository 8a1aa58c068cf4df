// Row-sparse Adam over the hash table on the CPU: the AVX2 body and the dispatch to it.
//
// About half of the table's ~6 M rows are touched per training step, scattered, so the scalar
// body (hash_grid_cpu.h) mispredicts its per-row branch about every other row and runs a sqrt and
// two divisions per entry one at a time. This body takes 8 / F rows per vector: a group with no
// touched row is skipped by one 8 / F-byte test; otherwise all lanes are computed and blended, so
// untouched rows keep their values. Same operations in the same order as kn::adam_row, without
// fused multiply-adds, and IEEE sqrt and division round exactly: the bits are the scalar body's.
#pragma once

#include <omp.h>

#include <cstdint>
#include <algorithm>
#include <climits>
#include <cstring>

#include "hash_grid_cpu.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KN_ADAM_X86 1
#endif

namespace kn_cpu {

#if defined(KN_ADAM_X86)
#pragma GCC push_options
#pragma GCC target("avx2")
// Rows [0, groups * 8 / F) in vector groups; returns false if a touched row's count is outside the
// bias tables (that row is left alone, as in the scalar body).
template <int F>
bool hash_adam_avx2(float* w, float* grad, uint8_t* touched, float* m, float* v, int32_t* steps, const float* bc1,
                    const float* bc2_sqrt, int64_t n_bias, int64_t groups, float lr, float b1, float b2, float eps,
                    int n_threads) {
    constexpr int R = 8 / F;  // rows per vector
    // Row-level lanes (the first R valid) and the row each of the 8 entry lanes belongs to.
    const __m256i first_r = _mm256_cmpgt_epi32(_mm256_set1_epi32(R), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i lane_row = _mm256_setr_epi32(0 / F, 1 / F, 2 / F, 3 / F, 4 / F, 5 / F, 6 / F, 7 / F);
    const __m256i one = _mm256_set1_epi32(1), zero = _mm256_setzero_si256();
    const __m256i nb = _mm256_set1_epi32((int32_t)std::min<int64_t>(n_bias, INT32_MAX));
    int bad = 0;
#pragma omp parallel for schedule(static, 512) num_threads(n_threads) reduction(| : bad)
    for (int64_t gi = 0; gi < groups; ++gi) {
        const int64_t r0 = gi * R;
        uint64_t f8 = 0;
        std::memcpy(&f8, touched + r0, R);
        if (!f8) continue;
        // Counts, flags and bias factors in vector lanes: building them a lane at a time through
        // memory cost more than the update itself (each vector load waited on eight stores).
        const __m256i fl = _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)f8)), zero);
        const __m256i s0 = _mm256_maskload_epi32(steps + r0, first_r);
        const __m256i t = _mm256_add_epi32(s0, one);
        const __m256i in_range = _mm256_and_si256(_mm256_cmpgt_epi32(t, zero), _mm256_cmpgt_epi32(nb, t));
        const __m256i on_row = _mm256_and_si256(fl, in_range);
        const int fl_bits = _mm256_movemask_ps(_mm256_castsi256_ps(fl));
        const int on_bits = _mm256_movemask_ps(_mm256_castsi256_ps(on_row));
        if (on_bits != fl_bits) bad = 1;  // a touched row whose count is outside the tables stays as it is
        _mm256_maskstore_epi32(steps + r0, on_row, t);
        if (on_bits == fl_bits) {
            std::memset(touched + r0, 0, R);
        } else {
            for (int k = 0; k < R; ++k)
                if ((on_bits >> k) & 1) touched[r0 + k] = 0;
        }
        const __m256i t_used = _mm256_permutevar8x32_epi32(_mm256_blendv_epi8(one, t, on_row), lane_row);
        const __m256 on = _mm256_castsi256_ps(_mm256_permutevar8x32_epi32(on_row, lane_row));
        const __m256 vc1 = _mm256_i32gather_ps(bc1, t_used, 4);
        const __m256 vc2 = _mm256_i32gather_ps(bc2_sqrt, t_used, 4);
        const int64_t o = r0 * F;
        const __m256 g = _mm256_loadu_ps(grad + o);
        const __m256 m0 = _mm256_loadu_ps(m + o);
        const __m256 v0 = _mm256_loadu_ps(v + o);
        const __m256 w0 = _mm256_loadu_ps(w + o);
        const __m256 vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2);
        const __m256 m1 = _mm256_add_ps(_mm256_mul_ps(vb1, m0), _mm256_mul_ps(_mm256_set1_ps(1.f - b1), g));
        const __m256 v1 =
            _mm256_add_ps(_mm256_mul_ps(vb2, v0), _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(1.f - b2), g), g));
        const __m256 denom =
            _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v1), vc2), _mm256_set1_ps(eps));
        const __m256 step = _mm256_div_ps(_mm256_mul_ps(_mm256_div_ps(_mm256_set1_ps(lr), vc1), m1),
                                          denom);
        _mm256_storeu_ps(m + o, _mm256_blendv_ps(m0, m1, on));
        _mm256_storeu_ps(v + o, _mm256_blendv_ps(v0, v1, on));
        _mm256_storeu_ps(w + o, _mm256_blendv_ps(w0, _mm256_sub_ps(w0, step), on));
        _mm256_storeu_ps(grad + o, _mm256_blendv_ps(g, _mm256_setzero_ps(), on));
    }
    return !bad;
}
#pragma GCC pop_options
#endif

// hash_adam_impl's update, with the vector body for float tables of up to 8 features per row on
// CPUs with AVX2 (the rows past the last whole group go through the scalar body).
template <int F, typename T>
bool hash_adam(T* w, T* grad, uint8_t* touched, T* m, T* v, int32_t* steps, const T* bc1, const T* bc2_sqrt,
               int64_t n_bias, int64_t rows, T lr, T b1, T b2, T eps, int n_threads) {
#if defined(KN_ADAM_X86)
    if constexpr (sizeof(T) == 4 && F <= 8) {
        if (__builtin_cpu_supports("avx2")) {
            constexpr int R = 8 / F;
            const int64_t groups = rows / R, done = groups * R;
            bool ok = hash_adam_avx2<F>(w, grad, touched, m, v, steps, bc1, bc2_sqrt, n_bias, groups, lr, b1, b2,
                                        eps, n_threads);
            ok &= hash_adam_impl<F, T>(w + done * F, grad + done * F, touched + done, m + done * F, v + done * F,
                                       steps + done, bc1, bc2_sqrt, n_bias, rows - done, lr, b1, b2, eps, 1);
            return ok;
        }
    }
#endif
    return hash_adam_impl<F, T>(w, grad, touched, m, v, steps, bc1, bc2_sqrt, n_bias, rows, lr, b1, b2, eps,
                                n_threads);
}

}  // namespace kn_cpu
