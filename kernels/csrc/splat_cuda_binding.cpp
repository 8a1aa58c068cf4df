// CUDA library of the splat compositors: registers the launchers of splat.cu for the CUDA dispatch
// key of the `nf_splat` ops, which the CPU library (splat_cpu.cpp) defines and which is loaded
// first. Built only where torch has CUDA.
#include <torch/extension.h>

#include "cuda_device.h"

TORCH_LIBRARY_IMPL(nf_splat, CUDA, m) { kn_ops::impl_splat<kn_ops::Cuda>(m); }
