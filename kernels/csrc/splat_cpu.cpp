// Torch binding of the splat compositors: OpenMP loops over the bodies in splat.h on the CPU and,
// when built with -DKN_SPLAT_CUDA next to splat.cu, the CUDA launchers for CUDA tensors.
// Its own extension (kernels/splat.py builds it), so it never waits on the other kernels' build.
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "splat.h"

#if defined(KN_SPLAT_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

int n_threads() { return std::max(1, at::get_num_threads()); }

void check(const at::Tensor& t, const char* name, const at::Tensor& like) {
    TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
    TORCH_CHECK(t.device() == like.device(), name, " must be on ", like.device());
}

struct Inputs {
    at::Tensor means, conics, colors, opac;
    int64_t n;
};

Inputs inputs(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors, const at::Tensor& opac) {
    const int64_t n = means.size(0);
    TORCH_CHECK(means.dim() == 2 && means.size(1) == 2, "means2d must be (N, 2)");
    TORCH_CHECK(conics.dim() == 2 && conics.size(0) == n && conics.size(1) == 3, "conics must be (N, 3)");
    TORCH_CHECK(colors.dim() == 2 && colors.size(0) == n && colors.size(1) == 3, "colors must be (N, 3)");
    TORCH_CHECK(opac.dim() == 1 && opac.size(0) == n, "opacities must be (N,)");
    const auto st = means.scalar_type();
    TORCH_CHECK(st == at::kFloat || st == at::kDouble, "splat tensors must be float32 or float64");
    for (const auto* t : {&conics, &colors, &opac}) TORCH_CHECK(t->scalar_type() == st, "splat tensors must share a dtype");
    check(means, "means2d", means);
    check(conics, "conics", means);
    check(colors, "colors", means);
    check(opac, "opacities", means);
    return {means, conics, colors, opac, n};
}

template <typename T>
kn::SplatParams<T> params(double a0, double a1, double st) {
    return kn::SplatParams<T>{(T)a0, (T)a1, (T)st};
}

// Per-thread gradient buffers summed at the end: no atomics, same totals whatever the schedule
// up to float summation order.
template <typename T, typename Body>
void with_thread_grads(int64_t n, T* grads, Body body) {
    const int nt = n_threads();
    std::vector<T> bufs((size_t)(nt > 1 ? nt - 1 : 0) * n * kn::SPLAT_GRADS, T(0));
#pragma omp parallel num_threads(nt)
    {
        const int tid = omp_get_thread_num();
        T* mine = tid == 0 ? grads : bufs.data() + (size_t)(tid - 1) * n * kn::SPLAT_GRADS;
        body(mine);
    }
    const int64_t total = n * kn::SPLAT_GRADS;
    for (int t = 1; t < nt; ++t) {
        const T* b = bufs.data() + (size_t)(t - 1) * total;
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t k = 0; k < total; ++k) grads[k] += b[k];
    }
}

struct PlainAdd {
    template <typename T>
    void operator()(T* p, T v) const { *p += v; }
};

// ------------------------------------------------------------------------------------ naive (CPU)

template <typename T>
void naive_fwd_cpu(int H, int W, const Inputs& in, const kn::SplatParams<T>& prm, T* rgb, T* tr, int32_t* cnt) {
    const T *m = in.means.data_ptr<T>(), *c = in.conics.data_ptr<T>(), *col = in.colors.data_ptr<T>(),
            *o = in.opac.data_ptr<T>();
    const int64_t P = (int64_t)H * W;
#pragma omp parallel for schedule(dynamic, 64) num_threads(n_threads())
    for (int64_t pix = 0; pix < P; ++pix) kn::naive_forward_pixel<T>(pix, W, in.n, m, c, col, o, prm, rgb, tr, cnt);
}

template <typename T>
void naive_bwd_cpu(int H, int W, const Inputs& in, const kn::SplatParams<T>& prm, const T* fT, const int32_t* fn,
                   const T* gr, const T* gT, T* grads) {
    const T *m = in.means.data_ptr<T>(), *c = in.conics.data_ptr<T>(), *col = in.colors.data_ptr<T>(),
            *o = in.opac.data_ptr<T>();
    const int64_t P = (int64_t)H * W;
    with_thread_grads<T>(in.n, grads, [&](T* mine) {
#pragma omp for schedule(dynamic, 64)
        for (int64_t pix = 0; pix < P; ++pix)
            kn::naive_backward_pixel<T>(pix, W, m, c, col, o, prm, fT, fn, gr, gT, mine, PlainAdd{});
    });
}

// ------------------------------------------------------------------------------------ tiled (CPU)
// One OpenMP task per tile; each batch of the tile's list is copied into a small local array (the
// GPU's shared memory) and then read by the tile's pixels, which stop one by one.

