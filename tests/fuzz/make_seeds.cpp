// Writes the fuzz seed corpus with the library's own writers: make_seeds tests/fuzz/corpus
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "data/multiple_choice.hpp"
#include "data/shard.hpp"
#include "formats/checkpoint.hpp"
#include "formats/gguf.hpp"
#include "formats/hugging_face.hpp"
#include "formats/resume_state.hpp"
#include "fuzz_support.hpp"

namespace fs = std::filesystem;

namespace {

fs::path target_dir(const fs::path& root, const std::string& target) {
    const fs::path dir = root / target;
    fs::create_directories(dir);
    return dir;
}

void write_text(const fs::path& path, std::string_view text) {
    gpt2::fuzz::write_bytes(path, gpt2::fuzz::as_bytes(text));
}

std::string utf8(std::uint32_t code_point) {
    std::string out;
    if (code_point < 0x80) {
        out += static_cast<char>(code_point);
    } else {
        out += static_cast<char>(0xC0 | (code_point >> 6));
        out += static_cast<char>(0x80 | (code_point & 0x3F));
    }
    return out;
}

// GPT-2's spelling of raw bytes as printable characters (encoder.py's bytes_to_unicode): the
// printable Latin-1 bytes stand for themselves, the others become U+0100, U+0101, ... in order.
std::string spell(std::string_view bytes) {
    std::array<std::uint32_t, 256> code_point{};
    std::uint32_t next_extra = 0x100;
    for (int b = 0; b < 256; ++b) {
        const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        code_point[b] = printable ? static_cast<std::uint32_t>(b) : next_extra++;
    }
    std::string out;
    for (const char c : bytes)
        out += utf8(code_point[static_cast<unsigned char>(c)]);
    return out;
}

// A tiny GPT-2-style encoder.json / vocab.bpe pair: the 256 bytes, a few merges, <|endoftext|>.
std::pair<std::string, std::string> tiny_gpt2_files(bool crlf, bool version_line) {
    const std::vector<std::pair<std::string, std::string>> merges = {
        {" ", "t"}, {"h", "e"}, {" t", "he"}, {"i", "n"}, {" ", "a"}, {"e", "r"}, {" a", "n"}};
    nlohmann::json encoder = nlohmann::json::object();
    int next_id = 0;
    for (int b = 0; b < 256; ++b)
        encoder[spell(std::string(1, static_cast<char>(b)))] = next_id++;
    std::string vocab_bpe = version_line ? "#version: 0.2" + std::string(crlf ? "\r\n" : "\n") : "";
    for (const auto& [left, right] : merges) {
        encoder[spell(left + right)] = next_id++;
        vocab_bpe += spell(left) + " " + spell(right) + (crlf ? "\r\n" : "\n");
    }
    encoder["<|endoftext|>"] = next_id++;
    return {encoder.dump(), vocab_bpe};
}

gpt2::Model make_model(const gpt2::ModelConfig& config, std::uint64_t seed) {
    gpt2::Model model(config);
    gpt2::init_parameters(model, seed);
    return model;
}

gpt2::ModelConfig config_for(const gpt2::Tokenizer& tokenizer, int max_seq_len, int layers,
                             int heads, int channels) {
    const int vocab = tokenizer.vocab_size();
    return {max_seq_len, vocab, gpt2::pad_vocab(vocab), layers, heads, channels};
}

std::string small_config_json(const gpt2::ModelConfig& c) {
    nlohmann::json j;
    j["model"] = {{"max_seq_len", c.max_seq_len},
                  {"vocab_size", c.vocab_size},
                  {"num_layers", c.num_layers},
                  {"num_heads", c.num_heads},
                  {"channels", c.channels}};
    j["training"] = {{"tokenizer", "char"}, {"seq_len", c.max_seq_len}, {"max_steps", 1}};
    return j.dump();
}

}  // namespace

