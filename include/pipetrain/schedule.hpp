// A schedule is data: for each stage, the ordered list of actions it performs in one step.
// Generators (GPipe now; 1F1B and friends later) only build lists; one executor runs any list.
#pragma once
#include <string>
#include <vector>

namespace pipetrain {

enum class Op { recv_act, forward, send_act, recv_grad, backward, send_grad };

struct Action {
  Op op;
  int mb;  // micro-batch index
  bool operator==(const Action& o) const { return op == o.op && mb == o.mb; }
};
using ActionList = std::vector<Action>;

// GPipe: all M forwards (receiving from stage-1 and sending to stage+1 as needed), then all M
// backwards in reverse micro-batch order, as in the seed's diagram (F0..F3 then B3..B0).
ActionList gpipe_schedule(int stage, int n_stages, int micro_batches);

// The schedule named by parallel.schedule.
ActionList make_schedule(const std::string& name, int stage, int n_stages, int micro_batches);

std::string to_string(const Action& a);  // "F3", "B0", "recvA2", ...

}  // namespace pipetrain
