// bf16 conversion and the bf16 matrix products against an fp32 reference on the same rounded
// operands (a product of two bf16 numbers is exact in fp32, so only the summation order differs).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ops/bf16.hpp"

namespace gpt2 {
namespace {

TEST(Bf16, RoundsToNearestEven) {
    EXPECT_EQ(to_float(to_bf16(1.0f)), 1.0f);
    EXPECT_EQ(to_float(to_bf16(-2.5f)), -2.5f);
    // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1).
    EXPECT_EQ(to_float(to_bf16(1.0f + 0x1p-8f)), 1.0f);
    // 1 + 3*2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: ties go to 1 + 2^-6.
    EXPECT_EQ(to_float(to_bf16(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
    // Just above the halfway point rounds up.
    EXPECT_EQ(to_float(to_bf16(1.0f + 0x1p-8f + 0x1p-20f)), 1.0f + 0x1p-7f);
    EXPECT_TRUE(std::isnan(to_float(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    EXPECT_EQ(to_float(to_bf16(std::numeric_limits<float>::infinity())),
              std::numeric_limits<float>::infinity());
    // The largest finite float rounds to infinity in bf16, as in PyTorch.
    EXPECT_TRUE(std::isinf(to_float(to_bf16(std::numeric_limits<float>::max()))));
}

TEST(Bf16, ConvertsArraysBothWays) {
    std::vector<float> values{0.1f, -3.14159f, 1e-20f, 65504.0f, 0.0f, -0.0f, 7.0f};
    std::vector<Bf16> packed(values.size());
    std::vector<float> back(values.size());
    convert_to_bf16(packed.data(), values.data(), values.size());
    convert_to_float(back.data(), packed.data(), values.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
        EXPECT_EQ(back[i], to_float(to_bf16(values[i])));
        EXPECT_NEAR(back[i], values[i], std::abs(values[i]) * 0x1p-8f) << i;
    }
    EXPECT_TRUE(std::signbit(back[5]));
}

struct Matrix {
    int rows, cols, ld;
    std::vector<Bf16> data;
    [[nodiscard]] float at(int r, int c) const {
        return to_float(data[static_cast<std::size_t>(r) * ld + c]);
    }
};

Matrix random_matrix(int rows, int cols, int ld, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Matrix m{rows, cols, ld, std::vector<Bf16>(static_cast<std::size_t>(rows) * ld)};
    for (auto& v : m.data)
        v = to_bf16(normal(rng));
    return m;
}

enum class Kind { nt, nn, tn };

// One product of each layout against a double-precision loop over the same bf16 values.
void check_product(Kind kind, int M, int N, int K, bool accumulate) {
    std::mt19937 rng(static_cast<unsigned>(M * 131 + N * 7 + K + static_cast<int>(kind)));
    const int pad = 3;  // leading dimensions larger than the rows, as sub-matrices have
    const Matrix A =
        kind == Kind::tn ? random_matrix(K, M, M + pad, rng) : random_matrix(M, K, K + pad, rng);
    const Matrix B =
        kind == Kind::nt ? random_matrix(N, K, K + pad, rng) : random_matrix(K, N, N + pad, rng);
    const int ldc = N + pad;
    std::vector<float> C(static_cast<std::size_t>(M) * ldc, 0.5f);
    const std::vector<float> C0 = C;
    const float beta = accumulate ? 1.0f : 0.0f;
    switch (kind) {
        case Kind::nt:
            gemm_bf16_nt(M, N, K, A.data.data(), A.ld, B.data.data(), B.ld, beta, C.data(), ldc);
            break;
        case Kind::nn:
            gemm_bf16_nn(M, N, K, A.data.data(), A.ld, B.data.data(), B.ld, beta, C.data(), ldc);
            break;
        case Kind::tn:
            gemm_bf16_tn(M, N, K, A.data.data(), A.ld, B.data.data(), B.ld, beta, C.data(), ldc);
            break;
    }
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < ldc; ++j) {
            const std::size_t at = static_cast<std::size_t>(i) * ldc + j;
            if (j >= N) {  // outside the product: untouched
                ASSERT_EQ(C[at], C0[at]);
                continue;
            }
            double expected = accumulate ? C0[at] : 0.0;
            double magnitude = 0.0;
            for (int k = 0; k < K; ++k) {
                const double a = kind == Kind::tn ? A.at(k, i) : A.at(i, k);
                const double b = kind == Kind::nt ? B.at(j, k) : B.at(k, j);
                expected += a * b;
                magnitude += std::abs(a * b);
            }
            ASSERT_NEAR(C[at], expected, 1e-5 * (magnitude + 1.0))
                << "i=" << i << " j=" << j << " backend " << bf16_backend_name(bf16_backend());
        }
    }
}

TEST(Bf16Gemm, MatchesAReferenceOnTheSameRoundedOperands) {
    for (const Kind kind : {Kind::nt, Kind::nn, Kind::tn}) {
        for (const bool accumulate : {false, true}) {
            SCOPED_TRACE(::testing::Message()
                         << "layout " << static_cast<int>(kind) << " accumulate " << accumulate);
            check_product(kind, 37, 45, 64, accumulate);
            check_product(kind, 1, 130, 17, accumulate);
            check_product(kind, 64, 3, 200, accumulate);
        }
    }
}

TEST(Bf16Gemm, NamesWhatItRunsOn) {
    const std::string name = bf16_backend_name(bf16_backend());
    EXPECT_FALSE(name.empty());
    const char* forced = std::getenv("GPT2_BF16_GEMM");
    if (forced != nullptr && std::string(forced) == "emulate") {
        EXPECT_EQ(bf16_backend(), Bf16Backend::Fp32Emulated);
        EXPECT_NE(name.find("emulation"), std::string::npos);
    }
}

}  // namespace
}  // namespace gpt2
