// The register-tiled matrix product of the fused MLP (mlp_cpu.h) for one instruction set.
//
// mlp_cpu.h includes this file once per instruction set, each time inside `#pragma GCC target`
// with KN_MLP_ISA = 512 (AVX-512F), 256 (AVX2 + FMA) or 0 (portable C++) and KN_MLP_NS naming
// the namespace. No include guard for that reason. The body uses nothing from std:: on purpose: a
// library template instantiated here would be compiled for this instruction set, and the linker
// could then pick that copy for callers running on CPUs without it.

namespace KN_MLP_NS {

using kn_mlp::GemmArgs;

#if KN_MLP_ISA == 512

constexpr int W = 16;      // lanes per vector
constexpr int NV_MAX = 4;  // vectors per row of a tile: 64 columns

struct V {
    __m512 v;
};
using Mask = __mmask16;
inline Mask mask_first(int n) { return (Mask)((1u << n) - 1u); }
inline V vzero() { return {_mm512_setzero_ps()}; }
inline V vset1(float x) { return {_mm512_set1_ps(x)}; }
inline V vload(const float* p) { return {_mm512_loadu_ps(p)}; }
inline V vload_m(const float* p, Mask m) { return {_mm512_maskz_loadu_ps(m, p)}; }
inline void vstore(float* p, V x) { _mm512_storeu_ps(p, x.v); }
inline void vstore_m(float* p, V x, Mask m) { _mm512_mask_storeu_ps(p, m, x.v); }
inline V vfma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline V vadd(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
// max(0, x) with x second, so that a NaN passes through as it does in torch.relu.
inline V vrelu(V x) { return {_mm512_max_ps(_mm512_setzero_ps(), x.v)}; }
inline V vkeep_where_positive(V g, V act) {
    return {_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(act.v, _mm512_setzero_ps(), _CMP_GT_OQ), g.v)};
}
// Rows per tile for a tile NV vectors wide: up to 24 accumulators of the 32 registers.
template <int NV>
constexpr int rows_for() {
    return NV == 4 ? 6 : NV == 3 ? 8 : NV == 2 ? 12 : 16;
}

#elif KN_MLP_ISA == 256

constexpr int W = 8;
constexpr int NV_MAX = 2;  // 16 columns: 16 registers hold 12 accumulators, 2 loads and a broadcast

struct V {
    __m256 v;
};
using Mask = __m256i;
inline Mask mask_first(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline V vzero() { return {_mm256_setzero_ps()}; }
inline V vset1(float x) { return {_mm256_set1_ps(x)}; }
inline V vload(const float* p) { return {_mm256_loadu_ps(p)}; }
inline V vload_m(const float* p, Mask m) { return {_mm256_maskload_ps(p, m)}; }
inline void vstore(float* p, V x) { _mm256_storeu_ps(p, x.v); }
inline void vstore_m(float* p, V x, Mask m) { _mm256_maskstore_ps(p, m, x.v); }
inline V vfma(V a, V b, V c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline V vadd(V a, V b) { return {_mm256_add_ps(a.v, b.v)}; }
inline V vrelu(V x) { return {_mm256_max_ps(_mm256_setzero_ps(), x.v)}; }
inline V vkeep_where_positive(V g, V act) {
    return {_mm256_and_ps(g.v, _mm256_cmp_ps(act.v, _mm256_setzero_ps(), _CMP_GT_OQ))};
}
template <int NV>
constexpr int rows_for() {
    return NV == 2 ? 6 : 12;
}

#else

// Portable: GCC vector extensions of four floats, which every SIMD target has (SSE2, NEON), with
// separate multiply and add, as -ffp-contract=off builds the rest of the extension.
constexpr int W = 4;
constexpr int NV_MAX = 4;

typedef float v4f __attribute__((vector_size(16)));
typedef int v4i __attribute__((vector_size(16)));
struct V {
    v4f v;
};
using Mask = int;  // number of leading lanes in use
inline Mask mask_first(int n) { return n; }
inline V vzero() { return {v4f{0.f, 0.f, 0.f, 0.f}}; }
inline V vset1(float x) { return {v4f{x, x, x, x}}; }
inline V vload(const float* p) {
    V r;
    __builtin_memcpy(&r.v, p, sizeof(r.v));
    return r;
}
inline V vload_m(const float* p, Mask m) {
    V r = vzero();
    for (int i = 0; i < W; ++i)
        if (i < m) r.v[i] = p[i];
    return r;
}
inline void vstore(float* p, V x) { __builtin_memcpy(p, &x.v, sizeof(x.v)); }
inline void vstore_m(float* p, V x, Mask m) {
    for (int i = 0; i < W; ++i)
        if (i < m) p[i] = x.v[i];
}
inline V vfma(V a, V b, V c) { return {a.v * b.v + c.v}; }
inline V vadd(V a, V b) { return {a.v + b.v}; }
// Keeps x where x > 0 or x is NaN (torch.relu lets NaN through).
inline V vrelu(V x) { return {(v4f)((v4i)x.v & ((x.v > vzero().v) | (x.v != x.v)))}; }
inline V vkeep_where_positive(V g, V act) { return {(v4f)((v4i)g.v & (act.v > vzero().v))}; }
template <int NV>
constexpr int rows_for() {
    return NV >= 3 ? 2 : 4;
}

#endif

// C[m, n .. n + W) = the epilogue `epi` (g.epi, passed as a local: the stores to C may alias g)
// of x: ReLU, the ReLU's backward mask from R, or nothing; `full` stores every lane, else those of
// `last`. mlp_cpu_bf16.h uses the AVX-512 one for its tiles too.
inline void finish(const GemmArgs& g, int epi, int64_t m, int64_t n, V x, bool full, Mask last) {
    if (epi == kn_mlp::EPI_RELU) {
        x = vrelu(x);
    } else if (epi == kn_mlp::EPI_MASK) {
        const float* r = g.R + m * g.ldr + n;
        x = vkeep_where_positive(x, full ? vload(r) : vload_m(r, last));
    }
    float* c = g.C + m * g.ldc + n;
    if (full)
        vstore(c, x);
    else
        vstore_m(c, x, last);
}

// One tile: rows [m0, m0 + mr) and NV vectors of columns from n0, the last vector holding the
// lanes of `last` unless FULL. Rows past mr repeat row mr - 1 so that the loop has no row test;
// they are computed and never stored. FULL panels avoid masked loads and stores, which are slow
// (AVX2's vmaskmov store is microcoded on AMD Zen).
template <int MR, int NV, bool FULL>
inline void tile(const GemmArgs& g, int64_t m0, int mr, int64_t n0, Mask last) {
    V acc[MR][NV];
    const float* a[MR];
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) a[m] = g.A + (m0 + (m < mr ? m : mr - 1)) * g.sam;
    if (g.init == kn_mlp::INIT_ACC) {
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) {
            const float* c = g.C + (m0 + (m < mr ? m : mr - 1)) * g.ldc + n0;
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[m][v] = FULL || v + 1 < NV ? vload(c + v * W) : vload_m(c + v * W, last);
        }
    } else if (g.init == kn_mlp::INIT_BIAS) {
        V b[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) b[v] = FULL || v + 1 < NV ? vload(g.bias + n0 + v * W) : vload_m(g.bias + n0 + v * W, last);
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[m][v] = b[v];
    } else {
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m)
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[m][v] = vzero();
    }
    // Locals: through g, every iteration would reload them (the stores to C may alias g).
    const float* b = g.B + n0;
    const int64_t sak = g.sak, ldb = g.ldb, K1 = g.A2 ? g.K1 : g.K;
    const int epi = g.epi;
    // k < K1 from A, then the rest from A2 (see GemmArgs): one chain of multiply-adds either way.
    for (int part = 0; part < 2; ++part) {
        const int64_t kn = part == 0 ? K1 : g.K - K1;
        if (part == 1) {
            if (kn <= 0) break;
#pragma GCC unroll 16
            for (int m = 0; m < MR; ++m) a[m] = g.A2 + (m0 + (m < mr ? m : mr - 1)) * g.sam2;
        }
        for (int64_t k = 0; k < kn; ++k, b += ldb) {
            V bv[NV];
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) bv[v] = FULL || v + 1 < NV ? vload(b + v * W) : vload_m(b + v * W, last);
            const int64_t ka = k * sak;
#pragma GCC unroll 16
            for (int m = 0; m < MR; ++m) {
                const V av = vset1(a[m][ka]);
#pragma GCC unroll 4
                for (int v = 0; v < NV; ++v) acc[m][v] = vfma(av, bv[v], acc[m][v]);
            }
        }
    }
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
        if (m >= mr) break;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) finish(g, epi, m0 + m, n0 + v * W, acc[m][v], FULL || v + 1 < NV, last);
    }
}

