// The threads that drive a tensor-parallel group: one per rank beyond the first, each bound to
// its rank's backend (Backend::bind_thread) for its whole life; rank 0 runs on the caller's
// thread. run() hands every rank the same function and returns when all have finished, so a
// step's collectives meet while each rank issues its own ops.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "engine/backend/backend.h"

namespace arbor {

class RankThreads {
 public:
  explicit RankThreads(std::vector<Backend*> ranks);
  ~RankThreads();
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  int size() const { return static_cast<int>(ranks_.size()); }
  // fn(r) for every rank r at once, rank 0 on this thread; rethrows the lowest rank's exception
  // after every rank has returned.
  void run(const std::function<void(int rank)>& fn);

 private:
  void worker(int rank);
  std::vector<Backend*> ranks_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

}  // namespace arbor
