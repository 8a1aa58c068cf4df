// Real spherical harmonics of unit directions, tiny-cuda-nn's ordering and sign convention.
#pragma once

#include "common.h"

namespace kn {

// Writes degree*degree coefficients (degree 1..4).
template <typename T>
KN_HD void sh_encode_dir(const T* dir, int degree, T* out) {
    const T x = dir[0], y = dir[1], z = dir[2];
    const T xy = x * y, xz = x * z, yz = y * z, x2 = x * x, y2 = y * y, z2 = z * z;
    out[0] = T(0.28209479177387814);
    if (degree <= 1) return;
    out[1] = T(-0.48860251190291987) * y;
    out[2] = T(0.48860251190291987) * z;
    out[3] = T(-0.48860251190291987) * x;
    if (degree <= 2) return;
    out[4] = T(1.0925484305920792) * xy;
    out[5] = T(-1.0925484305920792) * yz;
    out[6] = T(0.94617469575755997) * z2 - T(0.31539156525251999);
    out[7] = T(-1.0925484305920792) * xz;
    out[8] = T(0.54627421529603959) * x2 - T(0.54627421529603959) * y2;
    if (degree <= 3) return;
    out[9] = T(0.59004358992664352) * y * (T(-3.0) * x2 + y2);
    out[10] = T(2.8906114426405538) * xy * z;
    out[11] = T(0.45704579946446572) * y * (T(1.0) - T(5.0) * z2);
    out[12] = T(0.3731763325901154) * z * (T(5.0) * z2 - T(3.0));
    out[13] = T(0.45704579946446572) * x * (T(1.0) - T(5.0) * z2);
    out[14] = T(1.4453057213202769) * z * (x2 - y2);
    out[15] = T(0.59004358992664352) * x * (-x2 + T(3.0) * y2);
}

}  // namespace kn
