#include "ops/bf16.hpp"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "ops/gemm.hpp"

namespace gpt2 {

void convert_to_bf16(Bf16* out, const float* in, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i)
        out[i] = to_bf16(in[i]);
}

void convert_to_bf16_transposed(Bf16* out, const float* in, int rows, int cols) {
    // Tiles small enough that a tile's source rows and destination rows stay in L1 together.
    constexpr int kTile = 32;
    for (int r0 = 0; r0 < rows; r0 += kTile) {
        const int r1 = std::min(rows, r0 + kTile);
        for (int c0 = 0; c0 < cols; c0 += kTile) {
            const int c1 = std::min(cols, c0 + kTile);
            for (int c = c0; c < c1; ++c) {
                Bf16* dst = out + static_cast<std::size_t>(c) * static_cast<std::size_t>(rows);
                for (int r = r0; r < r1; ++r)
                    dst[r] =
                        to_bf16(in[static_cast<std::size_t>(r) * static_cast<std::size_t>(cols) +
                                   static_cast<std::size_t>(c)]);
            }
        }
    }
}

void convert_to_float(float* out, const Bf16* in, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i)
        out[i] = to_float(in[i]);
}

Bf16Backend bf16_backend() {
    static const Bf16Backend backend = [] {
        const char* forced = std::getenv("GPT2_BF16_GEMM");
        if (forced != nullptr && std::strcmp(forced, "emulate") == 0) {
            return Bf16Backend::Fp32Emulated;
        }
        switch (dnnl::get_effective_cpu_isa()) {
            case dnnl::cpu_isa::avx512_core_amx:
                return Bf16Backend::Amx;
            case dnnl::cpu_isa::avx512_core_bf16:
                return Bf16Backend::Avx512Bf16;
            case dnnl::cpu_isa::avx512_core:
            case dnnl::cpu_isa::avx512_core_vnni:
                return Bf16Backend::Avx512Emulated;
            default:
                return Bf16Backend::Fp32Emulated;
        }
    }();
    return backend;
}

bool int8_products_native() {
    static const bool native = [] {
        if (bf16_backend() == Bf16Backend::Fp32Emulated) return false;  // forced, or no AVX-512
        switch (dnnl::get_effective_cpu_isa()) {
            case dnnl::cpu_isa::avx512_core_vnni:
            case dnnl::cpu_isa::avx512_core_bf16:
            case dnnl::cpu_isa::avx512_core_amx:
                return true;
            default:
                return false;
        }
    }();
    return native;
}

const char* bf16_backend_name(Bf16Backend backend) {
    switch (backend) {
        case Bf16Backend::Amx:
            return "AMX-BF16 (oneDNN)";
        case Bf16Backend::Avx512Bf16:
            return "AVX512_BF16 (oneDNN)";
        case Bf16Backend::Avx512Emulated:
            return "AVX-512 without bf16 instructions (oneDNN's emulation, slower than fp32)";
        case Bf16Backend::Fp32Emulated:
            break;
    }
    return "emulation: fp32 GEMM on bf16-rounded operands (no bf16 instructions; slower than fp32)";
}

namespace {
enum class Layout { Nt, Nn, Tn };

// The operands' type: bf16 into fp32, or int8 into int32 (prompt products with int8 weights).
enum class Operands { Bf16, Int8 };

// What a product does besides C = A op B (beta 0, fp32 results): one at most of accumulating
// into C, adding a bias row, scaling by alpha; and results rounded to bf16 instead of fp32.
struct ProductExtras {
    bool accumulate = false;
    bool bias = false;
    float alpha = 1.0f;
    bool rounded = false;
    friend bool operator==(const ProductExtras&, const ProductExtras&) = default;
};

// Everything that makes two products need different primitives.
struct ProductShape {
    Layout layout;
    int M, N, K, lda, ldb, ldc;
    ProductExtras extras;
    Operands operands = Operands::Bf16;
    friend bool operator==(const ProductShape&, const ProductShape&) = default;
};
struct ProductShapeHash {
    std::size_t operator()(const ProductShape& s) const {
        const ProductExtras& x = s.extras;
        std::size_t h =
            static_cast<std::size_t>(s.layout) * 2 + static_cast<std::size_t>(s.operands);
        for (const bool flag : {x.accumulate, x.bias, x.rounded})
            h = h * 2 + (flag ? 1 : 0);
        h = h * 1000003u ^ std::bit_cast<std::uint32_t>(x.alpha);
        for (const int v : {s.M, s.N, s.K, s.lda, s.ldb, s.ldc})
            h = h * 1000003u ^ static_cast<std::size_t>(v);
        return h;
    }
};

struct Product {
    dnnl::matmul primitive;
    dnnl::memory a, b, c, bias;
    // The execute() arguments, built once: a call only swaps the three data pointers, so the
    // training step allocates nothing here.
    std::unordered_map<int, dnnl::memory> args;
};

// One per thread: oneDNN objects are created once per shape and thread, then only executed, so
// workers share nothing and take no lock. oneDNN's OpenMP runtime runs each call on this thread.
class ThreadProducts {
  public:
    ThreadProducts() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
        omp_set_num_threads(1);
    }

