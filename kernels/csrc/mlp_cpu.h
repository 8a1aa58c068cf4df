// CPU body of the NeRF field's two MLPs, fused over blocks of samples (tiny-cuda-nn's "fully
// fused MLP", for caches instead of shared memory).
//
// The field: h = density_net(enc); sigma = trunc_exp(h[:, 0] - shift); rgb =
// sigmoid(color_net([sh, h[:, 1:]])), every hidden layer Linear + ReLU. torch.nn.Linear runs each
// layer over all N samples, so every (N, 64) activation crosses memory several times (matrix
// product, ReLU, the backward's mask and both gradient products). Here each OpenMP thread takes a
// block of rows and runs every layer on it while its activations stay in L1/L2. The backward
// recomputes a block's activations from the inputs (enc, sh) instead of reading saved ones, then
// back-propagates through it: writing the ~1 KB of activations per row to memory and reading them
// back costs more than recomputing them (a fresh allocation of that size more still, in page
// faults). Only the forward's outputs (sigma, rgb) are reused: they spare the colour network's
// last layer and the exponentials of both heads.
//
// Weight and bias gradients: the rows are cut into groups that do not depend on the thread count
// (kn_mlp::plan). Each group adds its blocks, in order, into its own accumulator, and the groups
// are summed in group order at the end, so the gradients have the same bits for any thread count.
//
// The products are register-tiled loops (mlp_cpu_isa.h) built for AVX-512, AVX2 + FMA and plain
// C++, picked at run time from what the CPU has; with AVX-512 BF16, products of bfloat16-rounded
// operands (mlp_cpu_bf16.h) when asked for.
#pragma once

#include <omp.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define KN_MLP_X86 1
#endif

#include "mlp.h"

namespace kn_mlp {

enum Init : int { INIT_ZERO = 0, INIT_BIAS = 1, INIT_ACC = 2 };
enum Epilogue : int { EPI_NONE = 0, EPI_RELU = 1, EPI_MASK = 2 };

// C[m, n] = init + sum over k < K of A(m, k) * B[k, n], for m < M, n < N, then the epilogue.
// A(m, k) = A[m * sam + k * sak]: sam = 1 and sak = rows reads a row-major matrix transposed.
// B and C are row-major with row strides ldb and ldc. init: zero, bias[n] or C's own value.
// Epilogue: none, ReLU, or zero wherever R[m * ldr + n] <= 0 (the ReLU's backward).
// With A2 not null, A(m, k) for k >= K1 is A2[m * sam2 + (k - K1) * sak] instead: A's columns
// continued by another matrix's.
struct GemmArgs {
    int64_t M, N, K;
    const float* A;
    int64_t sam, sak;
    const float* A2;
    int64_t sam2, K1;
    const float* B;
    int64_t ldb;
    float* C;
    int64_t ldc;
    const float* bias;
    int init, epi;
    const float* R;
    int64_t ldr;
};

}  // namespace kn_mlp

#if defined(KN_MLP_X86)
#pragma GCC push_options
#pragma GCC target("avx512f")
#define KN_MLP_ISA 512
#define KN_MLP_NS kn_mlp_avx512
#include "mlp_cpu_isa.h"
#undef KN_MLP_NS
#undef KN_MLP_ISA
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#include "mlp_cpu_bf16.h"
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
#define KN_MLP_ISA 256
#define KN_MLP_NS kn_mlp_avx2
#include "mlp_cpu_isa.h"
#undef KN_MLP_NS
#undef KN_MLP_ISA
#pragma GCC pop_options
#endif

#define KN_MLP_ISA 0
#define KN_MLP_NS kn_mlp_portable
#include "mlp_cpu_isa.h"
#undef KN_MLP_NS
#undef KN_MLP_ISA

