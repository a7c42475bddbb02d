#include "pipetrain/schedule/actions.hpp"

#include <algorithm>

namespace pipetrain {

ActionList forward_only(const ActionList& list) {
  ActionList out;
  for (const Action& a : list)
    if (a.op == Op::recv_act || a.op == Op::forward || a.op == Op::send_act) out.push_back(a);
  return out;
}

int max_in_flight(const ActionList& list) {
  int now = 0, peak = 0;
  for (const Action& a : list) {
    if (a.op == Op::forward) peak = std::max(peak, ++now);
    if (a.op == Op::backward || a.op == Op::backward_weight) --now;
  }
  return peak;
}

size_t peak_activation_bytes(const ActionList& list, const std::vector<size_t>& stash,
                             const std::vector<size_t>& wgrads) {
  size_t now = 0, peak = 0;
  for (const Action& a : list) {
    const size_t held = stash.at(a.chunk), split = wgrads.at(a.chunk);
    if (a.op == Op::forward) now += held;
    if (a.op == Op::backward_input) now += split;
    if (a.op == Op::backward) now -= held;
    if (a.op == Op::backward_weight) now -= held + split;
    peak = std::max(peak, now);
  }
  return peak;
}

size_t held_activation_bytes(const ActionList& list, const std::vector<size_t>& stash,
                             const std::vector<size_t>& wgrads, const std::vector<int>& pool_of_chunk) {
  const size_t pools = pool_of_chunk.empty() ? 0 : *std::max_element(pool_of_chunk.begin(), pool_of_chunk.end()) + 1;
  std::vector<int> acts(pools), acts_peak(pools), kept(pools), kept_peak(pools);
  std::vector<size_t> acts_size(pools), kept_size(pools);
  for (const Action& a : list) {
    const int p = pool_of_chunk.at(a.chunk);
    acts_size[p] = std::max(acts_size[p], stash.at(a.chunk));
    kept_size[p] = std::max(kept_size[p], wgrads.at(a.chunk));
    if (a.op == Op::forward) acts_peak[p] = std::max(acts_peak[p], ++acts[p]);
    if (a.op == Op::backward_input) kept_peak[p] = std::max(kept_peak[p], ++kept[p]);
    if (a.op == Op::backward) --acts[p];
    if (a.op == Op::backward_weight) {
      --acts[p];
      --kept[p];
    }
  }
  size_t held = 0;
  for (size_t p = 0; p < pools; ++p) held += acts_peak[p] * acts_size[p] + kept_peak[p] * kept_size[p];
  return held;
}

std::string to_string(const Action& a) {
  static const char* names[] = {"recvA", "F", "sendA", "recvG", "B", "sendG", "B", "W"};
  return names[static_cast<int>(a.op)] + std::to_string(a.mb) + (a.chunk ? "." + std::to_string(a.chunk) : "");
}

}  // namespace pipetrain
