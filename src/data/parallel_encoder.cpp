#include "data/parallel_encoder.hpp"

#include <atomic>
#include <exception>
#include <thread>

namespace gpt2 {

void encode_pieces(const Tokenizer& tokenizer, std::span<const DocumentPiece> pieces,
                   std::span<const bool> wanted, std::vector<std::vector<std::int32_t>>& out,
                   int threads, EotInText eot) {
    out.assign(pieces.size(), {});
    std::atomic<std::size_t> next{0};
    std::exception_ptr error;
    std::atomic<bool> failed{false};
    const auto work = [&] {
        for (std::size_t i; !failed && (i = next++) < pieces.size();) {
            if (!wanted[i]) continue;
            try {
                out[i] = tokenizer.encode(pieces[i].text, eot);
            } catch (...) {
                if (!failed.exchange(true)) error = std::current_exception();
            }
        }
    };
    std::vector<std::jthread> pool;
    for (int t = 1; t < threads; ++t)
        pool.emplace_back(work);
    work();
    pool.clear();
    if (error) std::rethrow_exception(error);
}

}  // namespace gpt2
