#pragma once
// OpenBLAS set-up: which kernels it runs and with how many threads.
#include <string>

namespace pipetrain {

void set_blas_threads(int threads);  // and oneDNN's, which computes the bf16 products

// The kernel family OpenBLAS runs: "SkylakeX", "Haswell", ...
std::string blas_kernel_family();
// e.g. "OpenBLAS SkylakeX kernels, 2 threads per rank"
std::string blas_description();

}  // namespace pipetrain
