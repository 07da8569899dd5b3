#include "data/multiple_choice.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace gpt2 {

namespace {
constexpr std::size_t kHeaderInts = 256;
constexpr std::uint16_t kStartExample = 0xFFFF;

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& why) {
    throw InputError(path.string() + ": " + why);
}
}  // namespace

std::vector<MultipleChoiceExample> read_multiple_choice_file(const std::filesystem::path& path) {
    return parse_multiple_choice(read_file_bytes(path), path);
}

std::vector<MultipleChoiceExample> parse_multiple_choice(std::span<const std::uint8_t> bytes,
                                                         const std::filesystem::path& path) {
    if (bytes.size() < kHeaderInts * 4) fail(path, "too short for the 1024-byte header");
    std::array<std::int32_t, 4> header{};
    std::memcpy(header.data(), bytes.data(), sizeof(header));
    if (header[0] != kMultipleChoiceMagic) {
        fail(path, "not an llm.c evaluation file (magic " + std::to_string(header[0]) +
                       ", expected " + std::to_string(kMultipleChoiceMagic) + ")");
    }
    if (header[1] != 1) fail(path, "unsupported version " + std::to_string(header[1]));
    if (header[2] <= 0) fail(path, "no examples");
    if ((bytes.size() - kHeaderInts * 4) % 2 != 0) fail(path, "odd number of payload bytes");
    const std::size_t words = (bytes.size() - kHeaderInts * 4) / 2;
    const auto word = [&](std::size_t i) {
        std::uint16_t w = 0;
        std::memcpy(&w, bytes.data() + kHeaderInts * 4 + 2 * i, 2);
        return w;
    };
    std::vector<MultipleChoiceExample> examples;
    std::size_t at = 0;
    for (int e = 0; e < header[2]; ++e) {
        const std::string where = "example " + std::to_string(e);
        if (at + 5 > words)
            fail(path, where + " is cut short (the header says " + std::to_string(header[2]) +
                           " examples)");
        if (word(at) != kStartExample) fail(path, where + " does not start with 65535");
        const std::size_t size_words = word(at + 1) / 2;
        if (word(at + 1) % 2 != 0 || size_words < 6 || at + size_words > words) {
            fail(path, where + " has a bad size of " + std::to_string(word(at + 1)) + " bytes");
        }
        const std::size_t end = at + size_words;
        MultipleChoiceExample example;
        example.index = word(at + 2);
        example.label = word(at + 3);
        const int completions = word(at + 4);
        if (completions < 1 || example.label >= completions) {
            fail(path, where + ": label " + std::to_string(example.label) + " of " +
                           std::to_string(completions) + " completions");
        }
        std::size_t p = at + 5;
        const auto tokens = [&](const char* what) {
            if (p >= end || p + 1 + word(p) > end)
                fail(path, where + ": its " + std::string(what) + " runs past its size");
            std::vector<std::int32_t> ids(word(p));
            for (std::size_t i = 0; i < ids.size(); ++i)
                ids[i] = word(p + 1 + i);
            p += 1 + ids.size();
            return ids;
        };
        example.context = tokens("context");
        // The first ending token is predicted from the last context token (llm.c's files always
        // have one).
        if (example.context.empty()) fail(path, where + ": an empty context");
        for (int c = 0; c < completions; ++c) {
            example.endings.push_back(tokens("completion"));
            if (example.endings.back().empty()) fail(path, where + ": an empty completion");
        }
        if (p != end) fail(path, where + ": its size does not match its contents");
        examples.push_back(std::move(example));
        at = end;
    }
    if (at != words) fail(path, "data after the last example");
    return examples;
}

void write_multiple_choice_file(const std::filesystem::path& path,
                                std::span<const MultipleChoiceExample> examples) {
    std::vector<std::uint16_t> stream;
    std::size_t longest = 0;
    for (const MultipleChoiceExample& e : examples) {
        const std::size_t start = stream.size();
        const auto put_tokens = [&](const std::vector<std::int32_t>& ids) {
            stream.push_back(static_cast<std::uint16_t>(ids.size()));
            for (const std::int32_t id : ids) {
                if (id < 0 || id >= kStartExample)
                    fail(path, "token " + std::to_string(id) + " does not fit");
                stream.push_back(static_cast<std::uint16_t>(id));
            }
        };
        stream.insert(stream.end(), {kStartExample, 0, static_cast<std::uint16_t>(e.index),
                                     static_cast<std::uint16_t>(e.label),
                                     static_cast<std::uint16_t>(e.endings.size())});
        put_tokens(e.context);
        for (const auto& ending : e.endings)
            put_tokens(ending);
        const std::size_t bytes = 2 * (stream.size() - start);
        if (bytes >= 65536) fail(path, "example " + std::to_string(e.index) + " is too long");
        stream[start + 1] = static_cast<std::uint16_t>(bytes);
        longest = std::max(longest, bytes);
    }
    std::array<std::int32_t, kHeaderInts> header{};
    header[0] = kMultipleChoiceMagic;
    header[1] = 1;
    header[2] = static_cast<std::int32_t>(examples.size());
    header[3] = static_cast<std::int32_t>(longest);
    const std::array<std::span<const std::uint8_t>, 2> pieces = {
        std::span(reinterpret_cast<const std::uint8_t*>(header.data()), sizeof(header)),
        std::span(reinterpret_cast<const std::uint8_t*>(stream.data()), stream.size() * 2)};
    write_file_atomically(path, pieces);
}

}  // namespace gpt2
