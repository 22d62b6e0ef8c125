#include "cc/lib/sparse_accumulator_deadline_timer.h"

#include <thread>

namespace tf_embed_ops {

DeadlineTimer& DeadlineTimer::Global() {
  static DeadlineTimer* timer = new DeadlineTimer();
  return *timer;
}

DeadlineTimer::Id DeadlineTimer::Schedule(Clock::time_point deadline, std::function<void()> callback) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!started_) {
    // Detached: the timer is immortal, and joining at exit would block on a thread that waits forever.
    std::thread([this] { Run(); }).detach();
    started_ = true;
  }
  const Id id = next_id_++;
  pending_.emplace(std::make_pair(deadline, id), std::move(callback));
  deadline_of_.emplace(id, deadline);
  wake_.notify_one();
  return id;
}

bool DeadlineTimer::Cancel(Id id) {
  std::function<void()> dropped;  // destroyed after the lock is released: its captures may take locks
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = deadline_of_.find(id);
    if (found == deadline_of_.end()) return false;
    auto entry = pending_.find(std::make_pair(found->second, id));
    dropped = std::move(entry->second);
    pending_.erase(entry);
    deadline_of_.erase(found);
  }
  return true;
}

void DeadlineTimer::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (pending_.empty()) {
      wake_.wait(lock);
      continue;
    }
    auto first = pending_.begin();
    if (Clock::now() < first->first.first) {
      wake_.wait_until(lock, first->first.first);
      continue;
    }
    std::function<void()> callback = std::move(first->second);
    deadline_of_.erase(first->first.second);
    pending_.erase(first);
    lock.unlock();
    callback();
    callback = nullptr;
    lock.lock();
  }
}

}  // namespace tf_embed_ops
