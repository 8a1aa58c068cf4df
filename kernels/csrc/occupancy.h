// Occupancy grid: R^3 cells per cascade in morton order, cascade c covering the cascade-0 box
// scaled by 2^c about its centre (instant-ngp). Per cascade the bitfield holds mip 0 (R^3 bits)
// followed by max-pooled mips (R/2)^3, (R/4)^3, ... 1. Morton order makes pooling trivial: the
// 8 children of mip-m cell j are bits [8j, 8j+8) of mip m-1, i.e. one byte.
#pragma once

#include "common.h"

namespace kn {

constexpr int OCC_MAX_MIPS = 11;  // resolution up to 1024 (10 bits per axis in a 30-bit code)

KN_HD uint32_t expand_bits(uint32_t v) {
    v = (v * 0x00010001u) & 0xFF0000FFu;
    v = (v * 0x00000101u) & 0x0F00F00Fu;
    v = (v * 0x00000011u) & 0xC30C30C3u;
    v = (v * 0x00000005u) & 0x49249249u;
    return v;
}

KN_HD uint32_t morton3D(uint32_t x, uint32_t y, uint32_t z) {
    return expand_bits(x) | (expand_bits(y) << 1) | (expand_bits(z) << 2);
}

KN_HD uint32_t morton3D_invert(uint32_t x) {
    x = x & 0x49249249u;
    x = (x | (x >> 2)) & 0xC30C30C3u;
    x = (x | (x >> 4)) & 0x0F00F00Fu;
    x = (x | (x >> 8)) & 0xFF0000FFu;
    x = (x | (x >> 16)) & 0x0000FFFFu;
    return x;
}

struct GridView {
    const uint8_t* bits;  // (n_cascades, bytes_per_cascade)
    int n_cascades;
    uint32_t res;
    int n_mips;
    uint32_t bytes_per_cascade;
    uint32_t mip_byte_offset[OCC_MAX_MIPS];
    float center[3];
    float half[3];  // cascade-0 box is centre +- half
};

KN_HD uint32_t mip_cells(uint32_t res, int mip) {
    const uint32_t r = res >> mip;
    return r * r * r;
}

// Byte j of mip 0: bit b set when density[8j + b] > thresh.
KN_HD uint8_t threshold_byte(const float* density, uint32_t j, float thresh) {
    uint8_t bits = 0;
    for (int b = 0; b < 8; ++b) bits |= density[8 * j + b] > thresh ? (uint8_t)(1u << b) : (uint8_t)0;
    return bits;
}

// Byte j of cascade c's mip 0 gets, ORed in, the finer cascade's occupancy max-pooled into the
// centre (R/2)^3 block: coarse cell (x, y, z) there is byte morton3D(x - R/4, ...) of the finer
// level being non-zero. (The walkthrough in seed 004 offsets by R/8; centring needs R/4.)
// Written as a gather so that CUDA threads never write the same byte.
KN_HD uint8_t pooled_from_finer(const uint8_t* finer_level0, uint32_t j, uint32_t res) {
    uint8_t bits = 0;
    const uint32_t lo = res / 4, hi = res / 4 + res / 2;
    for (int b = 0; b < 8; ++b) {
        const uint32_t code = 8 * j + b;
        const uint32_t x = morton3D_invert(code >> 0), y = morton3D_invert(code >> 1), z = morton3D_invert(code >> 2);
        if (x < lo || x >= hi || y < lo || y >= hi || z < lo || z >= hi) continue;
        if (finer_level0[morton3D(x - lo, y - lo, z - lo)]) bits |= (uint8_t)(1u << b);
    }
    return bits;
}

// Byte j of mip m from mip m-1 (which has 8x the cells, i.e. one source byte per target bit).
KN_HD uint8_t mip_byte(const uint8_t* finer_mip, uint32_t j, uint32_t n_cells) {
    uint8_t bits = 0;
    for (uint32_t b = 0; b < 8 && 8 * j + b < n_cells; ++b)
        if (finer_mip[8 * j + b]) bits |= (uint8_t)(1u << b);
    return bits;
}

KN_HD bool bit_at(const uint8_t* bytes, uint32_t idx) { return (bytes[idx >> 3] >> (idx & 7u)) & 1u; }

KN_HD bool occupied_at(const GridView& g, int cascade, int mip, const uint32_t* ijk) {
    const uint32_t code = morton3D(ijk[0] >> mip, ijk[1] >> mip, ijk[2] >> mip);
    return bit_at(g.bits + (size_t)cascade * g.bytes_per_cascade + g.mip_byte_offset[mip], code);
}

// Finest cascade containing p and p's mip-0 cell there; false when p is outside every cascade.
KN_HD bool locate_cell(const GridView& g, const float* p, int* cascade, uint32_t* ijk) {
    float r = 0.f;
    for (int d = 0; d < 3; ++d) r = kn_max(r, fabsf(p[d] - g.center[d]) / g.half[d]);
    int c = 0;
    if (r >= 1.f) {
        int e;
        frexpf(r, &e);  // r in [2^(e-1), 2^e)
        c = e;
    }
    if (c >= g.n_cascades) {
        if (r > ldexpf(1.f, g.n_cascades - 1)) return false;
        c = g.n_cascades - 1;  // exactly on the outer boundary
    }
    const int res = (int)g.res;
    for (int d = 0; d < 3; ++d) {
        const float ext = ldexpf(g.half[d], c);
        const float u = (p[d] - g.center[d]) / ext;
        const float v = (u * 0.5f + 0.5f) * (float)res;
        int i = (int)floorf(v);
        i = i < 0 ? 0 : (i >= res ? res - 1 : i);
        ijk[d] = (uint32_t)i;
    }
    *cascade = c;
    return true;
}

}  // namespace kn
