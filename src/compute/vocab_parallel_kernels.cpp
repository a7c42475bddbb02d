// The CPU kernels of the loss over a vocabulary split among tensor ranks (layer_kernels.hpp has
// their contract): each rank's softmax statistics, which the tensor group reduces between the
// passes, so that no rank holds the full logits. One rank holding the whole vocabulary runs
// softmax_crossentropy_forward instead, which these equal up to the order of the sums.
#include <cmath>
#include <vector>

#include "pipetrain/compute/kernels.hpp"
#include "pipetrain/compute/profile.hpp"
#include "row_chunks.hpp"

namespace pipetrain {

void vocab_softmax_max(float* row_max, const float* logits, int N, int V) {
  KernelTimer timer(Kernel::softmax);
  parallel_for(N, rows_per_chunk(V), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float* l = logits + i * V;
      float mx = l[0];
#pragma omp simd reduction(max : mx)
      for (int j = 1; j < V; ++j) mx = l[j] > mx ? l[j] : mx;
      row_max[i] = mx;
    }
  });
}

void vocab_softmax_exp(float* probs, double* stats, const float* logits, const float* row_max, const int* targets,
                       int N, int V, int v_begin) {
  KernelTimer timer(Kernel::softmax);
  parallel_for(N, rows_per_chunk(V), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const float* l = logits + i * V;
      float* p = probs + i * V;
      const float mx = row_max[i];
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < V; ++j) sum += (p[j] = fast_exp(l[j] - mx));
      stats[i] = sum;
      const int t = targets[i] - v_begin;
      stats[N + i] = t >= 0 && t < V ? l[t] : 0.0;
    }
  });
}

double vocab_softmax_finish(float* probs, const float* row_max, const double* stats, int N, int V) {
  KernelTimer timer(Kernel::softmax);
  std::vector<double> row_loss(N);  // summed in row order afterwards: the same total on any thread count
  parallel_for(N, rows_per_chunk(V), [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      float* p = probs + i * V;
      const float inv = static_cast<float>(1.0 / stats[i]);
      for (int j = 0; j < V; ++j) p[j] *= inv;
      row_loss[i] = std::log(stats[i]) + row_max[i] - stats[N + i];
    }
  });
  double loss = 0.0;
  for (double l : row_loss) loss += l;
  return loss;
}

}  // namespace pipetrain