namespace kn_mlp {

// Instruction sets, by the register width they use. ISA_AVX512_BF16 multiplies in bfloat16
// (mlp_cpu_bf16.h): other numbers, so it is never picked by itself, only asked for.
constexpr int ISA_PORTABLE = 0, ISA_AVX2 = 256, ISA_AVX512 = 512, ISA_AVX512_BF16 = 1024;

inline bool isa_supported(int isa) {
    if (isa == ISA_PORTABLE) return true;
#if defined(KN_MLP_X86)
    if (isa == ISA_AVX2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == ISA_AVX512) return __builtin_cpu_supports("avx512f");
    if (isa == ISA_AVX512_BF16)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bf16");
#endif
    return false;
}

inline int best_isa() {
    static const int best = isa_supported(ISA_AVX512) ? ISA_AVX512 : isa_supported(ISA_AVX2) ? ISA_AVX2 : ISA_PORTABLE;
    return best;
}

struct Kernels {
    void (*gemm)(const GemmArgs&);
    void (*colsum)(int64_t, int64_t, const float*, int64_t, float*);
};

inline Kernels kernels_for(int isa) {
#if defined(KN_MLP_X86)
    if (isa == ISA_AVX512) return {kn_mlp_avx512::gemm, kn_mlp_avx512::colsum};
    if (isa == ISA_AVX512_BF16) return {kn_mlp_bf16::gemm_avx512_fallback, kn_mlp_avx512::colsum};
    if (isa == ISA_AVX2) return {kn_mlp_avx2::gemm, kn_mlp_avx2::colsum};
#endif
    return {kn_mlp_portable::gemm, kn_mlp_portable::colsum};
}

constexpr int MAX_LAYERS = 16;

struct Layer {
    int64_t in, out;
    const float* w;   // (out, in), nn.Linear's layout: the backward's right-hand side
    const float* wt;  // (in, out): the forward's right-hand side
    const float* b;   // (out,)
    int64_t gw, gb;   // where this layer's weight and bias gradients start in the flat accumulator
};

struct Net {
    int n_layers = 0;
    Layer layer[MAX_LAYERS];
    int64_t width_sum() const {
        int64_t s = 0;
        for (int l = 0; l < n_layers; ++l) s += layer[l].out;
        return s;
    }
    int64_t max_width() const {
        int64_t s = layer[0].in;
        for (int l = 0; l < n_layers; ++l) s = layer[l].out > s ? layer[l].out : s;
        return s;
    }
};

// density: n_in -> ... -> 1 + n_geo; color (absent for sigma alone): n_sh + n_geo -> ... -> 3.
struct Field {
    Net density, color;
    int64_t n_in = 0, n_sh = 0, n_geo = 0;
    int64_t n_params = 0;  // floats in the flat gradient accumulator
    float shift = 0.f;
    bool has_color() const { return color.n_layers > 0; }
    int64_t n_cin() const { return n_sh + n_geo; }
};

// Rows are processed in blocks of `block` rows; gradients accumulate per group of `group_rows`
// rows (a multiple of the block). Neither depends on the thread count.
struct Plan {
    int64_t block = 0, group_rows = 0, n_groups = 0;
};

constexpr int64_t MIN_GROUP_ROWS = 1024;
constexpr int64_t MAX_GROUPS = 64;
constexpr int64_t ACC_BUDGET_FLOATS = int64_t(1) << 24;  // 64 MB of per-group accumulators at most

inline int64_t default_block(const Field& f) {
    // About 64 KB for the widest activation of a block, in whole 16-row steps.
    int64_t w = f.density.max_width();
    if (f.has_color()) w = f.color.max_width() > w ? f.color.max_width() : w;
    int64_t b = (int64_t(1) << 14) / (w > 0 ? w : 1);
    b = b < 16 ? 16 : (b > 256 ? 256 : b);
    return b / 16 * 16;
}

inline Plan plan(const Field& f, int64_t n, int64_t block) {
    Plan p;
    p.block = block > 0 ? block : default_block(f);
    if (n <= 0) return p;
    int64_t groups = (n + MIN_GROUP_ROWS - 1) / MIN_GROUP_ROWS;
    if (groups > MAX_GROUPS) groups = MAX_GROUPS;
    const int64_t by_budget = ACC_BUDGET_FLOATS / (f.n_params > 0 ? f.n_params : 1);
    if (groups > by_budget) groups = by_budget;
    if (groups < 1) groups = 1;
    const int64_t per = (n + groups - 1) / groups;
    p.group_rows = (per + p.block - 1) / p.block * p.block;
    p.n_groups = (n + p.group_rows - 1) / p.group_rows;
    return p;
}

// A network's input as two row-major parts side by side: columns [0, cols) from x (row stride ldx),
// the rest from x2 (row stride ldx2). The colour network reads [sh, h[:, 1:]] where they are, not
// from a copy.
struct Input {
    const float* x;
    int64_t ldx, cols;
    const float* x2;
    int64_t ldx2;
};

// Where the input gradient goes, split as its Input: columns [0, cols) to dx, the rest to dx2; a
// null part is not computed.
struct InputGrad {
    float* dx;
    int64_t lddx;
    float* dx2;
    int64_t lddx2;
};

// Layer l of `net` reads `in` (nb rows) or layer l - 1's output and writes out[l] (row stride = its
// width). `last_cols` < the last layer's width computes only its first columns.
inline void net_forward(const Kernels& k, const Net& net, const Input& in, int64_t nb, float* const* out,
                        int64_t last_cols) {
    for (int l = 0; l < net.n_layers; ++l) {
        const Layer& L = net.layer[l];
        const bool last = l + 1 == net.n_layers;
        GemmArgs g{};
        g.M = nb;
        g.N = last ? last_cols : L.out;
        g.K = L.in;
        g.A = l == 0 ? in.x : out[l - 1];
        g.sam = l == 0 ? in.ldx : net.layer[l - 1].out;
        g.sak = 1;
        if (l == 0 && in.cols < L.in) {
            g.A2 = in.x2;
            g.sam2 = in.ldx2;
            g.K1 = in.cols;
        }
        g.B = L.wt;
        g.ldb = L.out;
        g.C = out[l];
        g.ldc = L.out;
        g.bias = L.b;
        g.init = INIT_BIAS;
        g.epi = last ? EPI_NONE : EPI_RELU;
        k.gemm(g);
    }
}

// dW[:, col0 : col0 + cols] (out x in) += dy^T (out x nb) . x (nb x cols).
inline void weight_grad(const Kernels& k, const Layer& L, const float* dy, int64_t nb, const float* x, int64_t ldx,
                        int64_t col0, int64_t cols, float* acc) {
    GemmArgs g{};
    g.M = L.out;
    g.N = cols;
    g.K = nb;
    g.A = dy;
    g.sam = 1;
    g.sak = L.out;
    g.B = x;
    g.ldb = ldx;
    g.C = acc + L.gw + col0;
    g.ldc = L.in;
    g.init = INIT_ACC;
    g.epi = EPI_NONE;
    k.gemm(g);
}

// dx (nb x cols) = dy (nb x out) . W[:, col0 : col0 + cols], zero wherever R <= 0 (the previous
// layer's ReLU) unless R is null.
inline void input_grad(const Kernels& k, const Layer& L, const float* dy, int64_t nb, int64_t col0, int64_t cols,
                       float* dx, int64_t lddx, const float* R) {
    GemmArgs g{};
    g.M = nb;
    g.N = cols;
    g.K = L.out;
    g.A = dy;
    g.sam = L.out;
    g.sak = 1;
    g.B = L.w + col0;
    g.ldb = L.in;
    g.C = dx;
    g.ldc = lddx;
    g.init = INIT_ZERO;
    g.epi = R ? EPI_MASK : EPI_NONE;
    g.R = R;
    g.ldr = L.in;
    k.gemm(g);
}

// Back-propagates dy (nb x the last width) through `net`, whose input was `in` and whose layer
// outputs are acts. Adds the weight and bias gradients into acc (unless null) and writes the input
// gradient where dx says. buf0 and buf1 hold nb x max_width floats each.
inline void net_backward(const Kernels& k, const Net& net, const Input& in, int64_t nb, float* const* acts,
                         const float* dy, const InputGrad& dx, float* acc, float* buf0, float* buf1) {
    const float* d = dy;
    for (int l = net.n_layers - 1; l >= 0; --l) {
        const Layer& L = net.layer[l];
        if (acc) {
            if (l > 0) {
                weight_grad(k, L, d, nb, acts[l - 1], L.in, 0, L.in, acc);
            } else {
                weight_grad(k, L, d, nb, in.x, in.ldx, 0, in.cols, acc);
                if (in.cols < L.in) weight_grad(k, L, d, nb, in.x2, in.ldx2, in.cols, L.in - in.cols, acc);
            }
            k.colsum(nb, L.out, d, L.out, acc + L.gb);
        }
        if (l == 0) {
            if (dx.dx) input_grad(k, L, d, nb, 0, in.cols, dx.dx, dx.lddx, nullptr);
            if (dx.dx2 && in.cols < L.in) input_grad(k, L, d, nb, in.cols, L.in - in.cols, dx.dx2, dx.lddx2, nullptr);
            break;
        }
        float* next = d == buf0 ? buf1 : buf0;
        input_grad(k, L, d, nb, 0, L.in, next, L.in, acts[l - 1]);
        d = next;
    }
}

// A thread's buffers for one block: every layer's output and the backward's gradients.
struct Workspace {
    std::vector<float> mem;
    float* dact[MAX_LAYERS] = {};
    float* cact[MAX_LAYERS] = {};
    float *dtop = nullptr, *dh = nullptr, *buf0 = nullptr, *buf1 = nullptr;

