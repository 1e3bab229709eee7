// Work split over XLA's intra-op thread pool, shared by the native kernels (dnnl_conv.cc,
// kmeans.cc).
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace jdml {

// One OpenMP thread while in scope: the pieces of a call are the parallelism, so oneDNN's own
// OpenMP threads would only compete with XLA's for the cores. oneDNN plans a primitive's work
// for the threads it sees when the primitive is created, so creation and execution both run in
// this scope. The setting is the calling thread's own (which may be the process's main thread,
// where PyTorch, say, runs its own OpenMP work), so it is restored.
struct OneThread {
  int before = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(before); }
};

// A piece of work that either a pool thread or the caller runs, whichever claims it first.
struct Task {
  std::atomic<bool> taken{false};
  std::atomic<bool> done{false};
  std::function<void()> work;
  std::string error;  // what the work threw, if anything

  // Runs the work if nobody has claimed it yet.
  void claim_and_run() {
    if (taken.exchange(true)) return;
    try {
      work();
    } catch (const std::exception& err) {
      error = err.what();
    }
    done.store(true, std::memory_order_release);
  }
};

// Runs work(0), ..., work(pieces - 1): the caller runs piece 0 and then every piece no pool
// thread has started yet, so it never waits on work that is not running (no deadlock when every
// pool thread is itself inside such a call). Rethrows the first error of a piece.
inline void run_pieces(xla::ffi::ThreadPool& pool, int64_t pieces,
                       const std::function<void(int64_t)>& work) {
  // A task's work refers to this frame: the caller waits for every claimed task below, and a
  // pool thread that finds its task claimed touches only the task itself.
  std::vector<std::shared_ptr<Task>> tasks;
  for (int64_t i = 1; i < pieces; ++i) {
    auto task = std::make_shared<Task>();
    task->work = [&work, i] { work(i); };
    tasks.push_back(task);
    pool.Schedule([task] { task->claim_and_run(); });
  }
  work(0);
  for (auto& task : tasks) task->claim_and_run();
  for (auto& task : tasks) {
    while (!task->done.load(std::memory_order_acquire)) std::this_thread::yield();
    if (!task->error.empty()) throw std::runtime_error(task->error);
  }
}

}  // namespace jdml
