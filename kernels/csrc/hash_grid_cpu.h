// CPU loops of the hash grid over the shared bodies of hash_grid.h.
//
// Fine levels are tables the L2 cannot hold and a point's corner rows are only known after
// hashing, so the hardware prefetchers cannot help: both directions compute the corners of a few
// points ahead and prefetch their rows.
// Forward (float, AVX2): the dense levels in one pass over the points, each 8-point group's
// levels together, then each hashed level in its own pass: a pass walks one 4 MB table slice,
// which stays in L3 and within the TLB's reach, instead of all of them (49 MB) at once. Those
// passes write level-major scratch, copied into the point-major output at the end. Corners of
// 8 points are computed in AVX2 lanes and the rows gathered 4 points at a time, with the scalar
// body's operations in its order: the same bits.
// Backward: each thread owns whole levels and walks the points in order, so the table gradient
// is the same bit for bit whatever the thread count, without atomics. (AVX2: the output gradient
// is first copied level-major, so a level's pass reads its slice in order.) `hash_bwd_rows_impl` adds
// into a persistent gradient and flags the rows it touched, and `hash_adam_impl` updates only
// those rows and clears them again: no dense zero-fill and no dense optimiser pass per step.
// Without AVX2 (and for float64) the scalar loops below run.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <type_traits>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KN_HASH_X86 1
#endif

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


#if defined(KN_HASH_X86)
#pragma GCC push_options
// No "fma": the products and sums must round one by one, as in the scalar body.
#pragma GCC target("avx2")
namespace kn_hash_avx2 {

constexpr int LANES = 8;

// A prefetch the optimiser cannot drop: GCC's IPA takes a function whose only effects are
// __builtin_prefetch calls for a pure one and deletes calls to it.
inline __attribute__((always_inline)) void prefetch(const void* p) {
    asm volatile("prefetcht0 %0" : : "m"(*(const char*)p));
}

// One level's constants for the eight-lane corner computation.
struct LevelConst {
    __m256 scale;
    __m256i mult[3];  // row step per unit of g[d]: 1, res, res^2 (dense) or the hash primes
    __m256i mask;     // size - 1 for hashed levels, all ones for dense ones
    bool hashed;
};

inline LevelConst level_const(const kn::HashGridMeta& m, int l) {
    LevelConst c;
    c.scale = _mm256_set1_ps(m.scale[l]);
    c.hashed = (m.hashed_mask >> l) & 1u;
    const uint32_t res = m.resolution[l];
    const uint32_t size = m.offset[l + 1] - m.offset[l];
    if (c.hashed) {
        c.mult[0] = _mm256_set1_epi32(1);
        c.mult[1] = _mm256_set1_epi32((int)2654435761u);
        c.mult[2] = _mm256_set1_epi32((int)805459861u);
        c.mask = _mm256_set1_epi32((int)(size - 1u));
    } else {
        c.mult[0] = _mm256_set1_epi32(1);
        c.mult[1] = _mm256_set1_epi32((int)res);
        c.mult[2] = _mm256_set1_epi32((int)(res * res));
        c.mask = _mm256_set1_epi32(-1);
    }
    return c;
}

// kn::hash_grid_corners for eight points at once (xs[d * ld + k]: clamped coordinates, lane k
// one point): the same float operations in the same order, so the same weights and rows.
template <int D>
inline void corners8(const float* xs, int64_t ld, const LevelConst& c, uint32_t* idx, float* w) {
    constexpr int C = 1 << D;
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    __m256i lo[D], hi[D];
    __m256 wlo[D], whi[D];
    for (int d = 0; d < D; ++d) {
        const __m256 pos = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(xs + d * ld), c.scale), half);
        const __m256 fl = _mm256_floor_ps(pos);
        const __m256i base = _mm256_cvttps_epi32(fl);
        whi[d] = _mm256_sub_ps(pos, fl);
        wlo[d] = _mm256_sub_ps(one, whi[d]);
        lo[d] = d == 0 ? base : _mm256_mullo_epi32(base, c.mult[d]);
        hi[d] = d == 0 ? _mm256_add_epi32(base, c.mult[0]) : _mm256_add_epi32(lo[d], c.mult[d]);
    }
    for (int k = 0; k < C; ++k) {
        __m256i i = (k & 1) ? hi[0] : lo[0];
        __m256 wk = (k & 1) ? whi[0] : wlo[0];
        for (int d = 1; d < D; ++d) {
            const __m256i g = ((k >> d) & 1) ? hi[d] : lo[d];
            i = c.hashed ? _mm256_xor_si256(i, g) : _mm256_add_epi32(i, g);
            wk = _mm256_mul_ps(wk, ((k >> d) & 1) ? whi[d] : wlo[d]);
        }
        _mm256_storeu_si256((__m256i*)(idx + k * LANES), _mm256_and_si256(i, c.mask));
        _mm256_storeu_ps(w + k * LANES, wk);
    }
}

