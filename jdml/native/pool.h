// Work split over a pool of threads, shared by the native kernels (dnnl_conv.cc, kmeans.cc,
// knn.cc): XLA's intra-op thread pool inside an FFI handler, or OpenMP's threads (HostPool) in a
// function called directly on host memory. A Pool has num_threads() and Schedule(work).
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
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
template <class Pool>
void run_pieces(Pool& pool, int64_t pieces, const std::function<void(int64_t)>& work) {
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

// The shared state of run_rounds, kept alive by every helper that holds it, so that a helper
// that starts after the call has returned touches nothing else.
struct Rounds {
  int64_t pieces = 0, rounds = 0;
  const std::function<void(int64_t, int64_t)>* work = nullptr;  // the caller's; see run_rounds
  // (round << 32) | next unclaimed piece of that round; run_rounds sets it to round 0 with no
  // piece left before any helper starts, so that a helper claims nothing before the caller opens
  // round 0
  std::atomic<uint64_t> next{0};
  std::atomic<int64_t> done{0};      // pieces of the current round finished
  std::atomic<int64_t> helpers{0};   // helpers inside their loop
  std::atomic<bool> finished{false};
  std::mutex mutex;
  std::string error;  // what the first failed piece threw

  // Claims the next piece of the current round, if any is left.
  bool claim(int64_t& round, int64_t& piece) {
    uint64_t current = next.load(std::memory_order_acquire);
    while (true) {
      round = static_cast<int64_t>(current >> 32);
      piece = static_cast<int64_t>(current & 0xffffffffu);
      if (round >= rounds || piece >= pieces) return false;
      if (next.compare_exchange_weak(current, current + 1, std::memory_order_acq_rel)) return true;
    }
  }

  void run(int64_t round, int64_t piece) {
    try {
      (*work)(round, piece);
    } catch (const std::exception& err) {
      std::lock_guard<std::mutex> lock(mutex);
      if (error.empty()) error = err.what();
    }
    done.fetch_add(1, std::memory_order_acq_rel);
  }
};

// Runs work(round, piece) for every piece in [0, pieces) of every round in [0, rounds), and
// between(round) on the caller's thread once all of a round's pieces are done, before the next
// round starts; the rounds stop early when between returns false. Pool threads join as helpers
// when they start and stay for the later rounds, waiting between rounds with
// std::this_thread::yield: run_pieces per round (a k-means iteration of 0.15 ms, say) had cost
// a thread wake-up each time. The caller claims every piece no helper has claimed, so it never
// waits on work that is not running (no deadlock when the pool's threads are busy elsewhere).
// Rethrows the first error of a piece (after its round) or of between.
template <class Pool>
void run_rounds(Pool& pool, int64_t pieces, int64_t rounds,
                const std::function<void(int64_t, int64_t)>& work,
                const std::function<bool(int64_t)>& between) {
  if (pieces >= (int64_t{1} << 32)) throw std::runtime_error("too many pieces");
  auto state = std::make_shared<Rounds>();
  state->pieces = pieces;
  state->rounds = rounds;
  state->work = &work;
  // Nothing is claimable until the caller opens round 0 below. (It had started claimable: a helper
  // that ran a piece of round 0 before the caller reset `done` and reopened the round counted
  // that piece into a later round, which then ended while one of its pieces still ran. The
  // reference k-means, where a call is two rounds per iteration, gave another result about once
  // in 300 calls with both cores busy.)
  state->next.store(static_cast<uint64_t>(pieces), std::memory_order_relaxed);
  // The caller and a helper per further thread of the pool: more would only wait in its queue.
  const int64_t helpers = std::min<int64_t>(pieces, pool.num_threads()) - 1;
  for (int64_t i = 0; i < helpers && rounds > 0; ++i) {
    pool.Schedule([state] {
      state->helpers.fetch_add(1);
      while (!state->finished.load()) {
        int64_t round, piece;
        if (state->claim(round, piece)) {
          state->run(round, piece);
        } else {
          std::this_thread::yield();
        }
      }
      state->helpers.fetch_sub(1);
    });
  }
  std::string error;
  for (int64_t round = 0; round < rounds && error.empty(); ++round) {
    state->done.store(0);
    state->next.store(static_cast<uint64_t>(round) << 32, std::memory_order_release);
    int64_t claimed_round, piece;
    while (state->claim(claimed_round, piece)) state->run(claimed_round, piece);
    while (state->done.load(std::memory_order_acquire) < pieces) std::this_thread::yield();
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      error = state->error;
    }
    if (!error.empty()) break;
    try {
      if (!between(round)) break;
    } catch (const std::exception& err) {
      error = err.what();
    }
  }
  // No piece can be claimed any more; then wait for the helpers inside their loop to leave it
  // (one that enters later sees `finished` and leaves without running anything).
  state->next.store(static_cast<uint64_t>(rounds) << 32, std::memory_order_release);
  state->finished.store(true);
  while (state->helpers.load() != 0) std::this_thread::yield();
  if (!error.empty()) throw std::runtime_error(error);
}

// OpenMP's threads as a Pool, for functions called directly on host memory (not through XLA):
// host_call runs `work(pool)` on one thread of an OpenMP team, and the pool's Schedule makes an
// OpenMP task, which the team's other threads run while they wait at the end of the team's
// single region. run_pieces and run_rounds never wait for work nobody has started, so a task
// that starts after its call has returned finds nothing left to do.
class HostPool {
 public:
  explicit HostPool(int64_t threads) : threads_(threads) {}
  int64_t num_threads() const { return threads_; }
  template <class Work>
  void Schedule(Work&& work) {
    std::function<void()> task(std::forward<Work>(work));
#pragma omp task firstprivate(task)
    task();
  }

 private:
  int64_t threads_;
};

// Runs work(pool) with a HostPool of OpenMP's threads (see HostPool); returns what it throws as
// a message, empty if nothing.
template <class Work>
std::string host_call(Work&& work) {
  std::string failure;
#pragma omp parallel
#pragma omp single
  {
    HostPool pool(omp_get_num_threads());
    try {
      work(pool);
    } catch (const std::exception& err) {
      failure = err.what();
    }
  }
  return failure;
}

}  // namespace jdml