// The rows in tiles of MR; the last few in a shorter tile instead of a whole one that repeats its
// last row (M is as small as 3 or 16 in the weight-gradient products).
template <int NV, bool FULL>
inline void tile_rows(const GemmArgs& g, int64_t n0, Mask last) {
    constexpr int MR = rows_for<NV>();
    constexpr int HALF = (MR + 1) / 2;
    int64_t m0 = 0;
    for (; g.M - m0 >= MR; m0 += MR) tile<MR, NV, FULL>(g, m0, MR, n0, last);
    const int left = (int)(g.M - m0);
    if (left <= 0) return;
    if (left <= 2)
        tile<2, NV, FULL>(g, m0, left, n0, last);
    else if (left <= 4)
        tile<4, NV, FULL>(g, m0, left, n0, last);
    else if (left <= HALF)
        tile<HALF, NV, FULL>(g, m0, left, n0, last);
    else
        tile<MR, NV, FULL>(g, m0, left, n0, last);
}

template <int NV>
inline void tile_rows(const GemmArgs& g, int64_t n0, int64_t cols, Mask last) {
    if (cols == (int64_t)NV * W)
        tile_rows<NV, true>(g, n0, last);
    else
        tile_rows<NV, false>(g, n0, last);
}

// C = init + A B with the epilogue of g (see kn_mlp::GemmArgs), in panels of NV_MAX vectors.
inline void gemm(const GemmArgs& g) {
    if (g.M <= 0 || g.N <= 0) return;
    constexpr int64_t PANEL = (int64_t)NV_MAX * W;
    for (int64_t n0 = 0; n0 < g.N; n0 += PANEL) {
        const int64_t cols = g.N - n0 < PANEL ? g.N - n0 : PANEL;
        const int nv = (int)((cols + W - 1) / W);
        const Mask last = mask_first((int)(cols - (int64_t)(nv - 1) * W));
        switch (nv) {
            case 1: tile_rows<1>(g, n0, cols, last); break;
            case 2: tile_rows<2>(g, n0, cols, last); break;
#if KN_MLP_ISA != 256
            case 3: tile_rows<3>(g, n0, cols, last); break;
            case 4: tile_rows<4>(g, n0, cols, last); break;
#endif
        }
    }
}

