// Shared helpers for the device bodies. Everything here compiles with g++ (CPU extension) and
// nvcc (CUDA launchers); no torch headers, so nvcc needs nothing but its own toolkit.
#pragma once

#include <cstdint>
#include <cmath>

#if defined(__CUDACC__)
#define KN_HD __host__ __device__ __forceinline__
#else
#define KN_HD inline
#endif

namespace kn {

template <typename T> KN_HD T kn_floor(T x);
template <> KN_HD float kn_floor<float>(float x) { return floorf(x); }
template <> KN_HD double kn_floor<double>(double x) { return floor(x); }

template <typename T> KN_HD T kn_exp(T x);
template <> KN_HD float kn_exp<float>(float x) { return expf(x); }
template <> KN_HD double kn_exp<double>(double x) { return exp(x); }

// expm1 keeps alpha = 1 - exp(-sigma*dt) accurate when sigma*dt is tiny (early training).
template <typename T> KN_HD T kn_expm1(T x);
template <> KN_HD float kn_expm1<float>(float x) { return expm1f(x); }
template <> KN_HD double kn_expm1<double>(double x) { return expm1(x); }

template <typename T> KN_HD T kn_sqrt(T x);
template <> KN_HD float kn_sqrt<float>(float x) { return sqrtf(x); }
template <> KN_HD double kn_sqrt<double>(double x) { return sqrt(x); }

template <typename T> KN_HD T kn_min(T a, T b) { return a < b ? a : b; }
template <typename T> KN_HD T kn_max(T a, T b) { return a > b ? a : b; }

// NaN-safe clamp to [0, 1]: a NaN input maps to 0 so that it can never become an index.
template <typename T> KN_HD T clamp01(T x) {
    if (!(x > T(0))) return T(0);
    return x < T(1) ? x : T(1);
}

}  // namespace kn
