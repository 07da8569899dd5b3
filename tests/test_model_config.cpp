// The architecture as data: the tensor tables of the Llama family's and the speedrun's shapes
// (SmolLM2-135M's parameter count as Hugging Face publishes it), the versioned configuration
// record and its refusals, checkpoints and resume states of another architecture than GPT-2
// written and read back, and the previous version's GPT-2 files (tests/data/previous_version/):
// still read, written again byte for byte, and resumed by train_gpt2.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "core/file_io.hpp"
#include "formats/checkpoint.hpp"
#include "formats/resume_state.hpp"
#include "model/model.hpp"
#include "model/training_context.hpp"
#include "optim/muon.hpp"
#include "optim/optimizer.hpp"
#include "process_support.hpp"
#include "scratch_files.hpp"

namespace gpt2 {
namespace {

// SmolLM2-135M's config.json: 30 layers, hidden 576, 9 heads of 64, 3 key/value heads,
// intermediate 1536, vocabulary 49152, RMSNorm eps 1e-5, rope theta 100000, tied embeddings.
ModelConfig smollm2_135m() {
    Architecture a;
    a.norm = NormKind::RmsNorm;
    a.positions = PositionKind::Rotary;
    a.rope_theta = 100000.0f;
    a.mlp = MlpKind::SwiGlu;
    a.mlp_hidden = 1536;
    a.biases = false;
    a.kv_heads = 3;
    return ModelConfig(8192, 49152, 49152, 30, 9, 576, a);
}

// modded-nanogpt's block: RMSNorm without gains, rotary, QK-norm, ReLU^2, no biases, an untied
// head, zero-initialized projections.
ModelConfig speedrun_tiny() {
    Architecture a;
    a.norm = NormKind::RmsNorm;
    a.norm_gains = false;
    a.positions = PositionKind::Rotary;
    a.mlp = MlpKind::ReluSquared;
    a.biases = false;
    a.tied_head = false;
    a.qk_norm = true;
    a.embedding_norm = true;
    a.zero_init_projections = true;
    return ModelConfig(32, 70, 128, 2, 4, 32, a);
}

std::vector<std::uint8_t> file_bytes(const std::filesystem::path& path) {
    return read_file_bytes(path);
}

const std::filesystem::path kPrevious =
    std::filesystem::path(GPT2_TEST_DATA_DIR) / "previous_version";

TEST(ModelConfigTable, SmolLM2_135MHasHuggingFacesParameterCount) {
    const ModelConfig c = smollm2_135m();
    validate_config(c, "test");
    const ParameterLayout layout(c);
    // Hugging Face's count for HuggingFaceTB/SmolLM2-135M: 134,515,008 (embedding 28,311,552, each
    // layer 3,540,096, the final norm 576).
    EXPECT_EQ(layout.total(), 134515008u);
    using enum ParamTensor;
    for (const ParamTensor absent :
         {wpe, ln1b, qkvb, attprojb, ln2b, fcb, fcprojb, lnfb, lmheadw}) {
        EXPECT_FALSE(layout.has(absent)) << param_tensor_name(absent);
        EXPECT_EQ(layout.size(absent), 0u) << param_tensor_name(absent);
    }
    EXPECT_EQ(layout.size(qkvw), 30u * (576 + 2 * 192) * 576);  // Q, then K and V of 3 heads
    EXPECT_EQ(layout.size(fcw), 30u * 2 * 1536 * 576);          // SwiGLU's gate, then up
    EXPECT_EQ(layout.size(fcprojw), 30u * 576 * 1536);
    EXPECT_EQ(layout.size(ln1w), 30u * 576);
    // Muon: Q, K, V apart (576, 192, 192 rows), the gate and up apart, the two projections; in
    // layout order (each tensor's layers stacked).
    const std::vector<MuonMatrix> matrices = muon_matrices(layout);
    ASSERT_EQ(matrices.size(), 30u * 7);
    const std::vector<std::pair<int, int>> first = {{576, 576}, {192, 576}, {192, 576}};
    for (std::size_t i = 0; i < 3; ++i) {
        EXPECT_EQ(matrices[i].rows, first[i].first) << i;
        EXPECT_EQ(matrices[i].cols, first[i].second) << i;
    }
    EXPECT_EQ(matrices[1].offset, matrices[0].offset + 576u * 576);
    EXPECT_EQ(matrices[3].offset, matrices[0].offset + (576u + 2 * 192) * 576);  // layer 1's Q
    std::size_t gates = 0, down = 0;
    for (const MuonMatrix& m : matrices) {
        gates += m.rows == 1536 && m.cols == 576 ? 1 : 0;
        down += m.rows == 576 && m.cols == 1536 ? 1 : 0;
    }
    EXPECT_EQ(gates, 60u);
    EXPECT_EQ(down, 30u);
    EXPECT_NE(describe(c).find("rmsnorm, rotary theta 100000, swiglu 1536, no biases, 3 kv heads"),
              std::string::npos)
        << describe(c);
}

TEST(ModelConfigTable, TheSpeedrunsHeadIsItsOwnAndItsProjectionsStartAtZero) {
    const ModelConfig c = speedrun_tiny();
    validate_config(c, "test");
    Model model(c);
    init_parameters(model, 3);
    const ParameterLayout& layout = model.layout;
    using enum ParamTensor;
    for (const ParamTensor absent : {wpe, ln1w, ln1b, ln2w, ln2b, lnfw, lnfb, qkvb, fcb}) {
        EXPECT_FALSE(layout.has(absent)) << param_tensor_name(absent);
    }
    ASSERT_TRUE(layout.has(lmheadw));
    EXPECT_EQ(layout.offset(lmheadw) + layout.size(lmheadw), layout.total());  // the last tensor
    const std::span<const float> p = model.params.span();
    // The record of 2024-11-03 starts its untied head at zero with the projections.
    for (const ParamTensor zero : {attprojw, fcprojw, lmheadw}) {
        const auto w = layout.tensor(p, zero);
        EXPECT_TRUE(std::all_of(w.begin(), w.end(), [](float v) { return v == 0.0f; }))
            << param_tensor_name(zero);
    }
    EXPECT_EQ(layout.size(fcw), 2u * 128 * 32);  // ReLU^2: 4C rows, one block
    EXPECT_TRUE(layout.decays(lmheadw));
    const auto embedding = layout.tensor(p, ParamTensor::wte);
    EXPECT_TRUE(std::any_of(embedding.begin(), embedding.end(), [](float v) { return v != 0.0f; }));
    // Its preset is this block at the record's 124M shape.
    const ModelConfig preset = preset_config("speedrun", 50257);
    Architecture expected = c.arch;
    expected.norm_eps = 1.1920929e-07f;
    EXPECT_EQ(preset.arch, expected);
    EXPECT_EQ(preset.head_size(), 128);
}

TEST(ModelConfigFields, ArchFlagSetsEachFieldAndRefusesWhatItDoesNotKnow) {
    const Architecture a = with_fields(
        Architecture{},
        "norm=rmsnorm,norm-gains=off,norm-eps=1e-6,positions=rotary,rope-theta=500,mlp=relu2,"
        "mlp-hidden=96,biases=off,head=untied,kv-heads=2,qk-norm=on,embedding-norm=on,zero-init=on",
        "--arch");
    Architecture expected;
    expected.norm = NormKind::RmsNorm;
    expected.norm_gains = false;
    expected.norm_eps = 1e-6f;
    expected.positions = PositionKind::Rotary;
    expected.rope_theta = 500.0f;
    expected.mlp = MlpKind::ReluSquared;
    expected.mlp_hidden = 96;
    expected.biases = false;
    expected.tied_head = false;
    expected.kv_heads = 2;
    expected.qk_norm = true;
    expected.embedding_norm = true;
    expected.zero_init_projections = true;
    EXPECT_EQ(a, expected);
    EXPECT_EQ(with_fields(a, "", "--arch"), a);  // nothing given: nothing changed
    EXPECT_EQ(with_fields(a, "qk-norm=off", "--arch").qk_norm, false);
    for (const std::string bad :
         {"qk-norm=yes", "mlp=tanh", "kv-heads=-1", "rope-theta=0.5", "depth=3", "qk-norm",
          "head=shared", "mlp-hidden=9x", "norm-eps=nan", "norm-eps=inf"}) {
        try {
            (void)with_fields(Architecture{}, bad, "--arch");
            ADD_FAILURE() << bad << " was taken";
        } catch (const UsageError& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("--arch: '" + bad + "'"), std::string::npos) << what;
        }
    }
}

TEST(ModelConfigRecord, RoundTripsEveryFieldAndRefusesWhatItCannotRead) {
    for (const ModelConfig& c :
         {ModelConfig(64, 65, 128, 2, 4, 32), smollm2_135m(), speedrun_tiny()}) {
        const ConfigRecord record = to_config_record(c);
        EXPECT_EQ(record[0], kConfigRecordVersion);
        EXPECT_EQ(from_config_record(record, "test"), c);
    }
    const ConfigRecord good = to_config_record(smollm2_135m());
    const auto refused = [&](std::size_t field, std::int32_t value, const std::string& says) {
        ConfigRecord bad = good;
        bad[field] = value;
        try {
            (void)from_config_record(bad, "some.bin");
            ADD_FAILURE() << "field " << field << " = " << value << " was read";
        } catch (const InputError& e) {
            const std::string what = e.what();
            EXPECT_NE(what.find("some.bin"), std::string::npos) << what;
            EXPECT_NE(what.find(says), std::string::npos) << what;
        }
    };
    refused(0, 3, "version 3");
    refused(19, 2, "normed embeddings 2");
    refused(7, 5, "norm 5");
    refused(12, -1, "MLP -1");
    refused(14, 2, "biases 2");
    refused(16, 2, "key/value heads must divide");  // 9 heads
    refused(5, 0, "positive");
}

TEST(ModelConfigRecord, AVersionOneRecordOfNineteenIntegersStillReads) {
    // What the build before the embeddings' norm wrote: 19 integers, version 1.
    const ModelConfig c = smollm2_135m();
    ConfigRecord record = to_config_record(c);
    record[0] = 1;
    std::vector<std::uint8_t> bytes(kConfigRecordV1Ints * sizeof(std::int32_t));
    std::memcpy(bytes.data(), record.data(), bytes.size());
    EXPECT_EQ(from_config_record(config_record_of_bytes(bytes, "old.bin"), "old.bin"), c);
    // A length and a version that disagree, or another length, are refused by name.
    const auto refused = [](std::span<const std::uint8_t> b, const std::string& says) {
        try {
            (void)config_record_of_bytes(b, "odd.bin");
            ADD_FAILURE() << b.size() << " bytes were read";
        } catch (const InputError& e) {
            EXPECT_NE(std::string(e.what()).find("odd.bin"), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
        }
    };
    std::vector<std::uint8_t> v2(sizeof(ConfigRecord));
    std::memcpy(v2.data(), record.data(), v2.size());  // 20 integers saying version 1
    refused(v2, "says version 1");
    refused(std::span(v2).first(72), "72 bytes");
}

TEST(ModelConfigFiles, ACheckpointOfAnotherArchitectureCarriesItsRecord) {
    const test::ScratchDir dir("gpt2-model-config");
    Model model(speedrun_tiny());
    init_parameters(model, 9);
    const CheckpointExtras extras{{1, 2, 3}, "{\"note\": 1}"};
    const auto path = save_checkpoint(dir.path() / "speedrun.bin", model, extras);
    EXPECT_EQ(
        std::filesystem::file_size(path),
        checkpoint_file_bytes(model.config, extras.tokenizer.size(), extras.config_json.size()));
    std::vector<std::uint8_t> bytes = file_bytes(path);
    std::int32_t version = 0;
    std::memcpy(&version, bytes.data() + 4, 4);
    EXPECT_EQ(version, kModelVersionWithRecord);  // llm.c refuses it
    const LoadedModel loaded = load_checkpoint(path);
    EXPECT_EQ(loaded.model.config, model.config);
    ASSERT_TRUE(loaded.extras.has_value());
    EXPECT_EQ(loaded.extras->tokenizer, extras.tokenizer);
    EXPECT_EQ(std::memcmp(loaded.model.params.data(), model.params.data(),
                          model.params.size() * sizeof(float)),
              0);
    // A damaged record is caught by the checksum, or first by its own checks; either way the
    // file is named.
    bytes[bytes.size() - 24 - 4 * 12] ^= 1;  // inside the record (19 ints before the footer)
    const auto damaged = dir.path() / "damaged.bin";
    {
        std::ofstream out(damaged, std::ios::binary);
        out.write(reinterpret_cast<const char*>(bytes.data()),
                  static_cast<std::streamsize>(bytes.size()));
    }
    try {
        (void)load_checkpoint(damaged);
        FAIL() << "a damaged record was read";
    } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("damaged.bin"), std::string::npos) << e.what();
    }
    // llm.c's own files hold GPT-2 only.
    EXPECT_THROW((void)save_llmc_model(dir.path() / "llmc.bin", model, kLlmcModelVersionFp32),
                 InputError);
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "llmc.bin"));
}