// Points [i0, i0 + 8) transposed to lanes and clamped to [0, 1] (NaN -> 0, as kn::clamp01);
// lanes past n repeat point n - 1 so that they index valid rows.
template <int D>
inline void load_lanes(const float* x, int64_t i0, int64_t n, float* xs, int64_t ld) {
    for (int k = 0; k < LANES; ++k) {
        const int64_t i = std::min(i0 + k, n - 1);
        for (int d = 0; d < D; ++d) xs[d * ld + k] = x[i * D + d];
    }
    const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
    for (int d = 0; d < D; ++d) {
        // max(v, 0) is 0 for NaN v (the second operand wins), then min(., 1).
        const __m256 v = _mm256_max_ps(_mm256_loadu_ps(xs + d * ld), zero);
        _mm256_storeu_ps(xs + d * ld, _mm256_min_ps(v, one));
    }
}

// Rows per 64-byte line, as a shift: float rows of F features.
template <int F>
constexpr int line_shift() {
    return F == 1 ? 4 : F == 2 ? 3 : F == 4 ? 2 : F == 8 ? 1 : 0;
}

// Prefetches the corner rows of the lanes set in `lanes` (and their touched flags when `touched`
// is given). Corners c and c + 1 differ by one in x, so they share a line unless the pair
// straddles one: a prefetch per pair, and a second one only for the pairs that straddle.
template <int D, int F>
inline void prefetch_item(const float* level_base, const uint8_t* touched, const uint32_t* idx, uint32_t lanes) {
    constexpr int C = 1 << D;
    uint32_t cross[C / 2], tcross[C / 2];
    // Line numbers from the addresses' low bits (the level's rows need not start a line).
    const __m256i roff = _mm256_set1_epi32((int)(((uintptr_t)level_base & 63) / (sizeof(float) * F)));
    const __m256i toff = _mm256_set1_epi32((int)((uintptr_t)touched & 63));
    for (int c = 0; c < C; c += 2) {
        const __m256i lo = _mm256_loadu_si256((const __m256i*)(idx + c * LANES));
        const __m256i hi = _mm256_loadu_si256((const __m256i*)(idx + (c + 1) * LANES));
        cross[c / 2] = ~(uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(
            _mm256_cmpeq_epi32(_mm256_srli_epi32(_mm256_add_epi32(lo, roff), line_shift<F>()),
                               _mm256_srli_epi32(_mm256_add_epi32(hi, roff), line_shift<F>()))));
        tcross[c / 2] = ~(uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(
            _mm256_cmpeq_epi32(_mm256_srli_epi32(_mm256_add_epi32(lo, toff), 6),
                               _mm256_srli_epi32(_mm256_add_epi32(hi, toff), 6))));
    }
    for (int k = 0; k < LANES; ++k) {
        if (!((lanes >> k) & 1)) continue;
        for (int c = 0; c < C; c += 2) {
            const uint32_t rl = idx[c * LANES + k], rh = idx[(c + 1) * LANES + k];
            prefetch(level_base + (size_t)rl * F);
            if ((cross[c / 2] >> k) & 1) prefetch(level_base + (size_t)rh * F);
            if (touched) {
                prefetch(touched + rl);
                if ((tcross[c / 2] >> k) & 1) prefetch(touched + rh);
            }
        }
    }
}

