// Which bytes of a document a loss mask trains: prompt/response and chat records mark their
// responses (and the stretches around them) so that prepare_data can write a mask per token.
#pragma once

#include <cstddef>

namespace gpt2 {

// A stretch of a document's text, from the previous span's end (or 0) to `end`, and whether its
// tokens are trained (a response, an assistant's message) or not (a prompt, a role, a separator).
struct TextSpan {
    std::size_t end = 0;
    bool trained = false;
};

}  // namespace gpt2