    // Null when oneDNN cannot run this product here (then the caller emulates).
    const Product* find_or_create(const ProductShape& s) {
        const auto found = products_.find(s);
        if (found != products_.end()) return found->second ? &*found->second : nullptr;
        auto& slot = products_[s];
        // oneDNN's creation is thread-safe on its own; the process-wide lock only orders the
        // (rare) creations for ThreadSanitizer, which cannot see oneDNN's internal locking being
        // set up inside the uninstrumented library and reports its primitive cache otherwise.
        static std::mutex creation;
        const std::lock_guard lock(creation);
        try {
            slot = create(s);
        } catch (const dnnl::error&) {
            slot.reset();
        }
        return slot ? &*slot : nullptr;
    }

    void run(const Product& p, const void* a, const void* b, void* c, const float* bias = nullptr) {
        p.a.set_data_handle(const_cast<void*>(a));
        p.b.set_data_handle(const_cast<void*>(b));
        p.c.set_data_handle(c);
        if (bias != nullptr) p.bias.set_data_handle(const_cast<float*>(bias));
        p.primitive.execute(stream_, p.args);
        stream_.wait();
    }

    std::vector<float>& scratch_a() { return scratch_a_; }
    std::vector<float>& scratch_b() { return scratch_b_; }
    std::vector<float>& scratch_c() { return scratch_c_; }

  private:
    std::unique_ptr<Product> create(const ProductShape& s) {
        using dims = dnnl::memory::dims;
        using dt = dnnl::memory::data_type;
        const dims a_strides = s.layout == Layout::Tn ? dims{1, s.lda} : dims{s.lda, 1};
        const dims b_strides = s.layout == Layout::Nt ? dims{1, s.ldb} : dims{s.ldb, 1};
        const bool int8 = s.operands == Operands::Int8;
        const dt operand = int8 ? dt::s8 : dt::bf16;
        const dnnl::memory::desc a_md({s.M, s.K}, operand, a_strides);
        const dnnl::memory::desc b_md({s.K, s.N}, operand, b_strides);
        const dt result = int8 ? dt::s32 : s.extras.rounded ? dt::bf16 : dt::f32;
        const dnnl::memory::desc c_md({s.M, s.N}, result, dims{s.ldc, 1});
        dnnl::primitive_attr attr;
        if (s.extras.accumulate) {
            dnnl::post_ops ops;
            ops.append_sum(1.0f);
            attr.set_post_ops(ops);
        }
        if (s.extras.alpha != 1.0f) attr.set_output_scales(0, {s.extras.alpha});
        const dnnl::memory::desc bias_md({1, s.N}, dt::f32, dims{s.N, 1});
        const auto desc = s.extras.bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md)
                                        : dnnl::matmul::desc(a_md, b_md, c_md);
        const dnnl::matmul::primitive_desc pd(desc, attr, engine_);
        auto product = std::make_unique<Product>();
        product->primitive = dnnl::matmul(pd);
        product->a = dnnl::memory(a_md, engine_, DNNL_MEMORY_NONE);
        product->b = dnnl::memory(b_md, engine_, DNNL_MEMORY_NONE);
        product->c = dnnl::memory(c_md, engine_, DNNL_MEMORY_NONE);
        product->args = {
            {DNNL_ARG_SRC, product->a}, {DNNL_ARG_WEIGHTS, product->b}, {DNNL_ARG_DST, product->c}};
        if (s.extras.bias) {
            product->bias = dnnl::memory(bias_md, engine_, DNNL_MEMORY_NONE);
            product->args.emplace(DNNL_ARG_BIAS, product->bias);
        }
        return product;
    }

    dnnl::engine engine_;
    dnnl::stream stream_;
    std::unordered_map<ProductShape, std::unique_ptr<Product>, ProductShapeHash> products_;
    std::vector<float> scratch_a_, scratch_b_, scratch_c_;
};

ThreadProducts& thread_products() {
    thread_local ThreadProducts products;
    return products;
}

// rows x cols bf16 matrix with leading dimension ld, widened into `out` (same ld).
const float* widen(std::vector<float>& out, const Bf16* in, int rows, int cols, int ld) {
    out.resize(static_cast<std::size_t>(rows - 1) * static_cast<std::size_t>(ld) +
               static_cast<std::size_t>(cols));
    for (int r = 0; r < rows; ++r) {
        convert_to_float(out.data() + static_cast<std::size_t>(r) * ld,
                         in + static_cast<std::size_t>(r) * ld, static_cast<std::size_t>(cols));
    }
    return out.data();
}