TEST(ModelConfigFiles, AResumeStateOfAnotherArchitectureIsForThatArchitectureOnly) {
    const test::ScratchDir dir("gpt2-model-config-state");
    const ModelConfig c = speedrun_tiny();
    const std::size_t P = ParameterLayout(c).total();
    OptimizerState saved(P);
    for (std::size_t i = 0; i < P; ++i) {
        saved.m[i] = static_cast<float>(i % 7);
        saved.v[i] = static_cast<float>(i % 5);
    }
    saved.step = 4;
    ResumeState state;
    state.step = 4;
    state.optimizer = OptimizerKind::AdamW;
    const auto path = dir.path() / "state.bin";
    save_resume_state(path, state, c, saved);
    EXPECT_EQ(std::filesystem::file_size(path),
              resume_state_file_bytes(P, false, OptimizerKind::AdamW, false));
    verify_resume_state(path);
    OptimizerState loaded(P);
    const ResumeState back = load_resume_state(path, c, loaded);
    EXPECT_EQ(back.step, 4);
    EXPECT_EQ(back.optimizer, OptimizerKind::AdamW);
    EXPECT_EQ(std::memcmp(loaded.v.data(), saved.v.data(), P * sizeof(float)), 0);
    // The same dimensions with another architecture (here: without QK-norm) are another model.
    ModelConfig other = c;
    other.arch.qk_norm = false;
    OptimizerState wrong(ParameterLayout(other).total());
    EXPECT_THROW((void)load_resume_state(path, other, wrong), InputError);
    // A GPT-2 model of the same six dimensions is refused too.
    const ModelConfig gpt2(c.max_seq_len, c.vocab_size, c.padded_vocab_size, c.num_layers,
                           c.num_heads, c.channels);
    OptimizerState gpt2_state(ParameterLayout(gpt2).total());
    EXPECT_THROW((void)load_resume_state(path, gpt2, gpt2_state), InputError);

    // The previous build's version 7 (a version-1 record of 19 integers) of a model without the
    // embeddings' norm: the same header less the record's last integer, its own magic and sum.
    ModelConfig before = c;
    before.arch.embedding_norm = false;
    save_resume_state(path, state, before, saved);
    std::vector<std::uint8_t> bytes = file_bytes(path);
    const std::size_t floats = 2 * P * sizeof(float);
    const std::size_t header = bytes.size() - floats - sizeof(std::uint64_t);
    bytes[7] = '7';
    const std::size_t record = header - sizeof(ConfigRecord);
    const std::int32_t version_one = 1;
    std::memcpy(bytes.data() + record, &version_one, sizeof(version_one));
    bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(header) - 4,
                bytes.begin() + static_cast<std::ptrdiff_t>(header));
    const std::span<const std::uint8_t> all(bytes);
    const std::size_t moments = P * sizeof(float), start = header - 4;
    const std::uint64_t sum =  // as save_resume_state sums: header, m, then v
        checksum64(all.subspan(start + moments, moments),
                   checksum64(all.subspan(start, moments), checksum64(all.first(start))));
    std::memcpy(bytes.data() + bytes.size() - sizeof(sum), &sum, sizeof(sum));
    const auto old_path = dir.path() / "state_v7.bin";
    write_file_atomically(old_path, std::span<const std::uint8_t>(bytes));
    OptimizerState old_loaded(P);
    EXPECT_EQ(load_resume_state(old_path, before, old_loaded).step, 4);
    EXPECT_EQ(std::memcmp(old_loaded.m.data(), saved.m.data(), P * sizeof(float)), 0);
    EXPECT_THROW((void)load_resume_state(old_path, c, old_loaded), InputError);  // another model
}

