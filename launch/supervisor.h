// Starting, watching and stopping the job's processes.
//
// SignalPipe turns SIGCHLD, SIGINT and SIGTERM into bytes on a pipe so one
// poll() loop sees process deaths, Ctrl-C and terminal output at once.
// Supervisor owns the processes: each runs in its own process group (so a
// Ctrl-C at the terminal reaches only fleetrun, and a stop reaches the
// process's own children too) with PR_SET_PDEATHSIG=SIGKILL as a second
// line of defence should fleetrun itself be killed with SIGKILL.
//
// Thread safety: neither class is thread-safe; use each from one thread.
// Supervisor must be used from the thread that lives as long as the
// processes, because the kernel ties PR_SET_PDEATHSIG to the forking thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "comm/status.h"
#include "launch/plan.h"

namespace fleet::launch {

class SignalPipe {
 public:
  // Installs handlers for SIGCHLD, SIGINT and SIGTERM. A signal handler can
  // reach only process-wide state, so at most one SignalPipe exists at a
  // time: FailedPrecondition when one is already installed; IOError when
  // pipe2 or sigaction fails.
  static Result<std::unique_ptr<SignalPipe>> Install();
  ~SignalPipe();  // restores the previous handlers and closes the pipe
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  // Readable (non-blocking) when a signal arrived; each byte is a signo.
  int read_fd() const { return read_fd_; }

 private:
  SignalPipe(int read_fd, int write_fd) : read_fd_(read_fd), write_fd_(write_fd) {}
  int read_fd_;
  int write_fd_;
};

struct SupervisorOptions {
  // A SignalPipe's read_fd, or -1: then Poll notices deaths only when its
  // timeout expires (fine for tests, slower to react).
  int wake_fd = -1;
  // Where tee'd output (ProcessSpec::tee) is copied. Not owned.
  std::FILE* tee_out = stdout;
};

class Supervisor {
 public:
  explicit Supervisor(SupervisorOptions options);
  // Kills (SIGKILL) and reaps whatever is still running: no orphans even on
  // an early return.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Opens spec.log_path (truncated) and starts the process. Returns its
  // index for the other calls. Blocks until the child exec'd (it does
  // nothing else first). IOError naming the log file when it cannot be
  // opened, IOError naming spec.exe and errno's text when execve fails (the
  // child is reaped and nothing is added), Internal when fork fails.
  Result<size_t> Start(ProcessSpec spec);
  // Starts a finished process again with `spec`, appending to its log after
  // a marker line. Errors as Start (the process then stays finished).
  // REQUIRES: !running(index).
  Status Restart(size_t index, ProcessSpec spec);

  struct Event {
    enum Kind { kExited, kSignal } kind;
    size_t index = 0;     // kExited
    int wait_status = 0;  // kExited: as from waitpid
    int signo = 0;        // kSignal: SIGINT or SIGTERM sent to fleetrun
  };
  // Waits up to `timeout` for something to happen, copying tee'd output
  // meanwhile; returns the processes that exited (reaped, their output
  // drained) and the stop signals fleetrun received. Never blocks longer
  // than `timeout`.
  std::vector<Event> Poll(std::chrono::milliseconds timeout);

  // Why processes are stopped: the job finished (SIGTERM), or it is
  // abandoned (each process's ProcessSpec::abandon_signal).
  enum class StopReason { kFinished, kAbandoned };
  // Sends the reason's signal to each listed running process's group, waits
  // up to `grace` for them to exit, then SIGKILLs the groups of those left
  // and reaps them. Returns the wait status of each listed process, in order
  // (processes that had already exited keep their last status). Blocks at
  // most grace + a short reap.
  std::vector<int> Stop(const std::vector<size_t>& which, std::chrono::milliseconds grace,
                        StopReason reason);
  // Stop(kAbandoned) for every running process: the job failed or was
  // interrupted.
  void StopAll(std::chrono::milliseconds grace);

  size_t size() const { return procs_.size(); }
  bool running(size_t index) const { return procs_[index].pid > 0; }
  pid_t pid(size_t index) const { return procs_[index].last_pid; }
  int restarts(size_t index) const { return procs_[index].restarts; }
  bool killed_by_supervisor(size_t index) const { return procs_[index].escalated; }
  // The wait status of its last exit (0 before it exited once).
  int last_status(size_t index) const { return procs_[index].last_status; }
  const ProcessSpec& spec(size_t index) const { return procs_[index].spec; }
  std::vector<size_t> Running() const;

  // The last `lines` lines of the process's log file.
  std::string LogTail(size_t index, size_t lines) const;

  // "exited with status 3" / "was killed by signal 11 (Segmentation fault)".
  static std::string DescribeWaitStatus(int wait_status);

 private:
  struct Proc {
    ProcessSpec spec;
    pid_t pid = -1;       // > 0 while running
    pid_t last_pid = -1;
    int log_fd = -1;      // kept open for tee'd processes
    int tee_fd = -1;      // read end of the output pipe when tee'd
    int restarts = 0;
    int last_status = 0;
    bool escalated = false;  // needed SIGKILL in Stop
  };
  Status Spawn(Proc& proc, bool append);
  // Copies what the tee pipe holds to the log and tee_out; closes it at EOF.
  void DrainTee(Proc& proc);
  bool Reap(Proc& proc, bool block);
  void CloseFds(Proc& proc);

  // Fixed after construction.
  const SupervisorOptions options_;
  std::vector<Proc> procs_;
};

}  // namespace fleet::launch
