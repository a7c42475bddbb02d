// Graceful stop: SIGUSR1 (Slurm's warning before the time limit) and SIGTERM (preemption,
// scancel) only set a flag; the training loop agrees on it across ranks at the next step
// boundary, saves a checkpoint and exits with code 3. Further signals during the save just set
// the flag again.
#pragma once

namespace pipetrain {

void install_stop_handlers();
bool stop_requested();
int stop_signal();  // the last signal received (0 if none)

}  // namespace pipetrain