    Workspace(const Field& f, int64_t block) {
        const int64_t wd = f.density.max_width();
        const int64_t wc = f.has_color() ? f.color.max_width() : 0;
        const int64_t wmax = wd > wc ? wd : wc;
        const int64_t per_row =
            f.density.width_sum() + (f.has_color() ? f.color.width_sum() : 0) + 3 + (1 + f.n_geo) + 2 * wmax;
        mem.assign((size_t)(per_row * block), 0.f);
        float* p = mem.data();
        for (int l = 0; l < f.density.n_layers; ++l) {
            dact[l] = p;
            p += block * f.density.layer[l].out;
        }
        for (int l = 0; l < f.color.n_layers; ++l) {
            cact[l] = p;
            p += block * f.color.layer[l].out;
        }
        dtop = p, p += block * 3;
        dh = p, p += block * (1 + f.n_geo);
        buf0 = p, p += block * wmax;
        buf1 = p;
    }
};

// Rows r0... of enc for the density network.
inline Input density_input(const Field& f, const float* enc, int64_t r0) {
    return {enc + r0 * f.n_in, f.n_in, f.n_in, nullptr, 0};
}

// [sh, h[:, 1:]] from row r0 for the colour network; h: the block's density outputs.
inline Input color_input(const Field& f, const float* sh, int64_t r0, const float* h) {
    return {sh + r0 * f.n_sh, f.n_sh, f.n_sh, h + 1, 1 + f.n_geo};
}

// Forward of rows [r0, r0 + nb): sigma, and rgb when the field has a colour network and rgb is
// not null. dact/cact: where each layer's output goes.
inline void field_forward_block(const Kernels& k, const Field& f, const float* enc, const float* sh, int64_t r0,
                                int64_t nb, float* const* dact, float* const* cact, float* sigma, float* rgb) {
    const Net& D = f.density;
    const bool color = rgb && f.has_color();
    // Without colour only h[:, 0] is needed: one column of the last layer, the same bits.
    net_forward(k, D, density_input(f, enc, r0), nb, dact, color ? D.layer[D.n_layers - 1].out : 1);
    const float* h = dact[D.n_layers - 1];
    const int64_t ldh = 1 + f.n_geo;
    for (int64_t r = 0; r < nb; ++r) sigma[r0 + r] = kn::density_forward<float>(h[r * ldh], f.shift);
    if (!color) return;
    net_forward(k, f.color, color_input(f, sh, r0, h), nb, cact, 3);
    const float* z = cact[f.color.n_layers - 1];
    for (int64_t i = 0; i < nb * 3; ++i) rgb[r0 * 3 + i] = kn::sigmoid_forward<float>(z[i]);
}

struct Grads {
    const float* grad_sigma;  // (N,), null: zero
    const float* grad_rgb;    // (N, 3), null: zero
    float* grad_enc;          // (N, n_in) or null
    float* grad_sh;           // (N, n_sh) or null
    // The forward's sigma (N,) and rgb (N, 3) of the same inputs, or null: recomputed.
    const float* sigma = nullptr;
    const float* rgb = nullptr;
};

// Backward of rows [r0, r0 + nb): recomputes the block's forward, then back-propagates.
inline void field_backward_block(const Kernels& k, const Field& f, const float* enc, const float* sh, int64_t r0,
                                 int64_t nb, const Grads& gr, float* acc, Workspace& ws) {
    const Net& D = f.density;
    const bool color = f.has_color();
    const int64_t ldh = 1 + f.n_geo;
    net_forward(k, D, density_input(f, enc, r0), nb, ws.dact, D.layer[D.n_layers - 1].out);
    const float* h = ws.dact[D.n_layers - 1];
    if (color) {
        const Net& C = f.color;
        const Input cin = color_input(f, sh, r0, h);
        // With the forward's rgb the last layer's output is not needed (0 columns of it).
        net_forward(k, C, cin, nb, ws.cact, gr.rgb ? 0 : 3);
        const float* z = ws.cact[C.n_layers - 1];
        for (int64_t i = 0; i < nb * 3; ++i) {
            const float g = gr.grad_rgb ? gr.grad_rgb[r0 * 3 + i] : 0.f;
            const float y = gr.rgb ? gr.rgb[r0 * 3 + i] : kn::sigmoid_forward<float>(z[i]);
            ws.dtop[i] = kn::sigmoid_backward<float>(y, g);
        }
        // The geometry features' gradient lands in dh[:, 1:]; sh's only when asked for.
        const InputGrad dcin{gr.grad_sh ? gr.grad_sh + r0 * f.n_sh : nullptr, f.n_sh, ws.dh + 1, ldh};
        net_backward(k, C, cin, nb, ws.cact, ws.dtop, dcin, acc, ws.buf0, ws.buf1);
    } else {
        for (int64_t r = 0; r < nb; ++r)
            for (int64_t j = 1; j < ldh; ++j) ws.dh[r * ldh + j] = 0.f;
    }
    for (int64_t r = 0; r < nb; ++r) {
        const float g = gr.grad_sigma ? gr.grad_sigma[r0 + r] : 0.f;
        ws.dh[r * ldh] = gr.sigma ? kn::density_backward<float>(h[r * ldh], f.shift, gr.sigma[r0 + r], g)
                                  : kn::density_backward<float>(h[r * ldh], f.shift, g);
    }
    const InputGrad denc{gr.grad_enc ? gr.grad_enc + r0 * f.n_in : nullptr, f.n_in, nullptr, 0};
    net_backward(k, D, density_input(f, enc, r0), nb, ws.dact, ws.dh, denc, acc, ws.buf0, ws.buf1);
}

// sigma (n,) and, when rgb is not null, rgb (n, 3) of n rows of enc (n, n_in) and sh (n, n_sh).
inline void field_forward(int isa, const Field& f, const float* enc, const float* sh, int64_t n, float* sigma,
                          float* rgb, int64_t block, int n_threads) {
    if (n <= 0) return;
    const Kernels k = kernels_for(isa);
    const Plan p = plan(f, n, block);
    const int64_t n_blocks = (n + p.block - 1) / p.block;
#pragma omp parallel num_threads(n_threads)
    {
        Workspace ws(f, p.block);
        // Dynamic: on a shared machine one thread may be descheduled for a while.
#pragma omp for schedule(dynamic, 4)
        for (int64_t b = 0; b < n_blocks; ++b) {
            const int64_t r0 = b * p.block, nb = n - r0 < p.block ? n - r0 : p.block;
            field_forward_block(k, f, enc, sh, r0, nb, ws.dact, ws.cact, sigma, rgb);
        }
    }
}

// Gradients of n rows: grad_enc / grad_sh rows as asked in gr, and, when params is not null, the
// weight and bias gradients in the flat order of Layer::gw / gb (f.n_params floats).
inline void field_backward(int isa, const Field& f, const float* enc, const float* sh, int64_t n, const Grads& gr,
                           float* params, int64_t block, int n_threads) {
    if (params) std::memset(params, 0, sizeof(float) * f.n_params);
    if (n <= 0) return;
    const Kernels k = kernels_for(isa);
    const Plan p = plan(f, n, block);
    // Not zeroed here: each group clears its own part, so the pages are first touched in parallel.
    std::unique_ptr<float[]> acc(params ? new float[(size_t)(p.n_groups * f.n_params)] : nullptr);
#pragma omp parallel num_threads(n_threads)
    {
        Workspace ws(f, p.block);
#pragma omp for schedule(dynamic, 1)
        for (int64_t g = 0; g < p.n_groups; ++g) {
            float* a = params ? acc.get() + g * f.n_params : nullptr;
            if (a) std::memset(a, 0, sizeof(float) * f.n_params);
            const int64_t end = (g + 1) * p.group_rows < n ? (g + 1) * p.group_rows : n;
            for (int64_t r0 = g * p.group_rows; r0 < end; r0 += p.block) {
                const int64_t nb = end - r0 < p.block ? end - r0 : p.block;
                field_backward_block(k, f, enc, sh, r0, nb, gr, a, ws);
            }
        }
        if (params) {
            // Groups in order: the same sums whichever thread ran which group.
#pragma omp for schedule(static)
            for (int64_t i = 0; i < f.n_params; ++i) {
                float s = 0.f;
                for (int64_t g = 0; g < p.n_groups; ++g) s += acc[(size_t)(g * f.n_params + i)];
                params[i] = s;
            }
        }
    }
}

}  // namespace kn_mlp
