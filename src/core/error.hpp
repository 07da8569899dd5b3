// Errors: the exception types for bad input (files, flags, data), whose message is shown to the
// user as is, so it must name the file or flag at fault. UsageError, the kind only the command line
// can fix, makes the programs exit with 2 instead of 1.
#pragma once

#include <stdexcept>
#include <string>

namespace gpt2 {

class InputError : public std::runtime_error {
  public:
    explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

// Bad input that only the command line can fix, found after files were read (a flag that
// contradicts a checkpoint, say): the programs exit with 2, as for any bad flag, not 1.
class UsageError : public InputError {
  public:
    using InputError::InputError;
};

}  // namespace gpt2
