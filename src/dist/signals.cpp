#include "pipetrain/dist/signals.hpp"

#include <csignal>

namespace pipetrain {
namespace {
volatile std::sig_atomic_t received = 0;
void on_signal(int sig) { received = sig; }
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // Ctrl-C: the first checkpoints and stops like SIGTERM; the handler then reverts to the default,
  // so a second Ctrl-C stops the process at once.
  sa.sa_flags = SA_RESTART | SA_RESETHAND;
  sigaction(SIGINT, &sa, nullptr);
}

bool stop_requested() { return received != 0; }
int stop_signal() { return received; }

}  // namespace pipetrain
