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

size_t peak_activation_bytes(const ActionList& list, const std::vector<size_t>& stash, const std::vector<size_t>& wgrads) {
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

std::string to_string(const Action& a) {
  static const char* names[] = {"recvA", "F", "sendA", "recvG", "B", "sendG", "B", "W"};
  return names[static_cast<int>(a.op)] + std::to_string(a.mb) + (a.chunk ? "." + std::to_string(a.chunk) : "");
}

}  // namespace pipetrain
