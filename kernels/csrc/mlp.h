// Per-sample heads of the NeRF field's MLPs: density from the first output of the density network
// and colour from the colour network's three outputs. The matrix products are in mlp_cpu.h; these
// bodies are the part a CUDA version would share.
#pragma once

#include "common.h"

namespace kn {

// instant-ngp's trunc_exp: sigma = exp(h0 - shift); the gradient is clamped so that one large
// pre-activation cannot blow up the hash-table update it feeds.
template <typename T>
KN_HD T density_forward(T h0, T shift) {
    return kn_exp<T>(h0 - shift);
}

template <typename T>
KN_HD T density_backward(T h0, T shift, T grad_sigma) {
    const T x = h0 - shift;
    // Written so that a NaN passes through, as torch.clamp lets it.
    const T c = x < T(-15) ? T(-15) : (x > T(15) ? T(15) : x);
    return grad_sigma * kn_exp<T>(c);
}

// The same from the forward's sigma = exp(h0 - shift): wherever the clamp leaves x alone, exp(c)
// is sigma, bit for bit, and needs no second exp.
template <typename T>
KN_HD T density_backward(T h0, T shift, T sigma, T grad_sigma) {
    const T x = h0 - shift;
    const T c = x < T(-15) ? T(-15) : (x > T(15) ? T(15) : x);
    return grad_sigma * (c == x ? sigma : kn_exp<T>(c));
}

template <typename T>
KN_HD T sigmoid_forward(T z) {
    return T(1) / (T(1) + kn_exp<T>(-z));
}

// Same product order as torch's sigmoid_backward: g * (1 - y) * y.
template <typename T>
KN_HD T sigmoid_backward(T y, T grad) {
    return grad * (T(1) - y) * y;
}

}  // namespace kn