template <typename T>
void tiled_fwd_cpu(int H, int W, const int64_t* off, const int32_t* ids, const Inputs& in,
                   const kn::SplatParams<T>& prm, T* rgb, T* tr, int32_t* cnt) {
    const T *m = in.means.data_ptr<T>(), *c = in.conics.data_ptr<T>(), *col = in.colors.data_ptr<T>(),
            *o = in.opac.data_ptr<T>();
    const int tx = kn::splat_tiles_x(W), n_tiles = tx * kn::splat_tiles_y(H);
#pragma omp parallel for schedule(dynamic, 1) num_threads(n_threads())
    for (int tile = 0; tile < n_tiles; ++tile) {
        const int x0 = (tile % tx) * kn::SPLAT_TILE, y0 = (tile / tx) * kn::SPLAT_TILE;
        const int tw = std::min(kn::SPLAT_TILE, W - x0), th = std::min(kn::SPLAT_TILE, H - y0);
        kn::PixelFwd<T> px[kn::SPLAT_BATCH];
        kn::SplatRec<T> batch[kn::SPLAT_BATCH];
        for (int k = 0; k < tw * th; ++k) px[k] = kn::pixel_fwd_init<T>();
        int alive = tw * th;
        const int64_t start = off[tile], end = off[tile + 1];
        for (int64_t b = start; b < end && alive > 0; b += kn::SPLAT_BATCH) {
            const int nb = (int)std::min<int64_t>(kn::SPLAT_BATCH, end - b);
            for (int k = 0; k < nb; ++k) batch[k] = kn::load_splat<T>(ids[b + k], m, c, col, o);
            for (int q = 0; q < tw * th; ++q) {
                kn::PixelFwd<T>& p = px[q];
                if (p.done) continue;
                const T fx = T(x0 + q % tw) + T(0.5), fy = T(y0 + q / tw) + T(0.5);
                for (int k = 0; k < nb && !p.done; ++k) kn::pixel_fwd_step(p, batch[k], fx, fy, prm, (int32_t)(b - start + k));
                if (p.done) --alive;
            }
        }
        for (int q = 0; q < tw * th; ++q) {
            const int64_t pix = (int64_t)(y0 + q / tw) * W + x0 + q % tw;
            rgb[3 * pix] = px[q].r;
            rgb[3 * pix + 1] = px[q].g;
            rgb[3 * pix + 2] = px[q].b;
            tr[pix] = px[q].trans;
            cnt[pix] = px[q].n;
        }
    }
}

template <typename T>
void tiled_bwd_cpu(int H, int W, const int64_t* off, const int32_t* ids, const Inputs& in,
                   const kn::SplatParams<T>& prm, const T* fT, const int32_t* fn, const T* gr, const T* gT, T* grads) {
    const T *m = in.means.data_ptr<T>(), *c = in.conics.data_ptr<T>(), *col = in.colors.data_ptr<T>(),
            *o = in.opac.data_ptr<T>();
    const int tx = kn::splat_tiles_x(W), n_tiles = tx * kn::splat_tiles_y(H);
    with_thread_grads<T>(in.n, grads, [&](T* mine) {
        kn::PixelBwd<T> px[kn::SPLAT_BATCH];
        kn::SplatRec<T> batch[kn::SPLAT_BATCH];
        int32_t pn[kn::SPLAT_BATCH];
        T out[kn::SPLAT_GRADS];
#pragma omp for schedule(dynamic, 1)
        for (int tile = 0; tile < n_tiles; ++tile) {
            const int x0 = (tile % tx) * kn::SPLAT_TILE, y0 = (tile / tx) * kn::SPLAT_TILE;
            const int tw = std::min(kn::SPLAT_TILE, W - x0), th = std::min(kn::SPLAT_TILE, H - y0);
            int32_t deepest = 0;
            for (int q = 0; q < tw * th; ++q) {
                const int64_t pix = (int64_t)(y0 + q / tw) * W + x0 + q % tw;
                px[q] = kn::pixel_bwd_init<T>(fT[pix], gr + 3 * pix, gT[pix]);
                pn[q] = fn[pix];
                deepest = std::max(deepest, pn[q]);
            }
            const int64_t start = off[tile];
            for (int64_t bi = (deepest + kn::SPLAT_BATCH - 1) / kn::SPLAT_BATCH - 1; bi >= 0; --bi) {
                const int64_t b = start + bi * kn::SPLAT_BATCH;
                const int nb = (int)std::min<int64_t>(kn::SPLAT_BATCH, deepest - bi * kn::SPLAT_BATCH);
                for (int k = 0; k < nb; ++k) batch[k] = kn::load_splat<T>(ids[b + k], m, c, col, o);
                for (int q = 0; q < tw * th; ++q) {
                    const T fx = T(x0 + q % tw) + T(0.5), fy = T(y0 + q / tw) + T(0.5);
                    for (int k = std::min<int64_t>(nb, pn[q] - bi * kn::SPLAT_BATCH) - 1; k >= 0; --k) {
                        if (!kn::pixel_bwd_step(px[q], batch[k], fx, fy, prm, out)) continue;
                        T* g = mine + (int64_t)kn::SPLAT_GRADS * ids[b + k];
                        for (int z = 0; z < kn::SPLAT_GRADS; ++z) g[z] += out[z];
                    }
                }
            }
        }
    });
}