// Encodes the `valid` points of one item at one level: out[k * stride + f] for lane k. The
// corners are added in order to a zero start, per lane exactly the scalar body's sums.
template <int D, int F>
inline void gather_item(const float* level_table, const uint32_t* idx, const float* w, float* out, int64_t stride,
                        int valid) {
    constexpr int C = 1 << D;
    if constexpr (F == 2) {
        const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
        for (int h = 0; h < LANES; h += 4) {
            if (h >= valid) break;
            __m256 acc = _mm256_setzero_ps();
            for (int c = 0; c < C; ++c) {
                const __m128i i4 = _mm_loadu_si128((const __m128i*)(idx + c * LANES + h));
                const __m256 rows =
                    _mm256_castsi256_ps(_mm256_i32gather_epi64((const long long*)level_table, i4, 8));
                const __m256 wc =
                    _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(w + c * LANES + h)), dup);
                acc = _mm256_add_ps(acc, _mm256_mul_ps(wc, rows));
            }
            const __m128 a01 = _mm256_castps256_ps128(acc), a23 = _mm256_extractf128_ps(acc, 1);
            const int v = valid - h;
            float* o = out + h * stride;
            _mm_storel_pi((__m64*)o, a01);
            if (v > 1) _mm_storeh_pi((__m64*)(o + stride), a01);
            if (v > 2) _mm_storel_pi((__m64*)(o + 2 * stride), a23);
            if (v > 3) _mm_storeh_pi((__m64*)(o + 3 * stride), a23);
        }
    } else {
        for (int k = 0; k < valid; ++k) {
            float acc[F];
            for (int f = 0; f < F; ++f) acc[f] = 0.0f;
            for (int c = 0; c < C; ++c) {
                const float* row = level_table + (size_t)idx[c * LANES + k] * F;
                const float wc = w[c * LANES + k];
                for (int f = 0; f < F; ++f) acc[f] += wc * row[f];
            }
            for (int f = 0; f < F; ++f) out[k * stride + f] = acc[f];
        }
    }
}

// Adds one point's gradient g (F values) times its corner weights into its corner rows, in
// corner order, and flags the rows.
template <int D, int F>
inline void scatter_point(float* level_grad, uint8_t* level_touched, const uint32_t* idx, const float* w, int k,
                          const float* g) {
    constexpr int C = 1 << D;
    if constexpr (F == 2) {
        // Both features of a row in one 8-byte load and store (__m64 may alias the floats).
        const __m128 zero = _mm_setzero_ps();
        const __m128 gv = _mm_loadl_pi(zero, (const __m64*)g);
        for (int c = 0; c < C; ++c) {
            const uint32_t r = idx[c * LANES + k];
            __m64* row = (__m64*)(level_grad + (size_t)r * 2);
            const __m128 prod = _mm_mul_ps(_mm_set1_ps(w[c * LANES + k]), gv);
            _mm_storel_pi(row, _mm_add_ps(_mm_loadl_pi(zero, row), prod));
            level_touched[r] = 1;
        }
    } else {
        for (int c = 0; c < C; ++c) {
            const uint32_t r = idx[c * LANES + k];
            float* row = level_grad + (size_t)r * F;
            const float wc = w[c * LANES + k];
            for (int f = 0; f < F; ++f) row[f] += wc * g[f];
            level_touched[r] = 1;
        }
    }
}

// Items ahead whose rows are prefetched before their gathers or adds (an item: 8 points at one level).
constexpr int AHEAD = 2;