// Long on purpose: one seed file after another, each a few lines, in the order of the targets.
int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
        return 2;
    }
    const fs::path root = argv[1];

    // Tokenizers of every kind.
    const auto char_tok = gpt2::make_char_tokenizer("hello world, the cat\n");
    const auto bpe_tok =
        gpt2::train_bpe_tokenizer("the cat sat on the mat. the end. the cat.", 264);
    const fs::path gpt2_dir = gpt2::fuzz::scratch_dir() / "gpt2";
    fs::create_directories(gpt2_dir);
    const auto [encoder_json, vocab_bpe] = tiny_gpt2_files(false, true);
    write_text(gpt2_dir / "encoder.json", encoder_json);
    write_text(gpt2_dir / "vocab.bpe", vocab_bpe);
    const auto gpt2_tok = gpt2::load_gpt2_tokenizer(gpt2_dir);

    // deserialize_tokenizer
    {
        const fs::path dir = target_dir(root, "tokenizer");
        gpt2::fuzz::write_bytes(dir / "char.bin", char_tok->serialize());
        gpt2::fuzz::write_bytes(dir / "bpe.bin", bpe_tok->serialize());
        gpt2::fuzz::write_bytes(dir / "gpt2.bin", gpt2_tok->serialize());
        // Version 2: a gpt2 tokenizer that splits every digit first (SmolLM2's).
        gpt2::SpelledBpe digits = gpt2::spell_byte_level_bpe(*gpt2_tok);
        digits.pre = gpt2::PreTokenizer::DigitsThenGpt2;
        gpt2::fuzz::write_bytes(dir / "gpt2_digits.bin",
                                gpt2::tokenizer_from_spelling(digits, "seed")->serialize());
    }
    // read_llmc_tokenizer (version 2, and the char one as version 1 without an EOT id)
    {
        const fs::path dir = target_dir(root, "llmc_tokenizer");
        gpt2::write_llmc_tokenizer(*char_tok, dir / "char_v2.bin");
        gpt2::write_llmc_tokenizer(*bpe_tok, dir / "bpe_v2.bin");
        gpt2::write_llmc_tokenizer(*gpt2_tok, dir / "gpt2_v2.bin");
        std::vector<std::uint8_t> v1 = gpt2::read_file_bytes(dir / "char_v2.bin");
        const std::uint32_t version = 1, no_eot = 0;
        std::memcpy(v1.data() + 4, &version, 4);
        std::memcpy(v1.data() + 12, &no_eot, 4);
        gpt2::fuzz::write_bytes(dir / "char_v1.bin", v1);
    }
    // load_gpt2_tokenizer: encoder.json, NUL, vocab.bpe
    {
        const fs::path dir = target_dir(root, "gpt2_tokenizer");
        const auto write_pair = [&](const char* name, bool crlf, bool version, bool no_merges) {
            const auto [encoder, merges] = tiny_gpt2_files(crlf, version);
            write_text(dir / name, encoder + std::string(1, '\0') + (no_merges ? "" : merges));
        };
        write_pair("merges_lf.txt", false, true, false);
        write_pair("merges_crlf_noversion.txt", true, false, false);
        write_pair("no_merges.txt", false, true, true);
    }
    // load_checkpoint: checkpoints with each tokenizer kind, and plain llm.c model files
    {
        const fs::path dir = target_dir(root, "checkpoint");
        const auto save = [&](const char* name, const gpt2::Tokenizer* tokenizer,
                              const gpt2::ModelConfig& config, std::uint64_t seed) {
            const gpt2::Model model = make_model(config, seed);
            std::optional<gpt2::CheckpointExtras> extras;
            if (tokenizer)
                extras = gpt2::CheckpointExtras{tokenizer->serialize(), small_config_json(config)};
            (void)gpt2::save_checkpoint(dir / name, model, extras);
        };
        save("char_L1_C8.bin", char_tok.get(), config_for(*char_tok, 8, 1, 1, 8), 1);
        save("bpe_L1_C4.bin", bpe_tok.get(), config_for(*bpe_tok, 4, 1, 1, 4), 2);
        save("gpt2_L1_C4.bin", gpt2_tok.get(), config_for(*gpt2_tok, 4, 1, 2, 4), 3);
        save("llmc_L2_C4.bin", nullptr, gpt2::ModelConfig{4, 10, 16, 2, 2, 4}, 4);
        save("llmc_L1_C8.bin", nullptr, config_for(*char_tok, 8, 1, 1, 8), 5);
        // Version 30: another architecture, its configuration record in the trailer.
        gpt2::ModelConfig llama = config_for(*char_tok, 8, 1, 2, 8);
        llama.arch.norm = gpt2::NormKind::RmsNorm;
        llama.arch.positions = gpt2::PositionKind::Rotary;
        llama.arch.mlp = gpt2::MlpKind::SwiGlu;
        llama.arch.biases = false;
        llama.arch.kv_heads = 1;
        llama.arch.tied_head = false;
        save("llama_L1_C8.bin", char_tok.get(), llama, 11);
        // The speedrun's block: QK-norm and the embeddings' norm (the record's version 2).
        // (llama_record_v1_L1_C8.bin, committed beside, is the previous build's version 1.)
        gpt2::ModelConfig speedrun = config_for(*char_tok, 8, 1, 2, 8);
        speedrun.arch.norm = gpt2::NormKind::RmsNorm;
        speedrun.arch.norm_gains = false;
        speedrun.arch.positions = gpt2::PositionKind::Rotary;
        speedrun.arch.mlp = gpt2::MlpKind::ReluSquared;
        speedrun.arch.biases = false;
        speedrun.arch.tied_head = false;
        speedrun.arch.qk_norm = true;
        speedrun.arch.embedding_norm = true;
        save("speedrun_L1_C8.bin", char_tok.get(), speedrun, 12);
    }
    // load_gguf_model: each tokenizer kind and each tensor type (Q8_0 needs rows of 32)
    {
        const fs::path dir = target_dir(root, "gguf");
        const auto write = [&](const char* name, const gpt2::Tokenizer& tokenizer, int channels,
                               gpt2::GgufWeights weights, std::uint64_t seed) {
            const gpt2::Model model = make_model(config_for(tokenizer, 4, 1, 1, channels), seed);
            gpt2::write_gguf(dir / name, model, tokenizer, weights, name);
        };
        write("char_f32.gguf", *char_tok, 8, gpt2::GgufWeights::F32, 7);
        write("char_q8_0.gguf", *char_tok, 32, gpt2::GgufWeights::Q8_0, 8);
        write("bpe_f16.gguf", *bpe_tok, 4, gpt2::GgufWeights::F16, 9);
        write("bpe_bf16.gguf", *bpe_tok, 4, gpt2::GgufWeights::Bf16, 10);
        // llama.cpp's llama architecture: 2 query heads over 1 key/value head of 4, untied.
        gpt2::ModelConfig llama = config_for(*bpe_tok, 4, 1, 2, 8);
        llama.arch.norm = gpt2::NormKind::RmsNorm;
        llama.arch.positions = gpt2::PositionKind::Rotary;
        llama.arch.mlp = gpt2::MlpKind::SwiGlu;
        llama.arch.mlp_hidden = 12;
        llama.arch.biases = false;
        llama.arch.kv_heads = 1;
        llama.arch.tied_head = false;
        gpt2::write_gguf(dir / "llama_f32.gguf", make_model(llama, 11), *bpe_tok,
                         gpt2::GgufWeights::F32, "llama");
    }
    // SafetensorsFile::parse and the Hugging Face config reader (fuzz_hf_config's fixed shape)
    {
        const fs::path st = target_dir(root, "safetensors");
        const fs::path config = target_dir(root, "hf_config");
        const gpt2::Model model = make_model(gpt2::ModelConfig{8, 16, 128, 1, 2, 8}, 6);
        const fs::path scratch = gpt2::fuzz::scratch_dir() / "hf_seed";
        for (const auto& [type, name] : {std::pair{gpt2::ElementType::F32, "f32"},
                                         {gpt2::ElementType::F16, "f16"},
                                         {gpt2::ElementType::Bf16, "bf16"}}) {
            gpt2::write_hugging_face_model(scratch, model, nullptr, type);
            fs::copy_file(scratch / "model.safetensors", st / (std::string(name) + ".safetensors"),
                          fs::copy_options::overwrite_existing);
        }
        fs::copy_file(scratch / "config.json", config / "save_pretrained.json",
                      fs::copy_options::overwrite_existing);
        write_text(config / "hub_minimal.json",
                   R"({"model_type": "gpt2", "n_embd": 8, "n_head": 2, "n_layer": 1, "n_ctx": 8, )"
                   R"("vocab_size": 16, "resid_pdrop": 0.1, "n_inner": null})");
        // LlamaForCausalLM's keys (the files hold GPT-2's tensors: read up to their names).
        write_text(config / "llama_minimal.json",
                   R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 32, )"
                   R"("num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 1, )"
                   R"("vocab_size": 16, "max_position_embeddings": 8, "rms_norm_eps": 1e-05, )"
                   R"("rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu", )"
                   R"("rope_scaling": null})");
    }
    // load_resume_state for fuzz_resume_state's fixed shape
    {
        const fs::path dir = target_dir(root, "resume_state");
        const gpt2::ModelConfig config{8, 16, 128, 1, 1, 8};
        gpt2::OptimizerState optimizer(gpt2::ParameterLayout(config).total());
        for (std::size_t i = 0; i < optimizer.m.size(); ++i) {
            optimizer.m.data()[i] = 1e-3f * static_cast<float>(i % 17) - 8e-3f;
            optimizer.v.data()[i] = 1e-6f * static_cast<float>(i % 5);
        }
        for (const std::int64_t step : {1, 7, 3}) {  // 3: a Muon run's (version 6)
            optimizer.step = step;
            gpt2::ResumeState state;
            if (step == 3) state.optimizer = gpt2::OptimizerKind::Muon;
            state.step = step;
            state.seed = 1337;
            state.sequences_per_step = 4 * step;
            state.seq_len = 8;
            state.sample_rng = {1, 2, 3, 4};
            gpt2::save_resume_state(gpt2::state_path(dir, step), state, config, optimizer);
        }
        // Version 8: the same dimensions of another architecture (the record differs: refused).
        // (state_000011.bin, committed beside, is the previous build's version 7.)
        gpt2::ModelConfig rms = config;
        rms.arch.norm = gpt2::NormKind::RmsNorm;
        rms.arch.biases = false;
        gpt2::OptimizerState rms_optimizer(gpt2::ParameterLayout(rms).total());
        gpt2::ResumeState state;
        state.step = 5;
        gpt2::save_resume_state(gpt2::state_path(dir, 5), state, rms, rms_optimizer);
        // Version 9: a LoRA run on that architecture (q_proj and v_proj, with input dropout).
        gpt2::ResumeState lora;
        lora.step = 9;
        lora.lora.config = {2, 4.0f, gpt2::parse_lora_targets("q_proj,v_proj", "seed", {true}),
                            0.1f};
        lora.lora.base_fingerprint = 0x1234;
        gpt2::OptimizerState adapter_optimizer(gpt2::LoraLayout(rms, lora.lora.config).total());
        gpt2::save_resume_state(gpt2::state_path(dir, 9), lora, rms, adapter_optimizer);
    }
    // MappedShard
    {
        const fs::path dir = target_dir(root, "shard");
        const std::vector<std::int32_t> small = {0, 1, 2, 3, 4};
        gpt2::write_shard(dir / "shard_small.bin", small);
        std::vector<std::int32_t> wide(64);
        std::uint32_t x = 12345;
        for (std::int32_t& id : wide) {
            x = x * 1103515245u + 12345u;
            id = static_cast<std::int32_t>((x >> 8) & 0xFFFF);
        }
        gpt2::write_shard(dir / "shard_wide.bin", wide);
        gpt2::write_shard(dir / "shard_char.bin", char_tok->encode("hello world, the cat\n"));
    }
    // DocumentReader: first byte the kind (0 jsonl, 1 jsonl.gz, 2 jsonl.zst, 3 txt, 4 txt.gz),
    // second the forced cut's byte
    {
        const fs::path dir = target_dir(root, "documents");
        write_text(
            dir / "jsonl.bin",
            std::string("\x00\x00") +
                "{\"text\": \"first document\\nline\"}\n\n{\"id\": 2, \"text\": \"caf\u00e9\"}\n"
                "{\"body\": 1}\nnot json\n{\"text\": \"last\"}");
        write_text(dir / "text.bin", std::string("\x03\x14") +
                                         "First Citizen:\nBefore we proceed any further, hear "
                                         "me speak.\nAll:\nSpeak, speak.\n");
    }
    // parse_multiple_choice: two HellaSwag-like examples
    {
        const fs::path dir = target_dir(root, "multiple_choice");
        const std::vector<gpt2::MultipleChoiceExample> examples = {
            {0, 3, {32, 582, 318}, {{318, 1262}, {318}, {318, 4769, 257}, {4940, 10427}}},
            {1, 0, {15496}, {{11}, {13}, {0, 50256}, {50255}}}};
        gpt2::write_multiple_choice_file(dir / "two_examples.bin", examples);
    }
    // parse_train_options --config
    {
        const fs::path dir = target_dir(root, "train_config");
        write_text(dir / "small_model.toml",
                   "# a small model\n"
                   "n-layer = 2\nn-head = 2\nn-embd = 64\nseq-len = 32\nbatch-size = 8\n"
                   "lr = 0.001\nmin-lr = 0.0001\nschedule = \"linear\"\nno-shuffle = true\n"
                   "out-dir = \"out/small\"\n");
        write_text(dir / "bpe.toml",
                   "tokenizer = \"bpe\"\nvocab-size = 512\nmax-steps = 10\nwarmup-steps = 2\n"
                   "val-every = 5\nseed = 42\nthreads = 2\nlog-level = \"debug\"\n"
                   "pin-threads = false\nlr = [0.01, 0.002]\n");
        write_text(dir / "shards.ini",
                   "; llm.c shards with GPT-2's tokenizer\n"
                   "model=gpt2-124M\ntokenizer=gpt2\ntokenizer-dir=data/gpt2\n"
                   "train-data='data/shards/train_*.bin'\nval-data='data/shards/val_*.bin'\n"
                   "total-batch-tokens=524288\nseq-len=1024\nbatch-size=16\n"
                   "checkpoint-every=0\nresume=auto\n");
        write_text(dir / "bad_flag.toml", "n-layer = \"many\"\nno-such-flag = 1\n");
    }
    std::printf("seed corpus written to %s\n", root.c_str());
    return 0;
}
