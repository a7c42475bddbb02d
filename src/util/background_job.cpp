#include "pipetrain/util/background_job.hpp"

#include <chrono>
#include <exception>
#include <stdexcept>

namespace pipetrain {

BackgroundJob::~BackgroundJob() {
  if (result_.valid()) result_.wait();
}

void BackgroundJob::start(std::function<std::string()> work) {
  if (!idle()) throw std::logic_error("a background job started while another runs");
  result_ = std::async(std::launch::async, [work = std::move(work)]() -> std::string {
    try {
      return work();
    } catch (const std::exception& e) {
      return e.what();
    }
  });
}

bool BackgroundJob::running() const {
  return result_.valid() && result_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

std::string BackgroundJob::collect() {
  if (idle()) return "";
  return result_.get();
}

}  // namespace pipetrain
