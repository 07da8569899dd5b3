// Decoding with compact weights (inference --weights bf16|int8) against fp32: the int8 rows are
// the stated quantisation, logits of a 124M-shaped model stay within the stated tolerances, the
// prompt path (GEMM on widened rows) agrees with the token path (compact dot products), more
// workers than a matrix has cache lines of columns still decode, a trained character model's
// greedy text is identical in bf16 and int8 picks fp32's next token on held-out text at least 98%
// of the time; llm.c's bf16 model files load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/checkpoint.hpp"
#include "model/decode_weights.hpp"
#include "model/kv_cache.hpp"
#include "process_support.hpp"
#include "threads/thread_pool.hpp"
#include "tokenizer/tokenizer.hpp"

namespace gpt2 {
namespace {

using test::run_command;
using test::ScratchDir;

double relative_error(std::span<const float> actual, std::span<const float> expected) {
    double diff = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < actual.size(); ++i) {
        diff += (actual[i] - expected[i]) * static_cast<double>(actual[i] - expected[i]);
        norm += expected[i] * static_cast<double>(expected[i]);
    }
    return std::sqrt(diff / norm);
}

// How far a prompt's logits may be from the token path's in a session with compact weights,
// whose K/V cache holds bf16. Both paths compute the same function in fp32 but in different
// orders (matrix products against matrix-vector products), so a key or value differs between
// them by about 1e-7 relative (measured: the logits differ by 2e-7 to 5e-7 when no cached number
// rounds differently). Rounded to bf16 for the cache, two such numbers land on neighbouring bf16
// values when a rounding boundary falls between them: with probability about 1e-7 / 2^-8 = 2.6e-5
// per number, which over a prompt's 2 * L * T * C cached numbers (5,120 for the first test below)
// happens now and then (it does with OpenBLAS's Haswell kernels: 1.35e-5). One such number then
// differs by one bf16 ulp, 2^-8 of itself; against the norm of the T x C numbers of its cache
// tensor that is at most 2^-8 / sqrt(T * C) of it (for a number of average size), and attention,
// the layers after it and the LM head carry a relative change of the cache to the logits without
// gain (LayerNorm renormalises; measured here well below it). So the bound is the larger of the
// fp32 orders' 1e-5 and 2^-8 / sqrt(T * C): a wrong row, scale or block moves them by > 1e-2.
double compact_prompt_bound(int T, int C) {
    return std::max(1e-5, std::ldexp(1.0, -8) / std::sqrt(static_cast<double>(T) * C));
}

TEST(DecodeWeights, Int8RowsAreSymmetricPerRowQuantisation) {
    Model model(ModelConfig{16, 50, 128, 2, 2, 32});
    init_parameters(model, 3);
    const DecodeWeights int8(model, WeightFormat::Int8);
    for (const ParamTensor t : {ParamTensor::wte, ParamTensor::qkvw, ParamTensor::fcprojw}) {
        const int K = matrix_row_length(model.config, t);
        const float* first = model.layout.tensor(model.weights(), t).data();
        const std::size_t rows = model.layout.size(t) / static_cast<std::size_t>(K);
        for (std::size_t r = 0; r < rows; ++r) {
            const float* w = first + r * K;
            const QuantizedRows q = int8.rows(w);
            float max_abs = 0.0f;
            for (int k = 0; k < K; ++k)
                max_abs = std::max(max_abs, std::abs(w[k]));
            if (max_abs == 0.0f) continue;  // padded wte rows
            ASSERT_FLOAT_EQ(q.scales[0], max_abs / 127.0f) << param_tensor_name(t) << " row " << r;
            for (int k = 0; k < K; ++k) {
                ASSERT_LE(std::abs(q.int8[k] * q.scales[0] - w[k]), 0.5f * q.scales[0] * 1.0001f)
                    << param_tensor_name(t) << " row " << r << " col " << k;
            }
        }
    }
    const DecodeWeights bf16(model, WeightFormat::Bf16);
    const float* fcw = model.layout.tensor(model.weights(), ParamTensor::fcw).data();
    EXPECT_EQ(static_cast<std::uint16_t>(bf16.rows(fcw + 32).bf16[5]),
              static_cast<std::uint16_t>(to_bf16(fcw[37])));
    EXPECT_LT(int8.bytes(), bf16.bytes());
    EXPECT_EQ(bf16.bytes(), decode_matrix_count(model) * 2);
}

// Logits over a prompt and then token by token, with the given weights.
std::vector<std::vector<float>> decode_logits(const Model& model, const DecodeWeights* compact,
                                              std::span<const std::int32_t> prompt,
                                              std::span<const std::int32_t> continuation,
                                              int threads) {
    ThreadPool pool(threads);
    KvCacheSession session(model, pool, 0, compact);
    std::vector<std::vector<float>> all;
    const auto keep = [&](std::span<const float> logits) {
        all.emplace_back(logits.begin(), logits.end());
    };
    keep(session.prefill(prompt));
    for (const std::int32_t t : continuation)
        keep(session.step(t));
    return all;
}

TEST(DecodeWeights, LogitsOfA124MShapedModelStayCloseToFp32) {
    Model model(preset_config("gpt2-124M", 50257));
    {
        ThreadPool pool(2);
        init_parameters(model, 21, &pool);
    }
    std::vector<std::int32_t> prompt, continuation;
    for (int i = 0; i < 24; ++i)
        prompt.push_back((i * 7919) % 50257);
    for (int i = 0; i < 8; ++i)
        continuation.push_back((i * 104729 + 11) % 50257);
    const auto fp32 = decode_logits(model, nullptr, prompt, continuation, 2);
    // GPT-2's init makes every logit small; the error is relative to the logits' norm.
    const double tolerance[2] = {1e-2, 4e-2};
    const WeightFormat formats[2] = {WeightFormat::Bf16, WeightFormat::Int8};
    for (int f = 0; f < 2; ++f) {
        const DecodeWeights compact(model, formats[f]);
        const auto logits = decode_logits(model, &compact, prompt, continuation, 2);
        double worst = 0.0;
        for (std::size_t i = 0; i < fp32.size(); ++i)
            worst = std::max(worst, relative_error(logits[i], fp32[i]));
        std::printf("%s logits vs fp32 (124M shape): worst relative error %.2e\n",
                    std::string(weight_format_name(formats[f])).c_str(), worst);
        EXPECT_LT(worst, tolerance[f]) << weight_format_name(formats[f]);
        EXPECT_GT(worst, 0.0) << weight_format_name(formats[f]) << " logits identical to fp32";
    }
}

TEST(DecodeWeights, ThePromptPathAgreesWithTheTokenPath) {
    // Prefill runs matrix products (on rows widened from the compact copy, or on activation
    // pieces against the compact rows), a step runs dot products on the compact rows themselves:
    // the two must compute the same function.
    Model model(ModelConfig{64, 97, 128, 2, 4, 64});
    init_parameters(model, 5);
    std::vector<std::int32_t> tokens;
    for (int i = 0; i < 20; ++i)
        tokens.push_back((i * 31 + 3) % 97);
    for (const WeightFormat format : {WeightFormat::Bf16, WeightFormat::Int8}) {
        const DecodeWeights compact(model, format);
        const auto stepped = decode_logits(model, &compact, std::span(tokens).first(1),
                                           std::span(tokens).subspan(1), 2);
        for (const PromptProducts products : {PromptProducts::Widened, PromptProducts::Pieces}) {
            ThreadPool pool(2);
            KvCacheSession session(model, pool, 0, &compact, products);
            const auto prefilled = session.prefill(tokens);
            EXPECT_LT(relative_error(prefilled, stepped.back()),
                      compact_prompt_bound(static_cast<int>(tokens.size()), model.config.channels))
                << weight_format_name(format) << ", "
                << (products == PromptProducts::Pieces ? "pieces" : "widened");
        }
    }
}

// A prompt's logits in bf16 and int8, both ways its products run (rows widened to the fp32 GEMM;
// activations in pieces against the rows as stored), against token-by-token decoding (the compact
// matrix-vector products), for prompts around the prompt forward's block edges and over several
// chunks, with 1-3 workers. Within compact_prompt_bound as the test above: both compute the same
// function.
TEST(DecodeWeights, LongPromptsAgreeWithTheTokenPathInEveryWayAndThreadCount) {
    Model model(ModelConfig{1024, 97, 128, 2, 2, 32});
    init_parameters(model, 6);
    std::vector<std::int32_t> tokens;
    for (int i = 0; i < 1000; ++i)
        tokens.push_back((i * 37 + 11) % 97);
    const int lengths[] = {1, 63, 64, 65, 1000};
    for (const WeightFormat format : {WeightFormat::Bf16, WeightFormat::Int8}) {
        const DecodeWeights compact(model, format);
        // Token by token: the logits after each of the prompts' last tokens.
        const auto stepped = decode_logits(model, &compact, std::span(tokens).first(1),
                                           std::span(tokens).subspan(1, 999), 1);
        for (const PromptProducts products : {PromptProducts::Widened, PromptProducts::Pieces}) {
            for (const int threads : {1, 2, 3}) {
                ThreadPool pool(threads);
                KvCacheSession session(model, pool, 0, &compact, products);
                for (const int n : lengths) {
                    const auto logits =
                        session.prefill(std::span(tokens).first(static_cast<std::size_t>(n)));
                    const double error =
                        relative_error(logits, stepped[static_cast<std::size_t>(n - 1)]);
                    EXPECT_LT(error, compact_prompt_bound(n, model.config.channels))
                        << weight_format_name(format) << ", "
                        << (products == PromptProducts::Pieces ? "pieces" : "widened") << ", "
                        << threads << " workers, prompt of " << n;
                }
            }
        }
    }
}

// The Llama family's block (SwiGLU, grouped-query heads, an untied head, whose rows are compact
// too) and the speedrun's (QK-norm, the embeddings' norm, ReLU^2) decode with compact weights as
// GPT-2 does: the prompt path, both ways, within compact_prompt_bound of the token path (RMSNorm
// renormalises as LayerNorm does), and the logits within the 124M test's tolerances of fp32's.
TEST(DecodeWeights, TheLlamaFamilysCompactDecodingFollowsFp32AndItsTokenPath) {
    for (const bool speedrun : {false, true}) {
        Architecture a;
        a.norm = NormKind::RmsNorm;
        a.positions = PositionKind::Rotary;
        a.biases = false;
        a.tied_head = false;
        a.kv_heads = 2;
        a.mlp = speedrun ? MlpKind::ReluSquared : MlpKind::SwiGlu;
        a.mlp_hidden = 96;
        a.norm_gains = !speedrun;
        a.qk_norm = speedrun;
        a.embedding_norm = speedrun;
        Model model(ModelConfig(64, 97, 128, 2, 4, 64, a));
        init_parameters(model, 7);
        std::vector<std::int32_t> tokens;
        for (int i = 0; i < 20; ++i)
            tokens.push_back((i * 31 + 3) % 97);
        const auto fp32 = decode_logits(model, nullptr, std::span(tokens).first(1),
                                        std::span(tokens).subspan(1), 2);
        const double tolerance[2] = {1e-2, 4e-2};
        const WeightFormat formats[2] = {WeightFormat::Bf16, WeightFormat::Int8};
        for (int f = 0; f < 2; ++f) {
            const std::string name =
                std::string(weight_format_name(formats[f])) + (speedrun ? ", speedrun" : ", llama");
            const DecodeWeights compact(model, formats[f]);
            const auto stepped = decode_logits(model, &compact, std::span(tokens).first(1),
                                               std::span(tokens).subspan(1), 2);
            double worst = 0.0;
            for (std::size_t i = 0; i < fp32.size(); ++i)
                worst = std::max(worst, relative_error(stepped[i], fp32[i]));
            EXPECT_LT(worst, tolerance[f]) << name;
            EXPECT_GT(worst, 0.0) << name << ": logits identical to fp32";
            for (const PromptProducts products :
                 {PromptProducts::Widened, PromptProducts::Pieces}) {
                ThreadPool pool(2);
                KvCacheSession session(model, pool, 0, &compact, products);
                const auto prefilled = session.prefill(tokens);
                EXPECT_LT(relative_error(prefilled, stepped.back()),
                          compact_prompt_bound(static_cast<int>(tokens.size()), 64))
                    << name << ", " << (products == PromptProducts::Pieces ? "pieces" : "widened");
            }
        }
    }
}

TEST(DecodeWeights, MoreWorkersThanCacheLinesOfColumnsStillDecode) {
    // C = 32 is two cache lines of columns and V = Vp = 128 eight: with 3 and 9 workers some
    // workers' shares of the projections (and, with 9, of the LM head) are empty and start at
    // the end of their matrix. int8 weights once looked those rows up, DecodeWeights::rows threw
    // inside the worker, and the others waited at the barrier forever.
    Model model(ModelConfig{16, 128, 128, 1, 2, 32});
    init_parameters(model, 9);
    std::vector<std::int32_t> tokens;
    for (int i = 0; i < 12; ++i)
        tokens.push_back((i * 37 + 5) % 128);
    const auto prompt = std::span<const std::int32_t>(tokens).first(6);
    const auto continuation = std::span<const std::int32_t>(tokens).subspan(6);
    for (const WeightFormat format : {WeightFormat::Bf16, WeightFormat::Int8}) {
        const DecodeWeights compact(model, format);
        const auto one = decode_logits(model, &compact, prompt, continuation, 1);
        for (const int threads : {3, 9}) {
            const auto many = decode_logits(model, &compact, prompt, continuation, threads);
            ASSERT_EQ(many.size(), one.size());
            for (std::size_t i = 0; i < one.size(); ++i) {
                EXPECT_LT(relative_error(many[i], one[i]), 1e-5)
                    << weight_format_name(format) << ", " << threads << " workers, logits " << i;
            }
        }
    }
}

// A character model trained for 300 steps (seconds), the tokenizer it was trained with and the
// validation text it never saw.
struct TrainedCharModel {
    LoadedModel loaded;
    std::unique_ptr<Tokenizer> tokenizer;
    std::vector<std::int32_t> held_out;
};

std::optional<TrainedCharModel> train_char_model(const ScratchDir& dir) {
    std::filesystem::path corpus;
    for (const auto& p : {std::filesystem::path(GPT2_SOURCE_DIR) / "data/tinyshakespeare.txt",
                          std::filesystem::path(GPT2_SHARED_DATA_DIR) / "tinyshakespeare.txt"}) {
        if (std::filesystem::exists(p)) {
            corpus = p;
            break;
        }
    }
    if (corpus.empty()) return std::nullopt;
    const std::string command =
        test::build_path("train_gpt2") +
        " --n-layer 2 --n-head 4 --n-embd 64 --seq-len 64 --batch-size 8 --max-steps 300"
        " --warmup-steps 20 --val-every 0 --sample-every 0 --checkpoint-every 0 --threads 2"
        " --seed 3 --data " +
        corpus.string() + " --out-dir " + (dir / "out");
    const auto run = run_command(command);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    TrainedCharModel trained{load_checkpoint(dir / "out/model_000300.bin"), nullptr, {}};
    trained.tokenizer = deserialize_tokenizer(trained.loaded.extras->tokenizer);
    const std::string text = read_text_file(corpus);
    // The last 10% of the corpus is the validation split the run never trained on.
    const std::string held_out = text.substr(text.size() - text.size() / 10);
    trained.held_out = trained.tokenizer->encode(held_out.substr(0, 4000));
    return std::optional<TrainedCharModel>(std::move(trained));
}

TEST(DecodeWeights, TrainedCharModelBf16GreedyTextIsIdenticalAndInt8AgreesOnHeldOutText) {
    const ScratchDir dir("gpt2-decode-precision");
    std::optional<TrainedCharModel> maybe = train_char_model(dir);
    if (!maybe) GTEST_SKIP() << "data/tinyshakespeare.txt missing";
    TrainedCharModel& trained = *maybe;
    const Model& model = trained.loaded.model;

    // Greedy continuation of a prompt, 200 tokens.
    const auto greedy = [&](const DecodeWeights* compact) {
        ThreadPool pool(2);
        KvCacheSession session(model, pool, 0, compact);
        std::vector<std::int32_t> tokens = trained.tokenizer->encode("ROMEO:\n");
        Rng rng(1);
        (void)generate_kv(session, tokens, 200, SamplingParams{0.0f, 0, 1.0f}, rng);
        return trained.tokenizer->decode(tokens);
    };
    const DecodeWeights bf16(model, WeightFormat::Bf16);
    const std::string fp32_text = greedy(nullptr);
    EXPECT_EQ(greedy(&bf16), fp32_text);

    // Teacher-forced over held-out text: int8's most likely next token against fp32's.
    const DecodeWeights int8(model, WeightFormat::Int8);
    const int window = model.config.max_seq_len;
    int agree = 0, total = 0;
    for (std::size_t start = 0; start + window <= trained.held_out.size(); start += window) {
        const auto chunk = std::span(trained.held_out).subspan(start, window);
        const auto a = decode_logits(model, nullptr, chunk.first(1), chunk.subspan(1), 1);
        const auto b = decode_logits(model, &int8, chunk.first(1), chunk.subspan(1), 1);
        for (std::size_t i = 0; i < a.size(); ++i) {
            const auto top = [](const std::vector<float>& v) {
                return std::max_element(v.begin(), v.end()) - v.begin();
            };
            agree += top(a[i]) == top(b[i]) ? 1 : 0;
            ++total;
        }
    }
    ASSERT_GT(total, 1000);
    const double agreement = static_cast<double>(agree) / total;
    std::printf("int8 top-1 agreement with fp32 on %d held-out positions: %.2f%%\n", total,
                100.0 * agreement);
    EXPECT_GE(agreement, 0.98);
}

TEST(DecodeWeights, AnUnknownFormatIsOneClearError) {
    const auto run = run_command(test::build_path("inference") + " model.bin --weights int4");
    EXPECT_EQ(run.exit_code, 2) << run.output;
    EXPECT_NE(run.output.find("--weights: unknown weight format 'int4' (did you mean int8?); "
                              "known: fp32, bf16, int8"),
              std::string::npos)
        << run.output;
}

TEST(Checkpoint, LlmcBf16ModelFilesLoadWidenedExactly) {
    const ScratchDir dir("gpt2-llmc-bf16");
    Model model(ModelConfig{16, 50, 128, 2, 2, 32});
    init_parameters(model, 9);
    // llm.c's layout: int32 header[256] (magic, version 5, maxT, V, L, NH, C, Vp), bf16 params.
    std::vector<std::int32_t> header(256, 0);
    const ModelConfig& c = model.config;
    const std::int32_t fields[8] = {
        kLlmcModelMagic, 5,           c.max_seq_len, c.vocab_size,
        c.num_layers,    c.num_heads, c.channels,    c.padded_vocab_size};
    std::copy(std::begin(fields), std::end(fields), header.begin());
    std::vector<Bf16> params(model.params.size());
    convert_to_bf16(params.data(), model.params.data(), params.size());
    {
        std::ofstream out(dir / "model_bf16.bin", std::ios::binary);
        out.write(reinterpret_cast<const char*>(header.data()), 1024);
        out.write(reinterpret_cast<const char*>(params.data()),
                  static_cast<std::streamsize>(params.size() * sizeof(Bf16)));
    }
    const LoadedModel loaded = load_checkpoint(dir / "model_bf16.bin");
    EXPECT_EQ(loaded.model.config, c);
    EXPECT_FALSE(loaded.extras.has_value());
    for (std::size_t i = 0; i < params.size(); ++i)
        ASSERT_EQ(loaded.model.params[i], to_float(params[i])) << i;

    // One byte short: one clear error naming the file.
    std::filesystem::resize_file(dir / "model_bf16.bin", 1024 + params.size() * 2 - 1);
    try {
        (void)load_checkpoint(dir / "model_bf16.bin");
        FAIL() << "a truncated bf16 file loaded";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("model_bf16.bin"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
    }
}

}  // namespace
}  // namespace gpt2
