// A process-wide timer for the accumulator's take timeouts (TensorFlow-free).
//
// A waiting take must not hold a thread (TakeGrad is an asynchronous op), so its timeout cannot be a sleeping
// thread either.  One lazily started thread serves every deadline in the process; callbacks run on it, one at
// a time, without any timer lock held, so a callback may take other locks (and call Cancel()).
#ifndef TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_DEADLINE_TIMER_H_
#define TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_DEADLINE_TIMER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <utility>

namespace tf_embed_ops {

class DeadlineTimer {
 public:
  using Clock = std::chrono::steady_clock;
  using Id = uint64_t;

  // The shared instance.  Never destroyed: its thread may outlive static destruction at process exit.
  static DeadlineTimer& Global();

  // Runs `callback` on the timer thread at `deadline` (or soon after) unless cancelled first.
  Id Schedule(Clock::time_point deadline, std::function<void()> callback);

  // Removes a pending callback.  Returns false when it already ran, is running, or never existed.  The
  // callback's captures are destroyed before returning (outside the timer's lock).
  bool Cancel(Id id);

 private:
  DeadlineTimer() = default;
  void Run();

  std::mutex mu_;
  std::condition_variable wake_;
  bool started_ = false;
  Id next_id_ = 1;
  // Ordered by (deadline, id): the front is the next to fire.
  std::map<std::pair<Clock::time_point, Id>, std::function<void()>> pending_;
  std::map<Id, Clock::time_point> deadline_of_;
};

}  // namespace tf_embed_ops

#endif  // TF_EMBED_OPS_CC_LIB_SPARSE_ACCUMULATOR_DEADLINE_TIMER_H_