// The previous version's files: read, and written again byte for byte (a GPT-2 model's files are
// what they were: version 3 checkpoints, version 3 and 6 states).
TEST(PreviousVersion, ItsGpt2FilesReadAndAreWrittenAgainByteForByte) {
    const test::ScratchDir dir("gpt2-previous-version");
    for (const char* run : {"adamw", "muon"}) {
        const auto model_file = kPrevious / run / "model_000002.bin";
        const auto state_file = kPrevious / run / "state_000002.bin";
        const LoadedModel loaded = load_checkpoint(model_file);
        EXPECT_TRUE(loaded.model.config.is_gpt2());
        ASSERT_TRUE(loaded.extras.has_value());
        const auto again = save_checkpoint(dir.path() / "model.bin", loaded.model, loaded.extras);
        EXPECT_EQ(file_bytes(again), file_bytes(model_file)) << run;
        OptimizerState moments(loaded.model.layout.total());
        const ResumeState state = load_resume_state(state_file, loaded.model.config, moments);
        EXPECT_EQ(state.step, 2);
        save_resume_state(dir.path() / "state.bin", state, loaded.model.config, moments);
        EXPECT_EQ(file_bytes(dir.path() / "state.bin"), file_bytes(state_file)) << run;
    }
}

// train_gpt2 resumes the previous version's run and trains on from it.
TEST(PreviousVersion, TrainGpt2ResumesItsRuns) {
    for (const char* run : {"adamw", "muon"}) {
        const test::ScratchDir dir(std::string("gpt2-previous-resume-") + run);
        std::filesystem::copy(kPrevious / run, dir.path() / "out");
        const test::ProcessResult result = test::run_command(
            test::build_path("train_gpt2") + " --data " + (kPrevious / "corpus.txt").string() +
            " --n-layer 1 --n-head 2 --n-embd 32 --seq-len 32 --batch-size 4 --threads 2"
            " --max-steps 4 --checkpoint-every 2 --val-tokens 256 --sample-every 0 --out-dir " +
            (dir.path() / "out").string() + " --resume auto");
        ASSERT_EQ(result.exit_code, 0) << result.output;
        EXPECT_NE(result.output.find("step 2"), std::string::npos) << result.output;
        EXPECT_TRUE(std::filesystem::exists(dir.path() / "out" / "model_000004.bin")) << run;
        const LoadedModel trained = load_checkpoint(dir.path() / "out" / "model_000004.bin");
        const LoadedModel before = load_checkpoint(kPrevious / run / "model_000002.bin");
        EXPECT_NE(std::memcmp(trained.model.params.data(), before.model.params.data(),
                              before.model.params.size() * sizeof(float)),
                  0)
            << run << ": two more steps changed nothing";
    }
}

}  // namespace
}  // namespace gpt2
