#include "pipetrain/executor.hpp"

#include <algorithm>
#include <chrono>

namespace pipetrain {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
int act_tag(int mb) { return 2 * mb; }
int grad_tag(int mb) { return 2 * mb + 1; }

}  // namespace

Executor::Executor(Stage& stage, Comm& comm) : stage_(stage), comm_(comm) {
  const size_t n = stage.boundary_floats();
  for (auto* ring : {&act_out_, &grad_out_, &grad_in_}) ring->assign(kRing, std::vector<float>(n));
  for (auto* reqs : {&act_out_req_, &grad_out_req_, &grad_in_req_}) reqs->assign(kRing, MPI_REQUEST_NULL);
}

// Next buffer of a send ring, once the send that last used it has completed.
float* Executor::acquire(std::vector<std::vector<float>>& ring, std::vector<MPI_Request>& pending, size_t& next,
                         const WaitLabel& label) {
  size_t slot = next++ % kRing;
  comm_.wait(pending[slot], label);
  return ring[slot].data();
}

StepStats Executor::run(const ActionList& actions, int micro_batches) {
  StepStats st;
  const double wait0 = comm_.wait_seconds();
  const size_t n = stage_.boundary_floats();
  const int prev = comm_.topo().stage - 1, next = comm_.topo().stage + 1;

  // Activation bytes held, counted from the stage's buffers after every change.
  std::vector<size_t> held(micro_batches, 0);
  size_t total = 0;
  auto update = [&](int mb) {
    size_t b = stage_.stash_bytes(mb);
    total = total + b - held[mb];
    held[mb] = b;
    st.act_peak_bytes = std::max(st.act_peak_bytes, total);
  };

  std::vector<MPI_Request> act_in(micro_batches, MPI_REQUEST_NULL);
  std::vector<int> grad_order;
  for (const Action& a : actions) {
    if (a.op == Op::recv_act) act_in[a.mb] = comm_.irecv(stage_.input_buffer(a.mb), n, prev, act_tag(a.mb));
    if (a.op == Op::recv_grad) grad_order.push_back(a.mb);
  }
  for (int mb = 0; mb < micro_batches; ++mb) update(mb);

  size_t grads_posted = 0, grads_used = 0;
  auto post_grad_recvs = [&] {
    for (; grads_posted < grad_order.size() && grads_posted < grads_used + kRing; ++grads_posted) {
      size_t slot = grads_posted % kRing;
      grad_in_req_[slot] = comm_.irecv(grad_in_[slot].data(), n, next, grad_tag(grad_order[grads_posted]));
    }
  };
  post_grad_recvs();

  size_t act_next = 0, grad_next = 0;
  float* act_out = nullptr;
  float* grad_out = nullptr;
  const float* grad_in = nullptr;
  for (const Action& a : actions) {
    switch (a.op) {
      case Op::recv_act:
        comm_.wait(act_in[a.mb], {"recv activation", prev, a.mb});
        break;
      case Op::forward: {
        if (!stage_.last()) act_out = acquire(act_out_, act_out_req_, act_next, {"send activation", next, a.mb});
        double t0 = now_s();
        st.loss_sum += stage_.forward(a.mb, act_out);
        st.compute_s += now_s() - t0;
        update(a.mb);
        break;
      }
      case Op::send_act:
        act_out_req_[(act_next - 1) % kRing] = comm_.isend(act_out, n, next, act_tag(a.mb));
        break;
      case Op::recv_grad: {
        size_t slot = grads_used % kRing;
        comm_.wait(grad_in_req_[slot], {"recv gradient", next, a.mb});
        grad_in = grad_in_[slot].data();
        break;
      }
      case Op::backward: {
        if (!stage_.first()) grad_out = acquire(grad_out_, grad_out_req_, grad_next, {"send gradient", prev, a.mb});
        double t0 = now_s();
        stage_.backward(a.mb, grad_in, grad_out);
        st.compute_s += now_s() - t0;
        update(a.mb);
        if (!stage_.last()) {
          ++grads_used;  // its receive buffer is free again
          post_grad_recvs();
        }
        break;
      }
      case Op::send_grad:
        grad_out_req_[(grad_next - 1) % kRing] = comm_.isend(grad_out, n, prev, grad_tag(a.mb));
        break;
    }
  }
  for (auto& r : act_out_req_) comm_.wait(r, {"send activation (drain)", next});
  for (auto& r : grad_out_req_) comm_.wait(r, {"send gradient (drain)", prev});
  st.wait_s = comm_.wait_seconds() - wait0;
  return st;
}

}  // namespace pipetrain
