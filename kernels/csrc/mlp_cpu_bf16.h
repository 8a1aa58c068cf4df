// The fused MLP's matrix product with bfloat16 products (AVX-512 BF16: vdpbf16ps), for
// mlp_cpu.h, which includes this file once inside `#pragma GCC target` for avx512f, avx512bw and
// avx512bf16.
//
// C = init + A B as kn_mlp::GemmArgs says, with every A(m, k) and B[k, n] rounded to bfloat16
// (nearest even) and the products summed in float32: vdpbf16ps adds two products per lane, so one
// instruction does twice the multiply-adds of a float32 one on the same register width
// (instant-ngp runs its MLPs in float16 for the same reason). Both operands are first packed into
// k-pairs in stack buffers: B as [k / 2][n] words of (B[2i, n], B[2i + 1, n]), A as words of
// (A(m, 2i), A(m, 2i + 1)); an odd K gets a zero pair partner. The packs live on the stack up to
// 64 KB each (every product of the NeRF field's default blocks), on the heap past that. As in
// mlp_cpu_isa.h, nothing from std::.

namespace kn_mlp_bf16 {

using kn_mlp::GemmArgs;

constexpr int W = 16;
constexpr int NV_MAX = 4;
constexpr int64_t PACK_WORDS = 16384;  // 64 KB per operand

// 16 words (lo[i], hi[i]) as bfloat16 pairs, lo in the low half (the even element).
inline __m512i pair_words(__m512 lo, __m512 hi) {
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    // cvtne2ps_pbh(a, b): words 0..15 from b, 16..31 from a.
    return _mm512_permutexvar_epi16(idx, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

inline __mmask16 mask_first(int64_t n) { return n >= W ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1u); }

// Rows r0 and r1 (r1 null: zeros) of a row-major matrix, columns [0, n), as pair words in out[0, npad).
inline void pack_row_pairs(const float* r0, const float* r1, int64_t n, int64_t npad, uint32_t* out) {
    for (int64_t c = 0; c < npad; c += W) {
        const __mmask16 m = c < n ? mask_first(n - c) : (__mmask16)0;
        const __m512 lo = _mm512_maskz_loadu_ps(m, r0 + c);
        const __m512 hi = r1 ? _mm512_maskz_loadu_ps(m, r1 + c) : _mm512_setzero_ps();
        _mm512_storeu_si512((void*)(out + c), pair_words(lo, hi));
    }
}

// n floats of x as bfloat16 at out[0, n).
inline void to_bf16(const float* x, int64_t n, uint16_t* out) {
    for (int64_t c = 0; c < n; c += W) {
        const __mmask16 m = mask_first(n - c);
        const __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + c));
        _mm256_mask_storeu_epi16((void*)(out + c), m, h);
    }
}

inline __m512 bias_or_zero(const GemmArgs& g, int64_t n0, int v, __mmask16 last, bool full) {
    const float* p = g.bias + n0 + v * W;
    return full ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(last, p);
}

// Rows [m0, m0 + mr) and NV vectors of columns from n0 (the last holding `last`'s lanes unless
// FULL). a: pair words, row m's pair i at a[m * pam + i * pak]; b: pair words [i][npad].
template <int MR, int NV, bool FULL>
inline void tile(const GemmArgs& g, const uint32_t* a, int64_t pam, int64_t pak, const uint32_t* b, int64_t npad,
                 int64_t k2, int64_t m0, int mr, int64_t n0, __mmask16 last) {
    __m512 acc[MR][NV];
    const uint32_t* ar[MR];
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) ar[m] = a + (m0 + (m < mr ? m : mr - 1)) * pam;
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
            if (g.init == kn_mlp::INIT_ACC) {
                const float* c = g.C + (m0 + (m < mr ? m : mr - 1)) * g.ldc + n0 + v * W;
                acc[m][v] = FULL || v + 1 < NV ? _mm512_loadu_ps(c) : _mm512_maskz_loadu_ps(last, c);
            } else if (g.init == kn_mlp::INIT_BIAS) {
                acc[m][v] = bias_or_zero(g, n0, v, last, FULL || v + 1 < NV);
            } else {
                acc[m][v] = _mm512_setzero_ps();
            }
        }
    }
    const int epi = g.epi;
    const uint32_t* bp = b + n0;
    for (int64_t i = 0; i < k2; ++i, bp += npad) {
        __m512bh bv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512((const void*)(bp + v * W));
        const int64_t ka = i * pak;
#pragma GCC unroll 16
        for (int m = 0; m < MR; ++m) {
            const __m512bh av = (__m512bh)_mm512_set1_epi32((int)ar[m][ka]);
#pragma GCC unroll 4
            for (int v = 0; v < NV; ++v) acc[m][v] = _mm512_dpbf16_ps(acc[m][v], av, bv[v]);
        }
    }
#pragma GCC unroll 16
    for (int m = 0; m < MR; ++m) {
        if (m >= mr) break;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
            kn_mlp_avx512::finish(g, epi, m0 + m, n0 + v * W, {acc[m][v]}, FULL || v + 1 < NV, last);
    }
}