template <int D, int F>
void fwd(const float* x, const float* table, const kn::HashGridMeta& m, float* out, int64_t n, int n_threads) {
    LevelConst lc[kn::HASH_GRID_MAX_LEVELS];
    for (int l = 0; l < m.n_levels; ++l) lc[l] = level_const(m, l);
    constexpr int C = 1 << D;
    if (n <= 0) return;
    const int64_t stride = (int64_t)m.n_levels * F;
    const int64_t n_groups = (n + LANES - 1) / LANES;
    const int64_t ld = n_groups * LANES;
    std::unique_ptr<float[]> xs_buf(new float[(size_t)D * ld]);  // no zero-fill: every lane is written
    float* xs = xs_buf.get();
    // Hashed levels' features level-major: a pass writes its slice in order rather than 8 bytes of
    // every point's row.
    std::unique_ptr<float[]> ol_buf(new float[(size_t)m.n_levels * ld * F]);
    float* ol = ol_buf.get();
    // Passes: the dense levels together (small tables that stay cached), then one per hashed level.
    int pass_begin[kn::HASH_GRID_MAX_LEVELS + 1], n_passes = 0;
    for (int l = 0; l < m.n_levels;) {
        pass_begin[n_passes++] = l;
        if (!lc[l].hashed) {
            while (l < m.n_levels && !lc[l].hashed) ++l;
        } else {
            ++l;
        }
    }
    pass_begin[n_passes] = m.n_levels;
#pragma omp parallel num_threads(n_threads)
    {
        const int nt = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t q0 = n_groups * t / nt, q1 = n_groups * (t + 1) / nt;
        for (int64_t q = q0; q < q1; ++q) load_lanes<D>(x, q * LANES, n, xs + q * LANES, ld);
        alignas(32) uint32_t idx[AHEAD + 1][C * LANES];
        alignas(32) float w[AHEAD + 1][C * LANES];
        const int64_t per = q1 - q0;
        int64_t n_items = 0;
        for (int p = 0; p < n_passes; ++p) n_items += per * (pass_begin[p + 1] - pass_begin[p]);
        // item -> (level, group): passes in order, within a pass groups in order, each group's
        // levels together (its output row stays in L1).
        auto locate = [&](int64_t item, int& l, int64_t& q) {
            int p = 0;
            for (;; ++p) {
                const int64_t size = per * (pass_begin[p + 1] - pass_begin[p]);
                if (item < size) break;
                item -= size;
            }
            const int nl = pass_begin[p + 1] - pass_begin[p];
            q = q0 + item / nl;
            l = pass_begin[p] + (int)(item % nl);
        };
        auto stage = [&](int64_t item) {
            int l;
            int64_t q;
            locate(item, l, q);
            const int s = (int)(item % (AHEAD + 1));
            corners8<D>(xs + q * LANES, ld, lc[l], idx[s], w[s]);
            const int valid = (int)std::min<int64_t>(LANES, n - q * LANES);
            prefetch_item<D, F>(table + (size_t)m.offset[l] * F, nullptr, idx[s], (1u << valid) - 1u);
        };
        for (int64_t it = 0; it < std::min<int64_t>(AHEAD, n_items); ++it) stage(it);
        for (int64_t it = 0; it < n_items; ++it) {
            if (it + AHEAD < n_items) stage(it + AHEAD);
            int l;
            int64_t q;
            locate(it, l, q);
            const int s = (int)(it % (AHEAD + 1));
            const int valid = (int)std::min<int64_t>(LANES, n - q * LANES);
            if (lc[l].hashed) {
                gather_item<D, F>(table + (size_t)m.offset[l] * F, idx[s], w[s], ol + ((size_t)l * ld + q * LANES) * F,
                                  F, valid);
                continue;
            }
            gather_item<D, F>(table + (size_t)m.offset[l] * F, idx[s], w[s], out + q * LANES * stride + l * F, stride,
                              valid);
        }
        // The hashed levels' features into the point-major output, a point's row at a time.
        for (int64_t i = q0 * LANES; i < std::min(n, q1 * LANES); ++i)
            for (int l = 0; l < m.n_levels; ++l) {
                if (!lc[l].hashed) continue;
                for (int f = 0; f < F; ++f) out[i * stride + l * F + f] = ol[((size_t)l * ld + i) * F + f];
            }
    }
}

