#include "pipetrain/compute/blas.hpp"

#include <cblas.h>

#include "pipetrain/compute/bf16_products.hpp"

namespace pipetrain {

void set_blas_threads(int threads) {
  openblas_set_num_threads(threads);
  set_bf16_product_threads(threads);
}

std::string blas_kernel_family() { return openblas_get_corename(); }

std::string blas_description() {
  const int threads = openblas_get_num_threads();
  return "OpenBLAS " + blas_kernel_family() + " kernels, " + std::to_string(threads) +
         (threads == 1 ? " thread" : " threads") + " per rank";
}

}  // namespace pipetrain
