// Graceful stop: SIGUSR1 (Slurm's warning before the time limit), SIGTERM (preemption, scancel)
// and SIGINT (Ctrl-C, which mpiexec forwards to every rank) only set a flag; the training loop agrees on it across
// ranks at the next step boundary, saves a checkpoint and exits with code 3. Further signals during the save just set
// the flag again, except a second SIGINT, which ends the process at once.
#pragma once

namespace pipetrain {

void install_stop_handlers();
bool stop_requested();
int stop_signal();  // the last signal received (0 if none)

}  // namespace pipetrain
