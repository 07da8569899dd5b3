// Self-consistency of the PyTorch reference fixture (tests/data/gpt2_reference.bin) and its reader.
// Nothing here needs the C++ model: it checks the file against itself, so a broken fixture is
// caught before it is used to judge the model.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numbers>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "core/file_io.hpp"
#include "process_support.hpp"
#include "reference_fixture.hpp"

namespace gpt2::test {
namespace {

namespace fs = std::filesystem;

const fs::path kFixturePath = fs::path(GPT2_TEST_DATA_DIR) / "gpt2_reference.bin";

struct Config {
    std::int64_t maxT, V, Vp, L, NH, C, B, T;
};

// Offsets (in floats) of each parameter tensor inside the flat vector, llm.c order.
struct Layout {
    std::int64_t wte = 0, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb,
                 fcprojw, fcprojb, lnfw, lnfb, total;
    explicit Layout(const Config& c) {
        std::int64_t off = 0;
        const auto next = [&off](std::int64_t size) { return std::exchange(off, off + size); };
        wte = next(c.Vp * c.C);
        wpe = next(c.maxT * c.C);
        ln1w = next(c.L * c.C);
        ln1b = next(c.L * c.C);
        qkvw = next(c.L * 3 * c.C * c.C);
        qkvb = next(c.L * 3 * c.C);
        attprojw = next(c.L * c.C * c.C);
        attprojb = next(c.L * c.C);
        ln2w = next(c.L * c.C);
        ln2b = next(c.L * c.C);
        fcw = next(c.L * 4 * c.C * c.C);
        fcb = next(c.L * 4 * c.C);
        fcprojw = next(c.L * c.C * 4 * c.C);
        fcprojb = next(c.L * c.C);
        lnfw = next(c.C);
        lnfb = next(c.C);
        total = off;
    }
};

class ReferenceFixtureTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        fixture_ = new ReferenceFixture(ReferenceFixture::load(kFixturePath));
    }
    static void TearDownTestSuite() {
        delete fixture_;
        fixture_ = nullptr;
    }

    [[nodiscard]] static const ReferenceFixture& fx() { return *fixture_; }
    [[nodiscard]] static Config config() {
        const auto& v = fx().at("config").i32;
        return {v.at(0), v.at(1), v.at(2), v.at(3), v.at(4), v.at(5), v.at(6), v.at(7)};
    }

  private:
    static inline const ReferenceFixture* fixture_ = nullptr;
};

TEST_F(ReferenceFixtureTest, RecordShapesMatchConfig) {
    const Config c = config();
    EXPECT_EQ(c.maxT, 16);
    EXPECT_EQ(c.V, 101);
    EXPECT_EQ(c.Vp, 128);
    EXPECT_EQ(c.C % c.NH, 0);
    EXPECT_LE(c.T, c.maxT);
    const std::int64_t P = Layout(c).total;
    using Dims = std::vector<std::int64_t>;
    const std::vector<std::pair<std::string, Dims>> expected = {
        {"config", {8}},
        {"params", {P}},
        {"inputs", {c.B, c.T}},
        {"targets", {c.B, c.T}},
        {"logits", {c.B, c.T, c.V}},
        {"loss", {}},
        {"grads", {P}},
        {"act.encoded", {c.B, c.T, c.C}},
        {"act.ln1", {c.L, c.B, c.T, c.C}},
        {"act.qkv", {c.L, c.B, c.T, 3 * c.C}},
        {"act.atty", {c.L, c.B, c.T, c.C}},
        {"act.attproj", {c.L, c.B, c.T, c.C}},
        {"act.residual2", {c.L, c.B, c.T, c.C}},
        {"act.ln2", {c.L, c.B, c.T, c.C}},
        {"act.fch", {c.L, c.B, c.T, 4 * c.C}},
        {"act.fch_gelu", {c.L, c.B, c.T, 4 * c.C}},
        {"act.fcproj", {c.L, c.B, c.T, c.C}},
        {"act.residual3", {c.L, c.B, c.T, c.C}},
        {"act.lnf", {c.B, c.T, c.C}},
        {"adamw.hparams", {6}},
        {"adamw.losses", {5}},
        {"adamw.grad_norms", {5}},
        {"adamw.params_after", {P}},
    };
    for (const auto& [name, dims] : expected) {
        ASSERT_TRUE(fx().has(name)) << name;
        const FixtureTensor& t = fx().at(name);
        EXPECT_EQ(t.dims, dims) << name;
        const bool is_int = name == "config" || name == "inputs" || name == "targets";
        EXPECT_EQ(static_cast<std::int64_t>(is_int ? t.i32.size() : t.f32.size()), t.numel())
            << name;
    }
    for (const auto& name : {"inputs", "targets"}) {
        for (const auto tok : fx().at(name).i32) {
            ASSERT_TRUE(tok >= 0 && tok < c.V) << name;
        }
    }
    EXPECT_FALSE(fx().has("no.such.record"));
    EXPECT_THROW((void)fx().at("no.such.record"), std::runtime_error);
}

TEST_F(ReferenceFixtureTest, PaddedVocabularyRowsAreZero) {
    const Config c = config();
    for (const auto& name : {"params", "grads", "adamw.params_after"}) {
        const auto& v = fx().at(name).f32;
        for (std::int64_t i = c.V * c.C; i < c.Vp * c.C; ++i) {
            ASSERT_EQ(v[static_cast<std::size_t>(i)], 0.0f) << name << " index " << i;
        }
    }
}