// out[n0 + n] += X[0, n0 + n] + X[1, n0 + n] + ... (rows in order) for the NV vectors of a panel:
// NV independent chains of additions instead of one.
template <int NV, bool FULL>
inline void colsum_panel(int64_t M, const float* X, int64_t ldx, float* out, Mask last) {
    V acc[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[v] = FULL || v + 1 < NV ? vload(out + v * W) : vload_m(out + v * W, last);
    for (int64_t m = 0; m < M; ++m) {
        const float* x = X + m * ldx;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            acc[v] = vadd(acc[v], FULL || v + 1 < NV ? vload(x + v * W) : vload_m(x + v * W, last));
    }
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
        if (FULL || v + 1 < NV)
            vstore(out + v * W, acc[v]);
        else
            vstore_m(out + v * W, acc[v], last);
    }
}

template <int NV>
inline void colsum_panel(int64_t M, const float* X, int64_t ldx, float* out, int64_t cols, Mask last) {
    if (cols == (int64_t)NV * W)
        colsum_panel<NV, true>(M, X, ldx, out, last);
    else
        colsum_panel<NV, false>(M, X, ldx, out, last);
}

// out[n] += X[0, n] + X[1, n] + ... (rows in order), for the bias gradients.
inline void colsum(int64_t M, int64_t N, const float* X, int64_t ldx, float* out) {
    constexpr int64_t PANEL = (int64_t)NV_MAX * W;
    for (int64_t n0 = 0; n0 < N; n0 += PANEL) {
        const int64_t cols = N - n0 < PANEL ? N - n0 : PANEL;
        const int nv = (int)((cols + W - 1) / W);
        const Mask last = mask_first((int)(cols - (int64_t)(nv - 1) * W));
        switch (nv) {
            case 1: colsum_panel<1>(M, X + n0, ldx, out + n0, cols, last); break;
            case 2: colsum_panel<2>(M, X + n0, ldx, out + n0, cols, last); break;
#if KN_MLP_ISA != 256
            case 3: colsum_panel<3>(M, X + n0, ldx, out + n0, cols, last); break;
            case 4: colsum_panel<4>(M, X + n0, ldx, out + n0, cols, last); break;
#endif
        }
    }
}

}  // namespace KN_MLP_NS
