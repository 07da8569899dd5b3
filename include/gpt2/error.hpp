// Errors: one exception type for bad input (files, flags, data) whose message is shown to the user
// as is, so it must name the file or flag at fault.
#pragma once

#include <stdexcept>
#include <string>

namespace gpt2 {

class InputError : public std::runtime_error {
  public:
    explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace gpt2
