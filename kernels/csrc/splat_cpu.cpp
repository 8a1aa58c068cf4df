// CPU library of the splat compositors: defines the `nf_splat` schemas (ops.h) and registers their
// CPU kernels, OpenMP loops over the bodies in splat.h. Its own extension (kernels._ext.SPLAT), so
// it never waits on the NeRF kernels' build.
#include <torch/extension.h>
#include <omp.h>

#include <algorithm>
#include <vector>

#include "binding_checks.h"
#include "cpu_device.h"
#include "ops.h"
#include "splat.h"

namespace {

using kn_bind::n_threads;

// The splats' arrays, checked by the front end (ops.h).
template <typename T>
struct Inputs {
    const T *means, *conics, *colors, *opac;
    int64_t n;
};

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
void naive_fwd_cpu(int H, int W, const Inputs<T>& in, const kn::SplatParams<T>& prm, T* rgb, T* tr, int32_t* cnt) {
    const T *m = in.means, *c = in.conics, *col = in.colors, *o = in.opac;
    const int64_t P = (int64_t)H * W;
#pragma omp parallel for schedule(dynamic, 64) num_threads(n_threads())
    for (int64_t pix = 0; pix < P; ++pix) kn::naive_forward_pixel<T>(pix, W, in.n, m, c, col, o, prm, rgb, tr, cnt);
}

template <typename T>
void naive_bwd_cpu(int H, int W, const Inputs<T>& in, const kn::SplatParams<T>& prm, const T* fT, const int32_t* fn,
                   const T* gr, const T* gT, T* grads) {
    const T *m = in.means, *c = in.conics, *col = in.colors, *o = in.opac;
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
void tiled_fwd_cpu(int H, int W, const int64_t* off, const int32_t* ids, const Inputs<T>& in,
                   const kn::SplatParams<T>& prm, T* rgb, T* tr, int32_t* cnt) {
    const T *m = in.means, *c = in.conics, *col = in.colors, *o = in.opac;
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
void tiled_bwd_cpu(int H, int W, const int64_t* off, const int32_t* ids, const Inputs<T>& in,
                   const kn::SplatParams<T>& prm, const T* fT, const int32_t* fn, const T* gr, const T* gT, T* grads) {
    const T *m = in.means, *c = in.conics, *col = in.colors, *o = in.opac;
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

// ------------------------------------------------------------------------------------ the CPU device of ops.h

struct Cpu : kn_ops::CpuDevice {
    template <typename T>
    static Inputs<T> inputs(int64_t n, const void* means, const void* conics, const void* colors, const void* opac) {
        return {(const T*)means, (const T*)conics, (const T*)colors, (const T*)opac, n};
    }

    static void splat_naive_forward(int dtype, int H, int W, int64_t n_splats, const void* means, const void* conics,
                                    const void* colors, const void* opac, double a0, double a1, double st,
                                    void* rgb, void* tr, int32_t* cnt) {
        by_dtype(dtype, [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            naive_fwd_cpu<T>(H, W, inputs<T>(n_splats, means, conics, colors, opac), params<T>(a0, a1, st), (T*)rgb,
                             (T*)tr, cnt);
        });
    }

    static void splat_naive_backward(int dtype, int H, int W, int64_t n_splats, const void* means, const void* conics,
                                     const void* colors, const void* opac, double a0, double a1, double st,
                                     const void* fT, const int32_t* fn, const void* gr, const void* gT, void* grads) {
        by_dtype(dtype, [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            naive_bwd_cpu<T>(H, W, inputs<T>(n_splats, means, conics, colors, opac), params<T>(a0, a1, st),
                             (const T*)fT, fn, (const T*)gr, (const T*)gT, (T*)grads);
        });
    }

    static void splat_tiled_forward(int dtype, int H, int W, int64_t n_splats, const int64_t* off, const int32_t* ids,
                                    const void* means, const void* conics, const void* colors, const void* opac,
                                    double a0, double a1, double st, void* rgb, void* tr, int32_t* cnt) {
        by_dtype(dtype, [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            tiled_fwd_cpu<T>(H, W, off, ids, inputs<T>(n_splats, means, conics, colors, opac),
                             params<T>(a0, a1, st), (T*)rgb, (T*)tr, cnt);
        });
    }

    static void splat_tiled_backward(int dtype, int H, int W, int64_t n_splats, const int64_t* off, const int32_t* ids,
                                     const void* means, const void* conics, const void* colors, const void* opac,
                                     double a0, double a1, double st, const void* fT, const int32_t* fn,
                                     const void* gr, const void* gT, void* grads) {
        by_dtype(dtype, [&](auto* tag) {
            using T = std::remove_pointer_t<decltype(tag)>;
            tiled_bwd_cpu<T>(H, W, off, ids, inputs<T>(n_splats, means, conics, colors, opac), params<T>(a0, a1, st),
                             (const T*)fT, fn, (const T*)gr, (const T*)gT, (T*)grads);
        });
    }
};

}  // namespace

TORCH_LIBRARY(nf_splat, m) { kn_ops::define_splat(m); }

TORCH_LIBRARY_IMPL(nf_splat, CPU, m) { kn_ops::impl_splat<Cpu>(m); }
