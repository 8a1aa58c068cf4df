// CUDA library of the NeRF ops: registers the launchers (launchers.h, linked from the .cu objects)
// for the CUDA dispatch key of the `nf` ops, which the CPU library (cpu_ops.cpp) defines and which
// is loaded first. Built only where torch has CUDA.
#include <torch/extension.h>

#include "cuda_device.h"

TORCH_LIBRARY_IMPL(nf, CUDA, m) { kn_ops::impl_nerf<kn_ops::Cuda>(m); }
