#include "data/prepare/hellaswag.hpp"

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "core/error.hpp"
#include "core/file_io.hpp"

namespace gpt2 {

std::vector<MultipleChoiceExample> read_hellaswag(const std::filesystem::path& jsonl,
                                                  const Tokenizer& tokenizer) {
    const std::string text = read_text_file(jsonl);
    std::vector<MultipleChoiceExample> examples;
    std::size_t line_number = 0;
    for (std::size_t begin = 0; begin < text.size();) {
        std::size_t end = text.find('\n', begin);
        if (end == std::string::npos) end = text.size();
        const std::string_view line(text.data() + begin, end - begin);
        begin = end + 1;
        ++line_number;
        if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
        const std::string where = jsonl.string() + ":" + std::to_string(line_number);
        MultipleChoiceExample example;
        try {
            const nlohmann::json record = nlohmann::json::parse(line);
            example.index = static_cast<int>(examples.size());
            example.label = record.at("label").get<int>();
            example.context =
                tokenizer.encode(record.at("ctx").get<std::string>(), EotInText::Text);
            for (const auto& ending : record.at("endings")) {
                // Appended rather than " " + ending: GCC 12 warns falsely (-Wrestrict) there.
                std::string text = " ";
                text += ending.get<std::string>();
                example.endings.push_back(tokenizer.encode(text, EotInText::Text));
            }
        } catch (const nlohmann::json::exception& e) {
            throw InputError(where + ": not a HellaSwag example (" + e.what() + ")");
        }
        if (example.endings.empty() || example.label < 0 ||
            example.label >= static_cast<int>(example.endings.size())) {
            throw InputError(where + ": label " + std::to_string(example.label) + " of " +
                             std::to_string(example.endings.size()) + " endings");
        }
        examples.push_back(std::move(example));
    }
    if (examples.empty()) throw InputError(jsonl.string() + ": no examples");
    return examples;
}

}  // namespace gpt2
