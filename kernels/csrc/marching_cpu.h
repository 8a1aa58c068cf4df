// Ray marching on the CPU in one pass. The CUDA build marches twice (count, then fill at each
// ray's offset) because a GPU thread cannot grow a buffer; here each block of rays marches once
// into its own growing buffer and the blocks are copied to their offsets afterwards, so the
// occupancy lookups, the expensive part, run once per sample instead of twice. Same kn::march_ray
// body, so the samples are those of the two-pass march bit for bit.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "marching.h"

namespace kn_cpu {

// Rays per block: enough work per block to amortise its buffer, small enough to balance threads.
constexpr int64_t MARCH_BLOCK = 64;

// The most samples one ray can get: kn::march_ray emits at most one per pass, and its passes are
// bounded by the box's diagonal over the step (with its own slack, plus some for rounding).
inline int64_t march_cap(const kn::MarchParams& p) {
    double diag2 = 0.0;
    for (int k = 0; k < 3; ++k) {
        const double e = (double)p.aabb_max[k] - (double)p.aabb_min[k];
        diag2 += e * e;
    }
    const double passes = std::sqrt(diag2) / (double)p.step * 1.07 + 32.0;
    return passes < (double)p.max_samples ? (int64_t)passes : (int64_t)p.max_samples;
}

// Rays whose scratch buffer would be larger than this are marched in two passes instead.
constexpr int64_t MARCH_MAX_SCRATCH = 1 << 20;

struct MarchBlock {
    std::vector<float> t0, t1;
};

// Marches rays [0, n) into per-block buffers (needs march_cap(p) <= MARCH_MAX_SCRATCH); counts[i] gets ray i's number of samples.
inline std::vector<MarchBlock> march_blocks(const float* o, const float* d, const float* near, const float* far,
                                            const float* jitter, const kn::MarchParams& p, const kn::GridView& g,
                                            int64_t n, int64_t* counts, int n_threads) {
    const int64_t n_blocks = (n + MARCH_BLOCK - 1) / MARCH_BLOCK;
    std::vector<MarchBlock> blocks(n_blocks);
#pragma omp parallel num_threads(n_threads)
    {
        const int64_t cap = march_cap(p);
        std::vector<float> a(cap), b(cap);
#pragma omp for schedule(dynamic, 1)
        for (int64_t bi = 0; bi < n_blocks; ++bi) {
            MarchBlock& blk = blocks[bi];
            const int64_t i1 = std::min(n, (bi + 1) * MARCH_BLOCK);
            for (int64_t i = bi * MARCH_BLOCK; i < i1; ++i) {
                const int c = kn::march_ray(o + 3 * i, d + 3 * i, near[i], far[i], jitter[i], p, g, a.data(), b.data());
                counts[i] = c;
                blk.t0.insert(blk.t0.end(), a.begin(), a.begin() + c);
                blk.t1.insert(blk.t1.end(), b.begin(), b.begin() + c);
            }
        }
    }
    return blocks;
}

// Copies the blocks to the packed arrays at the rays' offsets (offsets[i] = samples before ray i)
// and writes each sample's ray index.
inline void pack_blocks(const std::vector<MarchBlock>& blocks, const int64_t* offsets, int64_t n, float* t0,
                        float* t1, int64_t* ray_indices, int n_threads) {
    const int64_t n_blocks = (int64_t)blocks.size();
#pragma omp parallel for schedule(static) num_threads(n_threads)
    for (int64_t bi = 0; bi < n_blocks; ++bi) {
        const int64_t i0 = bi * MARCH_BLOCK, i1 = std::min(n, i0 + MARCH_BLOCK);
        const MarchBlock& blk = blocks[bi];
        if (!blk.t0.empty()) {
            std::memcpy(t0 + offsets[i0], blk.t0.data(), blk.t0.size() * sizeof(float));
            std::memcpy(t1 + offsets[i0], blk.t1.data(), blk.t1.size() * sizeof(float));
        }
        for (int64_t i = i0; i < i1; ++i)
            for (int64_t k = offsets[i]; k < offsets[i + 1]; ++k) ray_indices[k] = i;
    }
}

}  // namespace kn_cpu