TEST_F(ReferenceFixtureTest, EncodedIsTokenPlusPositionEmbedding) {
    const Config c = config();
    const Layout lay(c);
    const auto& params = fx().at("params").f32;
    const auto& inputs = fx().at("inputs").i32;
    const auto& encoded = fx().at("act.encoded").f32;
    for (std::int64_t b = 0; b < c.B; ++b) {
        for (std::int64_t t = 0; t < c.T; ++t) {
            const std::int64_t tok = inputs[static_cast<std::size_t>(b * c.T + t)];
            for (std::int64_t i = 0; i < c.C; ++i) {
                const float expect = params[static_cast<std::size_t>(lay.wte + tok * c.C + i)] +
                                     params[static_cast<std::size_t>(lay.wpe + t * c.C + i)];
                ASSERT_FLOAT_EQ(encoded[static_cast<std::size_t>((b * c.T + t) * c.C + i)], expect);
            }
        }
    }
}

TEST_F(ReferenceFixtureTest, LossIsMeanCrossEntropyOfLogits) {
    const Config c = config();
    const auto& logits = fx().at("logits").f32;
    const auto& targets = fx().at("targets").i32;
    double total = 0.0;
    for (std::int64_t n = 0; n < c.B * c.T; ++n) {
        const float* row = logits.data() + n * c.V;
        double maxv = row[0];
        for (std::int64_t j = 1; j < c.V; ++j)
            maxv = std::max(maxv, double{row[j]});
        double sum = 0.0;
        for (std::int64_t j = 0; j < c.V; ++j)
            sum += std::exp(double{row[j]} - maxv);
        total += std::log(sum) + maxv - row[targets[static_cast<std::size_t>(n)]];
    }
    const double loss = total / static_cast<double>(c.B * c.T);
    EXPECT_NEAR(loss, fx().at("loss").f32.at(0), 1e-5);
    // The first AdamW loss is computed at the recorded params, so it is the same number.
    EXPECT_EQ(fx().at("adamw.losses").f32.at(0), fx().at("loss").f32.at(0));
}

TEST_F(ReferenceFixtureTest, FirstGradNormMatchesGradsAndClips) {
    double sq = 0.0;
    for (const float g : fx().at("grads").f32)
        sq += double{g} * g;
    const float norm0 = fx().at("adamw.grad_norms").f32.at(0);
    EXPECT_NEAR(std::sqrt(sq), norm0, 1e-5 * norm0);
    const auto& hp = fx().at("adamw.hparams").f32;  // lr, beta1, beta2, eps, wd, max_grad_norm
    EXPECT_GT(norm0, hp.at(5)) << "step 1 must exercise gradient clipping";
}

TEST_F(ReferenceFixtureTest, ResidualStreamAddsUp) {
    const Config c = config();
    const auto& enc = fx().at("act.encoded").f32;
    const auto& attproj = fx().at("act.attproj").f32;
    const auto& res2 = fx().at("act.residual2").f32;
    const auto& fcproj = fx().at("act.fcproj").f32;
    const auto& res3 = fx().at("act.residual3").f32;
    const auto& fch = fx().at("act.fch").f32;
    const auto& gelu = fx().at("act.fch_gelu").f32;
    const std::size_t n = static_cast<std::size_t>(c.B * c.T * c.C);
    for (std::size_t l = 0; l < static_cast<std::size_t>(c.L); ++l) {
        for (std::size_t i = 0; i < n; ++i) {
            const float in = l == 0 ? enc[i] : res3[(l - 1) * n + i];
            ASSERT_FLOAT_EQ(res2[l * n + i], in + attproj[l * n + i]);
            ASSERT_FLOAT_EQ(res3[l * n + i], res2[l * n + i] + fcproj[l * n + i]);
        }
    }
    // GELU, tanh approximation.
    for (std::size_t i = 0; i < fch.size(); ++i) {
        const double x = fch[i];
        const double y =
            0.5 * x *
            (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
        ASSERT_NEAR(gelu[i], y, 1e-6);
    }
}

// Expects load() to throw a runtime_error whose message names the file and contains `what`.
void expect_rejected(const fs::path& path, const std::string& what) {
    try {
        (void)ReferenceFixture::load(path);
        ADD_FAILURE() << "load() accepted " << path;
    } catch (const std::runtime_error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(path.string()), std::string::npos) << msg;
        EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
}

TEST(ReferenceFixtureLoader, RejectsCorruptFiles) {
    const test::ScratchDir dir("gpt2-fixture-test");
    const std::string bytes = read_text_file(kFixturePath);
    ASSERT_GT(bytes.size(), 1000u);

    const fs::path truncated = dir.path() / "truncated.bin";
    write_bytes(truncated, bytes.substr(0, bytes.size() - 100));
    expect_rejected(truncated, "truncated");

    const fs::path header_only = dir.path() / "header_only.bin";
    write_bytes(header_only, bytes.substr(0, 10));
    expect_rejected(header_only, "truncated");

    std::string bad = bytes;
    bad[0] = 'X';
    const fs::path bad_magic = dir.path() / "bad_magic.bin";
    write_bytes(bad_magic, bad);
    expect_rejected(bad_magic, "bad magic");

    expect_rejected(dir.path() / "missing.bin", "cannot open");
}

}  // namespace
}  // namespace gpt2::test