// ------------------------------------------------------------------------------------ dispatch

std::vector<at::Tensor> alloc_fwd(int64_t H, int64_t W, const at::Tensor& like) {
    return {at::zeros({H, W, 3}, like.options()), at::ones({H, W}, like.options()),
            at::zeros({H, W}, like.options().dtype(at::kInt))};
}

void check_tiles(const at::Tensor& off, const at::Tensor& ids, int64_t H, int64_t W, const at::Tensor& like) {
    const int64_t n_tiles = (int64_t)kn::splat_tiles_x((int)W) * kn::splat_tiles_y((int)H);
    TORCH_CHECK(off.scalar_type() == at::kLong && off.numel() == n_tiles + 1, "tile_offsets must be int64 (n_tiles + 1,)");
    TORCH_CHECK(ids.scalar_type() == at::kInt, "tile_ids must be int32");
    check(off, "tile_offsets", like);
    check(ids, "tile_ids", like);
}

void check_bwd(const at::Tensor& fT, const at::Tensor& fn, const at::Tensor& gr, const at::Tensor& gT, int64_t H,
               int64_t W, const at::Tensor& like) {
    TORCH_CHECK(fT.numel() == H * W && fn.numel() == H * W && gT.numel() == H * W && gr.numel() == H * W * 3,
                "backward buffers must match the image size");
    TORCH_CHECK(fn.scalar_type() == at::kInt, "n_contrib must be int32");
    TORCH_CHECK(fT.scalar_type() == like.scalar_type() && gr.scalar_type() == like.scalar_type() &&
                    gT.scalar_type() == like.scalar_type(), "backward buffers must share the splats' dtype");
    check(fT, "final_T", like);
    check(fn, "n_contrib", like);
    check(gr, "grad_rgb", like);
    check(gT, "grad_T", like);
}

#if defined(KN_SPLAT_CUDA)
void cuda_ok(cudaError_t e) { TORCH_CHECK(e == cudaSuccess, "splat CUDA launch failed: ", cudaGetErrorString(e)); }
int dtype_code(const at::Tensor& t) { return t.scalar_type() == at::kDouble ? 1 : 0; }
#endif

std::vector<at::Tensor> naive_forward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                                      const at::Tensor& opac, int64_t H, int64_t W, double a0, double a1, double st) {
    const Inputs in = inputs(means, conics, colors, opac);
    auto out = alloc_fwd(H, W, means);
    if (means.is_cuda()) {
#if defined(KN_SPLAT_CUDA)
        cuda_ok(kn_cuda::splat_naive_forward(dtype_code(means), (int)H, (int)W, in.n, means.data_ptr(), conics.data_ptr(),
                                             colors.data_ptr(), opac.data_ptr(), a0, a1, st, out[0].data_ptr(),
                                             out[1].data_ptr(), out[2].data_ptr<int32_t>(),
                                             c10::cuda::getCurrentCUDAStream().stream()));
        return out;
#else
        TORCH_CHECK(false, "this splat extension was built without CUDA");
#endif
    }
    AT_DISPATCH_FLOATING_TYPES(means.scalar_type(), "splat_naive_forward", [&] {
        naive_fwd_cpu<scalar_t>((int)H, (int)W, in, params<scalar_t>(a0, a1, st), out[0].data_ptr<scalar_t>(),
                                out[1].data_ptr<scalar_t>(), out[2].data_ptr<int32_t>());
    });
    return out;
}

