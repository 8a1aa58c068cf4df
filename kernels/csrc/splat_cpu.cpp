// CPU torch binding of the splat compositors: OpenMP loops over the bodies in splat.h. Same
// functions and checks (binding_checks.h) as splat_cuda_binding.cpp. Its own extension
// (kernels._ext.SPLAT), so it never waits on the NeRF kernels' build.
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "binding_checks.h"
#include "splat.h"

namespace {

using kn_bind::n_threads;

struct Inputs {
    at::Tensor means, conics, colors, opac;
    int64_t n;
};

Inputs inputs(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors, const at::Tensor& opac) {
    TORCH_CHECK(means.is_cpu(), "splat: this is the CPU module, got a tensor on ", means.device());
    kn_bind::check_splats(means, conics, colors, opac);
    return {means, conics, colors, opac, means.size(0)};
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
            // A pixel never walks past its tile's list, whatever n_contrib says.
            const int32_t listed = (int32_t)(off[tile + 1] - off[tile]);
            for (int q = 0; q < tw * th; ++q) {
                const int64_t pix = (int64_t)(y0 + q / tw) * W + x0 + q % tw;
                px[q] = kn::pixel_bwd_init<T>(fT[pix], gr + 3 * pix, gT[pix]);
                pn[q] = std::min(fn[pix], listed);
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

std::vector<at::Tensor> naive_forward(const at::Tensor& means, const at::Tensor& conics, const at::Tensor& colors,
                                      const at::Tensor& opac, int64_t H, int64_t W, double a0, double a1, double st) {
    const Inputs in = inputs(means, conics, colors, opac);
    kn_bind::check_image(H, W);
    auto out = alloc_fwd(H, W, means);
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
    kn_bind::check_image(H, W);
    kn_bind::check_splat_backward(fT, fn, gr, gT, H, W, means, in.n);
    auto grads = at::zeros({in.n, kn::SPLAT_GRADS}, means.options());
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
    kn_bind::check_image(H, W);
    kn_bind::check_tiles(off, ids, H, W, in.n, means.device());
    auto out = alloc_fwd(H, W, means);
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
    kn_bind::check_image(H, W);
    kn_bind::check_tiles(off, ids, H, W, in.n, means.device());
    kn_bind::check_splat_backward(fT, fn, gr, gT, H, W, means, kn_bind::longest_tile(off));
    auto grads = at::zeros({in.n, kn::SPLAT_GRADS}, means.options());
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
