#include "pipetrain/schedule.hpp"

#include <stdexcept>

namespace pipetrain {

ActionList gpipe_schedule(int stage, int n_stages, int micro_batches) {
  const bool first = stage == 0, last = stage == n_stages - 1;
  ActionList list;
  for (int i = 0; i < micro_batches; ++i) {
    if (!first) list.push_back({Op::recv_act, i});
    list.push_back({Op::forward, i});
    if (!last) list.push_back({Op::send_act, i});
  }
  for (int i = micro_batches - 1; i >= 0; --i) {
    if (!last) list.push_back({Op::recv_grad, i});
    list.push_back({Op::backward, i});
    if (!first) list.push_back({Op::send_grad, i});
  }
  return list;
}

ActionList make_schedule(const std::string& name, int stage, int n_stages, int micro_batches) {
  if (name == "gpipe") return gpipe_schedule(stage, n_stages, micro_batches);
  throw std::invalid_argument("unknown schedule " + name);
}

std::string to_string(const Action& a) {
  static const char* names[] = {"recvA", "F", "sendA", "recvG", "B", "sendG"};
  return names[static_cast<int>(a.op)] + std::to_string(a.mb);
}

}  // namespace pipetrain