at::Tensor naive_backward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opac, int64_t H, int64_t W, double a0, double a1, double st,
                          const at::Tensor& fT, const at::Tensor& fn, const at::Tensor& gr, const at::Tensor& gT) {
    const Inputs in = inputs(means, conics, colors, opac);
    check_bwd(fT, fn, gr, gT, H, W, means);
    auto grads = at::zeros({in.n, kn::SPLAT_GRADS}, means.options());
    if (means.is_cuda()) {
#if defined(KN_SPLAT_CUDA)
        cuda_ok(kn_cuda::splat_naive_backward(dtype_code(means), (int)H, (int)W, means.data_ptr(), conics.data_ptr(),
                                              colors.data_ptr(), opac.data_ptr(), a0, a1, st, fT.data_ptr(),
                                              fn.data_ptr<int32_t>(), gr.data_ptr(), gT.data_ptr(), grads.data_ptr(),
                                              c10::cuda::getCurrentCUDAStream().stream()));
        return grads;
#else
        TORCH_CHECK(false, "this splat extension was built without CUDA");
#endif
    }
    AT_DISPATCH_FLOATING_TYPES(means.scalar_type(), "splat_naive_backward", [&] {
        naive_bwd_cpu<scalar_t>((int)H, (int)W, in, params<scalar_t>(a0, a1, st), fT.data_ptr<scalar_t>(),
                                fn.data_ptr<int32_t>(), gr.data_ptr<scalar_t>(), gT.data_ptr<scalar_t>(),
                                grads.data_ptr<scalar_t>());
    });
    return grads;
}

std::vector<at::Tensor> tiled_forward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                                      const at::Tensor& opac, int64_t H, int64_t W, const at::Tensor& off,
                                      const at::Tensor& ids, double a0, double a1, double st) {
    const Inputs in = inputs(means, conics, colors, opac);
    check_tiles(off, ids, H, W, means);
    auto out = alloc_fwd(H, W, means);
    if (means.is_cuda()) {
#if defined(KN_SPLAT_CUDA)
        cuda_ok(kn_cuda::splat_tiled_forward(dtype_code(means), (int)H, (int)W, off.data_ptr<int64_t>(),
                                             ids.data_ptr<int32_t>(), means.data_ptr(), conics.data_ptr(),
                                             colors.data_ptr(), opac.data_ptr(), a0, a1, st, out[0].data_ptr(),
                                             out[1].data_ptr(), out[2].data_ptr<int32_t>(),
                                             c10::cuda::getCurrentCUDAStream().stream()));
        return out;
#else
        TORCH_CHECK(false, "this splat extension was built without CUDA");
#endif
    }
    AT_DISPATCH_FLOATING_TYPES(means.scalar_type(), "splat_tiled_forward", [&] {
        tiled_fwd_cpu<scalar_t>((int)H, (int)W, off.data_ptr<int64_t>(), ids.data_ptr<int32_t>(), in,
                                params<scalar_t>(a0, a1, st), out[0].data_ptr<scalar_t>(), out[1].data_ptr<scalar_t>(),
                                out[2].data_ptr<int32_t>());
    });
    return out;
}

at::Tensor tiled_backward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                          const at::Tensor& opac, int64_t H, int64_t W, const at::Tensor& off, const at::Tensor& ids,
                          double a0, double a1, double st, const at::Tensor& fT, const at::Tensor& fn,
                          const at::Tensor& gr, const at::Tensor& gT) {
    const Inputs in = inputs(means, conics, colors, opac);
    check_tiles(off, ids, H, W, means);
    check_bwd(fT, fn, gr, gT, H, W, means);
    auto grads = at::zeros({in.n, kn::SPLAT_GRADS}, means.options());
    if (means.is_cuda()) {
#if defined(KN_SPLAT_CUDA)
        cuda_ok(kn_cuda::splat_tiled_backward(dtype_code(means), (int)H, (int)W, off.data_ptr<int64_t>(),
                                              ids.data_ptr<int32_t>(), means.data_ptr(), conics.data_ptr(),
                                              colors.data_ptr(), opac.data_ptr(), a0, a1, st, fT.data_ptr(),
                                              fn.data_ptr<int32_t>(), gr.data_ptr(), gT.data_ptr(), grads.data_ptr(),
                                              c10::cuda::getCurrentCUDAStream().stream()));
        return grads;
#else
        TORCH_CHECK(false, "this splat extension was built without CUDA");
#endif
    }
    AT_DISPATCH_FLOATING_TYPES(means.scalar_type(), "splat_tiled_backward", [&] {
        tiled_bwd_cpu<scalar_t>((int)H, (int)W, off.data_ptr<int64_t>(), ids.data_ptr<int32_t>(), in,
                                params<scalar_t>(a0, a1, st), fT.data_ptr<scalar_t>(), fn.data_ptr<int32_t>(),
                                gr.data_ptr<scalar_t>(), gT.data_ptr<scalar_t>(), grads.data_ptr<scalar_t>());
    });
    return grads;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("naive_forward", &naive_forward);
    m.def("naive_backward", &naive_backward);
    m.def("tiled_forward", &tiled_forward);
    m.def("tiled_backward", &tiled_backward);
}
