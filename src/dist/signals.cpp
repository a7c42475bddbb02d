#include "pipetrain/dist/signals.hpp"

#include <unistd.h>

#include <csignal>

namespace pipetrain {
namespace {
volatile std::sig_atomic_t received = 0;
volatile std::sig_atomic_t interrupts = 0;  // Ctrl-Cs so far
volatile std::sig_atomic_t speaks = 1;      // this process says what a Ctrl-C does (rank 0 once known)

void say(const char* text, size_t n) {
  if (!speaks) return;
  [[maybe_unused]] const ssize_t written = write(STDERR_FILENO, text, n);  // a lost line is all it costs
}

// Only async-signal-safe calls here: a flag, write(2), _exit(2).
void on_signal(int sig) {
  if (sig == SIGINT && ++interrupts >= 2) {
    static const char now[] = "\npipetrain: second Ctrl-C: stopping now, without a checkpoint (those saved are kept)\n";
    say(now, sizeof now - 1);
    _exit(130);  // 128 + SIGINT, as a shell reports a process Ctrl-C ended
  }
  if (sig == SIGINT) {
    static const char first[] =
        "\npipetrain: Ctrl-C: stopping after this step with a checkpoint (Ctrl-C again: at once, without one)\n";
    say(first, sizeof first - 1);
  }
  received = sig;
}
}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void speak_on_signals(bool speaks_for_the_job) { speaks = speaks_for_the_job ? 1 : 0; }

bool stop_requested() { return received != 0; }
int stop_signal() { return received; }

}  // namespace pipetrain