template <int NV, bool FULL>
inline void tile_rows(const GemmArgs& g, const uint32_t* a, int64_t pam, int64_t pak, const uint32_t* b,
                      int64_t npad, int64_t k2, int64_t n0, __mmask16 last) {
    constexpr int MR = kn_mlp_avx512::rows_for<NV>();
    int64_t m0 = 0;
    for (; g.M - m0 >= MR; m0 += MR) tile<MR, NV, FULL>(g, a, pam, pak, b, npad, k2, m0, MR, n0, last);
    const int left = (int)(g.M - m0);
    if (left <= 0) return;
    if (left <= 2)
        tile<2, NV, FULL>(g, a, pam, pak, b, npad, k2, m0, left, n0, last);
    else if (left <= 4)
        tile<4, NV, FULL>(g, a, pam, pak, b, npad, k2, m0, left, n0, last);
    else
        tile<MR, NV, FULL>(g, a, pam, pak, b, npad, k2, m0, left, n0, last);
}

template <int NV>
inline void tile_rows(const GemmArgs& g, const uint32_t* a, int64_t pam, int64_t pak, const uint32_t* b,
                      int64_t npad, int64_t k2, int64_t n0, int64_t cols, __mmask16 last) {
    if (cols == (int64_t)NV * W)
        tile_rows<NV, true>(g, a, pam, pak, b, npad, k2, n0, last);
    else
        tile_rows<NV, false>(g, a, pam, pak, b, npad, k2, n0, last);
}

// Heap words for a pack too large for the stack buffer, freed on return.
struct HeapWords {
    uint32_t* p = nullptr;
    uint32_t* get(int64_t n, uint32_t* stack) {
        if (n <= PACK_WORDS) return stack;
        p = new uint32_t[(size_t)n];
        return p;
    }
    ~HeapWords() { delete[] p; }
};

// C = init + A B (kn_mlp::GemmArgs) with bfloat16 products. A is read row-major (sak == 1, maybe
// continued by A2) or transposed (sam == 1, no A2): the two layouts the fused MLP uses; another
// one runs `other` (float32 products).
inline void gemm(const GemmArgs& g, void (*other)(const GemmArgs&)) {
    if (g.M <= 0 || g.N <= 0) return;
    const int64_t k2 = (g.K + 1) / 2;
    const int64_t npad = (g.N + W - 1) / W * W;
    const bool rows = g.sak == 1, cols = g.sam == 1 && g.A2 == nullptr;
    const int64_t mpad = (g.M + W - 1) / W * W;
    if (k2 == 0 || (!rows && !cols)) {
        other(g);
        return;
    }
    alignas(64) uint32_t bstack[PACK_WORDS];
    alignas(64) uint32_t astack[PACK_WORDS];
    HeapWords bheap, aheap;
    uint32_t* bpack = bheap.get(k2 * npad, bstack);
    uint32_t* apack = aheap.get(rows ? g.M * k2 : k2 * mpad, astack);
    for (int64_t i = 0; i < k2; ++i) {
        const float* r1 = 2 * i + 1 < g.K ? g.B + (2 * i + 1) * g.ldb : nullptr;
        pack_row_pairs(g.B + 2 * i * g.ldb, r1, g.N, npad, bpack + i * npad);
    }
    int64_t pam, pak;
    if (rows) {
        // Row m: A(m, 0..K) as bfloat16, a zero after an odd K; two bfloat16 make a pair word.
        const int64_t K1 = g.A2 ? g.K1 : g.K;
        for (int64_t m = 0; m < g.M; ++m) {
            uint16_t* out = (uint16_t*)(apack + m * k2);
            to_bf16(g.A + m * g.sam, K1, out);
            if (g.K > K1) to_bf16(g.A2 + m * g.sam2, g.K - K1, out + K1);
            if (g.K & 1) out[g.K] = 0;
        }
        pam = k2, pak = 1;
    } else {
        // Transposed: A(m, k) = A[k * sak + m], so rows 2i and 2i + 1 of that storage pair up.
        for (int64_t i = 0; i < k2; ++i) {
            const float* r1 = 2 * i + 1 < g.K ? g.A + (2 * i + 1) * g.sak : nullptr;
            pack_row_pairs(g.A + 2 * i * g.sak, r1, g.M, mpad, apack + i * mpad);
        }
        pam = 1, pak = mpad;
    }
    constexpr int64_t PANEL = (int64_t)NV_MAX * W;
    for (int64_t n0 = 0; n0 < g.N; n0 += PANEL) {
        const int64_t cols_here = g.N - n0 < PANEL ? g.N - n0 : PANEL;
        const int nv = (int)((cols_here + W - 1) / W);
        const __mmask16 last = mask_first(cols_here - (int64_t)(nv - 1) * W);
        switch (nv) {
            case 1: tile_rows<1>(g, apack, pam, pak, bpack, npad, k2, n0, cols_here, last); break;
            case 2: tile_rows<2>(g, apack, pam, pak, bpack, npad, k2, n0, cols_here, last); break;
            case 3: tile_rows<3>(g, apack, pam, pak, bpack, npad, k2, n0, cols_here, last); break;
            case 4: tile_rows<4>(g, apack, pam, pak, bpack, npad, k2, n0, cols_here, last); break;
        }
    }
}

inline void gemm_avx512_fallback(const GemmArgs& g) { gemm(g, kn_mlp_avx512::gemm); }

}  // namespace kn_mlp_bf16