// hash_bwd_rows_impl with the corners of 8 points computed at once; the adds keep the scalar
// order (level by level, points in order), so the gradient has the same bits.
template <int D, int F>
void bwd_rows(const float* x, const float* grad_out, const kn::HashGridMeta& m, float* grad_table, uint8_t* touched,
              int64_t n, int n_threads) {
    constexpr int C = 1 << D;
    if (n <= 0) return;
    const int L = m.n_levels;
    const int64_t stride = (int64_t)L * F;
    const int64_t n_groups = (n + LANES - 1) / LANES;
    const int64_t ld = n_groups * LANES;
    std::unique_ptr<float[]> xs_buf(new float[(size_t)D * ld]);  // no zero-fill: every lane is written
    float* xs = xs_buf.get();
    // The output gradient level-major (each level pass then reads its slice in order instead of
    // 8 bytes of every point's 128-byte row), with a bit per point: nonzero at that level.
    std::unique_ptr<float[]> gl_buf(new float[(size_t)L * ld * F]);
    std::unique_ptr<uint8_t[]> live_buf(new uint8_t[(size_t)L * n_groups]);
    float* gl = gl_buf.get();
    uint8_t* live_bits = live_buf.get();
    LevelConst lc[kn::HASH_GRID_MAX_LEVELS];
    for (int l = 0; l < L; ++l) lc[l] = level_const(m, l);
#pragma omp parallel num_threads(n_threads)
    {
#pragma omp for schedule(static)
        for (int64_t q = 0; q < n_groups; ++q) {
            load_lanes<D>(x, q * LANES, n, xs + q * LANES, ld);
            const int valid = (int)std::min<int64_t>(LANES, n - q * LANES);
            uint8_t bits[kn::HASH_GRID_MAX_LEVELS] = {};
            for (int k = 0; k < valid; ++k) {
                const float* g = grad_out + (q * LANES + k) * stride;
                for (int l = 0; l < L; ++l) {
                    bool any = false;
                    for (int f = 0; f < F; ++f) {
                        gl[((size_t)l * ld + q * LANES + k) * F + f] = g[l * F + f];
                        any |= g[l * F + f] != 0.0f;
                    }
                    bits[l] |= (uint8_t)(any << k);
                }
            }
            for (int l = 0; l < L; ++l) live_bits[(size_t)l * n_groups + q] = bits[l];
        }
        // Finest levels first: they cost the most, and the cheap coarse ones then even out the threads.
#pragma omp for schedule(dynamic, 1)
        for (int li = 0; li < L; ++li) {
            const int l = L - 1 - li;
            float* level_grad = grad_table + (size_t)m.offset[l] * F;
            uint8_t* level_touched = touched + m.offset[l];
            alignas(32) uint32_t idx[AHEAD + 1][C * LANES];
            alignas(32) float w[AHEAD + 1][C * LANES];
            uint32_t live[AHEAD + 1];
            const float* level_g = gl + (size_t)l * ld * F;
            auto grad_of = [&](int64_t i) { return level_g + i * F; };
            auto stage = [&](int64_t q) {
                const int s = (int)(q % (AHEAD + 1));
                const uint32_t bits = live_bits[(size_t)l * n_groups + q];
                live[s] = bits;
                if (!bits) return;
                corners8<D>(xs + q * LANES, ld, lc[l], idx[s], w[s]);
                prefetch_item<D, F>(level_grad, level_touched, idx[s], bits);
            };
            for (int64_t q = 0; q < std::min<int64_t>(AHEAD, n_groups); ++q) stage(q);
            for (int64_t q = 0; q < n_groups; ++q) {
                if (q + AHEAD < n_groups) stage(q + AHEAD);
                const int s = (int)(q % (AHEAD + 1));
                const uint32_t bits = live[s];
                for (int k = 0; bits >> k; ++k) {
                    if (!((bits >> k) & 1)) continue;
                    scatter_point<D, F>(level_grad, level_touched, idx[s], w[s], k, grad_of(q * LANES + k));
                }
            }
        }
    }
}

// KERNELS_HASH_GRID_SCALAR set (read at each call) runs the scalar loops instead, so that tests
// and benchmarks can compare the two.
inline bool supported() {
    static const bool avx2 = __builtin_cpu_supports("avx2");
    return avx2 && !std::getenv("KERNELS_HASH_GRID_SCALAR");
}

}  // namespace kn_hash_avx2
#pragma GCC pop_options
#endif

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
#if defined(KN_HASH_X86)
    if constexpr (std::is_same_v<T, float>) {
        if (kn_hash_avx2::supported()) return kn_hash_avx2::fwd<D, F>(x, table, m, out, n, n_threads);
    }
#endif
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
#if defined(KN_HASH_X86)
    if constexpr (std::is_same_v<T, float>) {
        if (kn_hash_avx2::supported())
            return kn_hash_avx2::bwd_rows<D, F>(x, grad_out, m, grad_table, touched, n, n_threads);
    }
#endif
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