// C = A op B with `extras`; C is bf16 when extras.rounded, else fp32; bias (extras.bias) has N
// values.
void product(Layout layout, int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb,
             const ProductExtras& extras, void* C, int ldc, const float* bias = nullptr) {
    if (M <= 0 || N <= 0) return;
    ThreadProducts& products = thread_products();
    if (K > 0 && bf16_backend() != Bf16Backend::Fp32Emulated) {
        const ProductShape shape{layout, M, N, K, lda, ldb, ldc, extras};
        if (const Product* p = products.find_or_create(shape)) {
            products.run(*p, A, B, C, bias);
            return;
        }
    }
    // Emulation: the operands' stored rows widened to fp32, then the fp32 GEMM (into fp32
    // scratch first when the results are rounded); a bias is written first and accumulated onto,
    // as the fp32 path adds it.
    const int a_rows = layout == Layout::Tn ? K : M, a_cols = layout == Layout::Tn ? M : K;
    const int b_rows = layout == Layout::Nt ? N : K, b_cols = layout == Layout::Nt ? K : N;
    const float* a = widen(products.scratch_a(), A, a_rows, a_cols, lda);
    const float* b = widen(products.scratch_b(), B, b_rows, b_cols, ldb);
    float* c = static_cast<float*>(C);
    int ldf = ldc;
    if (extras.rounded) {
        products.scratch_c().resize(static_cast<std::size_t>(M) * static_cast<std::size_t>(N));
        c = products.scratch_c().data();
        ldf = N;
    }
    if (bias != nullptr) {
        for (int i = 0; i < M; ++i)
            std::copy(bias, bias + N, c + static_cast<long>(i) * ldf);
    }
    const float beta = extras.accumulate || bias != nullptr ? 1.0f : 0.0f;
    switch (layout) {
        case Layout::Nt:
            gemm_nt(M, N, K, extras.alpha, a, lda, b, ldb, beta, c, ldf);
            break;
        case Layout::Nn:
            gemm_nn(M, N, K, extras.alpha, a, lda, b, ldb, beta, c, ldf);
            break;
        case Layout::Tn:
            gemm_tn(M, N, K, extras.alpha, a, lda, b, ldb, beta, c, ldf);
            break;
    }
    if (extras.rounded) {
        for (int i = 0; i < M; ++i) {
            convert_to_bf16(static_cast<Bf16*>(C) + static_cast<long>(i) * ldc,
                            c + static_cast<long>(i) * ldf, static_cast<std::size_t>(N));
        }
    }
}

ProductExtras beta_extras(float beta) {
    ProductExtras extras;
    extras.accumulate = beta != 0.0f;
    return extras;
}
}  // namespace

void gemm_bf16_nt(int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb, float beta,
                  float* C, int ldc) {
    product(Layout::Nt, M, N, K, A, lda, B, ldb, beta_extras(beta), C, ldc);
}

void gemm_bf16_nn(int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb, float beta,
                  float* C, int ldc) {
    product(Layout::Nn, M, N, K, A, lda, B, ldb, beta_extras(beta), C, ldc);
}

void gemm_bf16_tn(int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb, float beta,
                  float* C, int ldc) {
    product(Layout::Tn, M, N, K, A, lda, B, ldb, beta_extras(beta), C, ldc);
}

void gemm_bf16_nt_bias(int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb,
                       const float* bias, float* C, int ldc) {
    ProductExtras extras;
    extras.bias = bias != nullptr;
    product(Layout::Nt, M, N, K, A, lda, B, ldb, extras, C, ldc, bias);
}

void gemm_bf16_nt_bias_rounded(int M, int N, int K, const Bf16* A, int lda, const Bf16* B, int ldb,
                               const float* bias, Bf16* C, int ldc) {
    ProductExtras extras;
    extras.bias = bias != nullptr;
    extras.rounded = true;
    product(Layout::Nt, M, N, K, A, lda, B, ldb, extras, C, ldc, bias);
}

void gemm_bf16_nt_scaled(int M, int N, int K, float alpha, const Bf16* A, int lda, const Bf16* B,
                         int ldb, float* C, int ldc) {
    ProductExtras extras;
    extras.alpha = alpha;
    product(Layout::Nt, M, N, K, A, lda, B, ldb, extras, C, ldc);
}

void gemm_s8_nt(int M, int N, int K, const std::int8_t* A, int lda, const std::int8_t* B, int ldb,
                std::int32_t* C, int ldc) {
    if (M <= 0 || N <= 0) return;
    if (K > 0 && bf16_backend() != Bf16Backend::Fp32Emulated) {
        ThreadProducts& products = thread_products();
        const ProductShape shape{Layout::Nt, M, N, K, lda, ldb, ldc, {}, Operands::Int8};
        if (const Product* p = products.find_or_create(shape)) {
            products.run(*p, A, B, C);
            return;
        }
    }
    // No oneDNN int8 kernel here (AVX2 has none for signed operands on both sides): the same
    // integers by a plain loop, exact whatever the order.
    for (int i = 0; i < M; ++i) {
        const std::int8_t* a = A + static_cast<long>(i) * lda;
        for (int j = 0; j < N; ++j) {
            const std::int8_t* b = B + static_cast<long>(j) * ldb;
            std::int32_t sum = 0;
            for (int k = 0; k < K; ++k)
                sum += static_cast<std::int32_t>(a[k]) * b[k];
            C[static_cast<long>(i) * ldc + j] = sum;
        }
    }
}

}  // namespace gpt2
