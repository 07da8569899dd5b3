// Fuzzes gpt2::MappedShard (llm.c token shard header and size checks) and validate_token_range.
#include <cstdint>

#include "data/shard.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size > gpt2::fuzz::kMaxInputBytes) return -1;
    const std::filesystem::path path = gpt2::fuzz::scratch_dir() / "shard_000000.bin";
    gpt2::fuzz::write_bytes(path, {data, size});
    try {
        const gpt2::MappedShard shard(path);
        const std::span<const std::uint16_t> tokens = shard.tokens();
        FUZZ_CHECK(!tokens.empty());
        FUZZ_CHECK(gpt2::kShardHeaderBytes + 2 * tokens.size() == size);
        std::uint64_t sum = 0;  // touch every token, as the data loader does
        for (const std::uint16_t id : tokens)
            sum += id;
        FUZZ_CHECK(sum <= 0xFFFFull * tokens.size());
        for (const int vocab_size : {65, 50257, 65536}) {
            try {
                gpt2::validate_token_range(tokens, vocab_size, path);
            } catch (const gpt2::InputError& error) {
                gpt2::fuzz::rejected(error);
                FUZZ_CHECK(vocab_size != 65536);  // every uint16 id is below 65536
            }
        }
    } catch (const gpt2::InputError& error) {
        gpt2::fuzz::rejected(error);
    }
    return 0;
}
