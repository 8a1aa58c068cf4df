// What every CPU device of ops.h shares (the NeRF ops' `Cpu` in cpu_ops.cpp, the splat
// compositors' in splat_cpu.cpp): each derives from CpuDevice and adds its own launches. The CPU
// runs on the calling thread, so its guard has nothing to make current.
#pragma once

#include <c10/core/Device.h>

namespace kn_ops {

struct CpuDevice {
    struct Guard {
        explicit Guard(const at::Device&) {}
    };

    // Calls fn with a null T* for the launchers' dtype code (ops.h dtype_code: 1 = float64).
    template <typename Fn>
    static void by_dtype(int dtype, Fn&& fn) {
        if (dtype == 1) return fn((double*)nullptr);
        return fn((float*)nullptr);
    }
};

}  // namespace kn_ops
