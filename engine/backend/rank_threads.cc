#include "engine/backend/rank_threads.h"

namespace arbor {

RankThreads::RankThreads(std::vector<Backend*> ranks)
    : ranks_(std::move(ranks)), errors_(ranks_.size()) {
  for (int r = 1; r < size(); ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankThreads::~RankThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void RankThreads::worker(int rank) {
  std::exception_ptr bind_error;
  try {
    ranks_[static_cast<size_t>(rank)]->bind_thread();
  } catch (...) {
    bind_error = std::current_exception();
  }
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
    }
    std::exception_ptr error = bind_error;
    if (!error) {
      try {
        (*task)(rank);
      } catch (...) {
        error = std::current_exception();
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    errors_[static_cast<size_t>(rank)] = error;
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

void RankThreads::run(const std::function<void(int)>& fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &fn;
    pending_ = size() - 1;
    ++generation_;
    for (auto& e : errors_) e = nullptr;
  }
  start_cv_.notify_all();
  std::exception_ptr first;
  try {
    ranks_[0]->bind_thread();
    fn(0);
  } catch (...) {
    first = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  task_ = nullptr;
  if (!first)
    for (const auto& e : errors_)
      if (e) {
        first = e;
        break;
      }
  if (first) std::rethrow_exception(first);
}

}  // namespace arbor
