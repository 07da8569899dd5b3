// bench_sgemm: single-threaded sgemm backends on the GEMM shapes of GPT-2 training.
//
// Row-major float32. Each shape is timed (a) on one thread alone and (b) on 2 threads at once,
// each thread calling sgemm on its own buffers (the way our worker pool uses it). Results are
// checked against a float64 reference on sampled entries, in the solo and the concurrent runs, and
// a stress phase hammers small concurrent calls to catch thread-safety problems.
//
// One source, one backend per binary (-DBACKEND_OPENBLAS / -DBACKEND_BLIS / -DBACKEND_DNNL).
// scripts/bench_sgemm.sh builds and runs all available backends; by hand, from the repo root:
//
// clang-format off
//   g++ -std=c++20 -O2 -Wall -Wextra -pthread -DBACKEND_OPENBLAS -isystem /usr/include/x86_64-linux-gnu/openblas-serial scripts/bench_sgemm.cpp -o /tmp/bench_openblas -L/usr/lib/x86_64-linux-gnu/openblas-serial -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-serial -lopenblas
//   g++ -std=c++20 -O2 -Wall -Wextra -pthread -DBACKEND_BLIS -isystem /usr/include/x86_64-linux-gnu/blis-openmp scripts/bench_sgemm.cpp -o /tmp/bench_blis /usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4 -Wl,-rpath,/usr/lib/x86_64-linux-gnu/blis-serial -lm
//   g++ -std=c++20 -O2 -Wall -Wextra -pthread -DBACKEND_DNNL scripts/bench_sgemm.cpp -o /tmp/bench_dnnl -ldnnl -lgomp
//   (OpenBLAS pthread build, run with OPENBLAS_NUM_THREADS=1: same line with openblas-pthread)
// clang-format on
//
// (libblis-dev only ships the blis-openmp headers; the ABI is the same, and linking the serial
// libblis.so.4 by path with an rpath makes the binary use the serial library.)
//
// Usage:
//   bench_sgemm [--min-time S] [--filter SUB[,SUB...]] [--dump FILE] [--stress-calls N]
//               [--omp-threads N] [--no-pair]      benchmark; CSV on stdout, '#' lines are notes
//   bench_sgemm --info                             backend, kernel selection, threading checks
//   bench_sgemm --blis-arch-index NAME             index of a BLIS config for BLIS_ARCH_TYPE
//   bench_sgemm --compare REF.dump OTHER.dump [--rtol R]   compare sampled results
//   bench_sgemm --summarize [--metric wall|cpu] RUN.csv...   median tables over several runs
//
// Useful environment variables: OPENBLAS_CORETYPE (e.g. SkylakeX), BLIS_ARCH_TYPE (index),
// OMP_NUM_THREADS (oneDNN).

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#if defined(BACKEND_OPENBLAS)
#include <cblas.h>
#elif defined(BACKEND_BLIS)
#include <blis.h>
#elif defined(BACKEND_DNNL)
#include <dnnl.h>
#include <omp.h>
#else
#error "compile with one of -DBACKEND_OPENBLAS, -DBACKEND_BLIS, -DBACKEND_DNNL"
#endif

namespace {

[[noreturn]] void die(const std::string& msg) {
    std::fprintf(stderr, "bench_sgemm: %s\n", msg.c_str());
    std::fflush(stdout);
    std::_Exit(2);
}

// ---------------------------------------------------------------------------------------------
// Backend

// One row-major sgemm: C(m,n) = op(A)(m,k) * op(B)(k,n) + beta * C, alpha = 1.
struct Gemm {
    bool ta = false;
    bool tb = false;
    int64_t m = 0, n = 0, k = 0;
    int64_t lda = 0, ldb = 0, ldc = 0;
    float beta = 0.0f;
};

int g_omp_threads = 1;  // oneDNN: OpenMP threads per calling thread (0 = leave the default)

void sgemm(const Gemm& g, const float* a, const float* b, float* c) {
#if defined(BACKEND_OPENBLAS)
    cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(g.m), static_cast<blasint>(g.n), static_cast<blasint>(g.k),
                1.0f, a, static_cast<blasint>(g.lda), b, static_cast<blasint>(g.ldb), g.beta, c,
                static_cast<blasint>(g.ldc));
#elif defined(BACKEND_BLIS)
    // Typed BLIS API with general strides: row-major means row stride = ld, column stride = 1.
    // BLIS does not write A or B; its prototypes are just not const-qualified.
    float alpha = 1.0f;
    float beta = g.beta;
    bli_sgemm(g.ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, g.tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE,
              g.m, g.n, g.k, &alpha, const_cast<float*>(a), g.lda, 1, const_cast<float*>(b), g.ldb,
              1, &beta, c, g.ldc, 1);
#elif defined(BACKEND_DNNL)
    // dnnl_sgemm is row-major.
    const dnnl_status_t st = dnnl_sgemm(g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.m, g.n, g.k, 1.0f, a,
                                        g.lda, b, g.ldb, g.beta, c, g.ldc);
    if (st != dnnl_success) die("dnnl_sgemm failed with status " + std::to_string(int(st)));
#endif
}

// Called once in every thread that will call sgemm (main thread and each worker).
void backend_thread_init() {
#if defined(BACKEND_DNNL)
    // The OpenMP thread count is a per-thread setting: a pthread created by the application gets
    // the global default (OMP_NUM_THREADS, or all cores), not what main() set.
    if (g_omp_threads > 0) omp_set_num_threads(g_omp_threads);
#endif
}

// Threads of the library per sgemm call as seen from the calling thread (1 = single-threaded).
int backend_threads_per_call() {
#if defined(BACKEND_OPENBLAS)
    return openblas_get_parallel() == 0 ? 1 : openblas_get_num_threads();
#elif defined(BACKEND_BLIS)
    if (!bli_info_get_enable_threading()) return 1;
    const int64_t n = bli_thread_get_num_threads();
    return n < 1 ? 1 : static_cast<int>(n);
#elif defined(BACKEND_DNNL)
    return omp_get_max_threads();
#endif
}

// Process-wide setup; forces one thread per call where the library build is multi-threaded.
void backend_process_init() {
#if defined(BACKEND_OPENBLAS)
    if (openblas_get_parallel() != 0) openblas_set_num_threads(1);
#elif defined(BACKEND_BLIS)
    // Initialize before any query: with BLIS_ARCH_TYPE set, bli_arch_query_id() aborts if the
    // kernel-context store is not yet initialized.
    bli_init();
    if (bli_info_get_enable_threading()) bli_thread_set_num_threads(1);
#endif
    backend_thread_init();
}

#if defined(BACKEND_DNNL)
std::string dnnl_isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
        case dnnl_cpu_isa_sse41:
            return "sse41";
        case dnnl_cpu_isa_avx:
            return "avx";
        case dnnl_cpu_isa_avx2:
            return "avx2";
        case dnnl_cpu_isa_avx512_core:
            return "avx512";
        case dnnl_cpu_isa_avx512_core_vnni:
            return "avx512vnni";
        case dnnl_cpu_isa_avx512_core_bf16:
            return "avx512bf16";
        case dnnl_cpu_isa_avx512_core_amx:
            return "amx";
        default: {
            char buf[32];
            std::snprintf(buf, sizeof buf, "isa%#x", unsigned(isa));
            return buf;
        }
    }
}
#endif

// Short label naming the library and the kernel set it selected at run time.
std::string backend_label() {
#if defined(BACKEND_OPENBLAS)
    std::string core = openblas_get_corename();
    while (!core.empty() && core.back() == ' ') {
        core.pop_back();
    }
    const int parallel = openblas_get_parallel();  // 0 serial, 1 pthreads, 2 OpenMP build
    return std::string(parallel == 0   ? "openblas"
                       : parallel == 1 ? "openblas-pt"
                                       : "openblas-omp") +
           ":" + core;
#elif defined(BACKEND_BLIS)
    return std::string("blis:") + bli_arch_string(bli_arch_query_id());
#elif defined(BACKEND_DNNL)
    return "onednn:" + dnnl_isa_name(dnnl_get_effective_cpu_isa());
#endif
}

std::string backend_description() {
    char buf[512];
#if defined(BACKEND_OPENBLAS)
    std::snprintf(buf, sizeof buf, "%s | parallel build: %s", openblas_get_config(),
                  openblas_get_parallel() == 0 ? "no (serial)" : "yes (forced to 1 thread)");
#elif defined(BACKEND_BLIS)
    std::snprintf(buf, sizeof buf, "BLIS %s, config '%s' (index %d), threading: %s",
                  bli_info_get_version_str(), bli_arch_string(bli_arch_query_id()),
                  int(bli_arch_query_id()),
                  bli_info_get_enable_openmp()     ? "openmp (forced to 1 thread)"
                  : bli_info_get_enable_pthreads() ? "pthreads (forced to 1 thread)"
                                                   : "none (serial build)");
#elif defined(BACKEND_DNNL)
    const dnnl_version_t* v = dnnl_version();
    std::snprintf(buf, sizeof buf, "oneDNN %d.%d.%d (%s), cpu runtime 0x%x, effective ISA %s",
                  v->major, v->minor, v->patch, v->hash, v->cpu_runtime,
                  dnnl_isa_name(dnnl_get_effective_cpu_isa()).c_str());
#endif
    return buf;
}

// ---------------------------------------------------------------------------------------------
// Utilities

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

double cpu_s(clockid_t clock) {
    timespec ts{};
    clock_gettime(clock, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

uint64_t hash_string(const std::string& s) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a
    for (unsigned char ch : s) {
        h = (h ^ ch) * 1099511628211ULL;
    }
    return h;
}

// 64-byte aligned float buffer.
struct FreeDeleter {
    void operator()(float* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

Buffer alloc_floats(size_t n) {
    const size_t bytes = std::max<size_t>(64, (n * sizeof(float) + 63) / 64 * 64);
    auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (p == nullptr) die("out of memory allocating " + std::to_string(bytes) + " bytes");
    return Buffer(p);
}

// Deterministic uniform values in [-1, 1): identical inputs in every backend binary.
void fill_uniform(float* p, size_t n, uint64_t seed) {
    uint64_t state = seed;
    for (size_t i = 0; i < n; ++i) {
        p[i] = float(double(splitmix64(state) >> 40) * (2.0 / double(1ULL << 24)) - 1.0);
    }
}

std::vector<std::string> split(const std::string& s, char sep) {
    std::vector<std::string> out;
    std::string cur;
    std::istringstream in(s);
    while (std::getline(in, cur, sep)) {
        out.push_back(cur);
    }
    return out;
}

double median(std::vector<double> v) {
    if (v.empty()) return std::nan("");
    std::sort(v.begin(), v.end());
    const size_t h = v.size() / 2;
    return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

// ---------------------------------------------------------------------------------------------
// Shapes

// Offsets (in floats) of A, B and C for one sgemm call of an operation.
struct Call {
    size_t a = 0, b = 0, c = 0;
};

// One benchmarked operation: one or more sgemm calls with the same dimensions (the attention ops
// loop over sequences and heads) on shared buffers.
struct Shape {
    std::string name;  // "C768 fwd qkv"; unique, no commas or tabs
    Gemm g;
    std::vector<Call> calls;
    double per_step = 1;  // times it runs per training step (12 layers) for the weighted summary
    size_t a_len = 0, b_len = 0, c_len = 0;

    double flops() const { return 2.0 * double(g.m * g.n * g.k) * double(calls.size()); }
    std::string dims() const {
        std::string s = std::string(g.ta ? "T" : "N") + (g.tb ? "T" : "N") + " " +
                        std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k);
        if (calls.size() > 1) s += " *" + std::to_string(calls.size());
        return s;
    }
};

// Elements spanned by a row-major rows x cols matrix with leading dimension ld.
size_t span(int64_t rows, int64_t cols, int64_t ld) {
    return size_t((rows - 1) * ld + cols);
}

void finish_shape(Shape& s) {
    const Gemm& g = s.g;
    const size_t a_span = g.ta ? span(g.k, g.m, g.lda) : span(g.m, g.k, g.lda);
    const size_t b_span = g.tb ? span(g.n, g.k, g.ldb) : span(g.k, g.n, g.ldb);
    const size_t c_span = span(g.m, g.n, g.ldc);
    if (s.calls.empty()) s.calls.push_back({});
    for (const Call& c : s.calls) {
        s.a_len = std::max(s.a_len, c.a + a_span);
        s.b_len = std::max(s.b_len, c.b + b_span);
        s.c_len = std::max(s.c_len, c.c + c_span);
    }
}

constexpr int kLayers = 12;
constexpr int64_t kVocab = 50304;  // padded GPT-2 vocabulary
constexpr int64_t kHeadDim = 64;

// The three GEMMs of each linear layer, for one worker's BT rows and channel width C.
void add_linear_shapes(std::vector<Shape>& out, int64_t C, int64_t BT) {
    struct Linear {
        const char* name;
        int64_t oc, ic;  // W is (oc, ic)
        double per_step;
    };
    const Linear linears[] = {{"qkv", 3 * C, C, kLayers},
                              {"attproj", C, C, kLayers},
                              {"fc", 4 * C, C, kLayers},
                              {"fcproj", C, 4 * C, kLayers},
                              {"lmhead", kVocab, C, 1}};
    const std::string prefix = "C" + std::to_string(C) + "/BT" + std::to_string(BT) + " ";
    // forward: out(BT,OC) = inp(BT,IC) @ W(OC,IC)^T
    for (const Linear& l : linears) {
        Shape s;
        s.name = prefix + "fwd " + l.name;
        s.g = {false, true, BT, l.oc, l.ic, l.ic, l.ic, l.oc, 0.0f};
        s.per_step = l.per_step;
        out.push_back(s);
    }
    // backward, input grad: dinp(BT,IC) = dout(BT,OC) @ W(OC,IC)
    for (const Linear& l : linears) {
        Shape s;
        s.name = prefix + "bwd-dinp " + l.name;
        s.g = {false, false, BT, l.ic, l.oc, l.oc, l.ic, l.ic, 0.0f};
        s.per_step = l.per_step;
        out.push_back(s);
    }
    // backward, weight grad: dW(OC,IC) += dout(BT,OC)^T @ inp(BT,IC)
    for (const Linear& l : linears) {
        Shape s;
        s.name = prefix + "bwd-dW " + l.name;
        s.g = {true, false, l.oc, l.ic, BT, l.oc, l.ic, l.ic, 1.0f};
        s.per_step = l.per_step;
        out.push_back(s);
    }
}

// Attention core per (sequence, head) for BT rows split into sequences of length T. Q, K, V are
// column blocks of the (BT, 3C) qkv activation, so their row stride is 3C.
void add_attention_shapes(std::vector<Shape>& out, int64_t C, int64_t BT, int64_t T) {
    const int64_t B = BT / T;
    const int64_t NH = C / kHeadDim;
    const std::string prefix = "C" + std::to_string(C) + "/BT" + std::to_string(BT) + " ";
    Shape qk;  // scores(T,T) = Q(T,hd) @ K(T,hd)^T, one (T,T) block per (b,h)
    qk.name = prefix + "attn QK^T T=" + std::to_string(T);
    qk.g = {false, true, T, T, kHeadDim, 3 * C, 3 * C, T, 0.0f};
    Shape pv;  // out(T,hd) = P(T,T) @ V(T,hd), written into the (BT,C) attention output
    pv.name = prefix + "attn PV T=" + std::to_string(T);
    pv.g = {false, false, T, kHeadDim, T, T, 3 * C, C, 0.0f};
    for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < NH; ++h) {
            const size_t qkv = size_t(b * T * 3 * C + h * kHeadDim);
            const size_t scores = size_t((b * NH + h) * T * T);
            qk.calls.push_back({qkv, qkv + size_t(C), scores});
            pv.calls.push_back({scores, qkv + size_t(2 * C), size_t(b * T * C + h * kHeadDim)});
        }
    }
    qk.per_step = pv.per_step = kLayers;
    out.push_back(qk);
    out.push_back(pv);
}

std::vector<Shape> all_shapes() {
    std::vector<Shape> v;
    add_linear_shapes(v, 768, 256);
    add_attention_shapes(v, 768, 256, 64);
    add_attention_shapes(v, 768, 256, 256);
    add_linear_shapes(v, 384, 1024);
    for (Shape& s : v) {
        finish_shape(s);
    }
    return v;
}

// ---------------------------------------------------------------------------------------------
// Operands, reference and checks

struct Operands {
    Buffer a, b, c;
    uint64_t seed = 0;

    Operands(const Shape& s, uint64_t seed_) : seed(seed_) {
        a = alloc_floats(s.a_len);
        b = alloc_floats(s.b_len);
        c = alloc_floats(s.c_len);
        fill_uniform(a.get(), s.a_len, seed * 3 + 1);
        fill_uniform(b.get(), s.b_len, seed * 3 + 2);
        reset_c(s);
    }
    // C gets fresh values (they matter for beta = 1; they also pre-fault the pages).
    void reset_c(const Shape& s) { fill_uniform(c.get(), s.c_len, seed * 3 + 3); }
};

void run_op(const Shape& s, Operands& o) {
    for (const Call& call : s.calls) {
        sgemm(s.g, o.a.get() + call.a, o.b.get() + call.b, o.c.get() + call.c);
    }
}

// One sampled output entry with its float64 reference, computed before the op runs.
struct Sample {
    size_t call = 0;
    int64_t i = 0, j = 0;
    size_t c_index = 0;
    double ref = 0;    // expected value
    double scale = 0;  // sum of |terms|: the natural scale of the rounding error
};

constexpr int kSamples = 256;

std::vector<Sample> make_samples(const Shape& s, const Operands& o) {
    std::vector<Sample> out;
    uint64_t state = hash_string(s.name);
    const Gemm& g = s.g;
    for (int n = 0; n < kSamples; ++n) {
        Sample smp;
        smp.call = size_t(splitmix64(state) % s.calls.size());
        smp.i = int64_t(splitmix64(state) % uint64_t(g.m));
        smp.j = int64_t(splitmix64(state) % uint64_t(g.n));
        const Call& call = s.calls[smp.call];
        smp.c_index = call.c + size_t(smp.i * g.ldc + smp.j);
        const float* a = o.a.get() + call.a;
        const float* b = o.b.get() + call.b;
        double sum = double(g.beta) * double(o.c[smp.c_index]);
        double scale = std::fabs(sum);
        for (int64_t k = 0; k < g.k; ++k) {
            const double av = a[g.ta ? k * g.lda + smp.i : smp.i * g.lda + k];
            const double bv = b[g.tb ? smp.j * g.ldb + k : k * g.ldb + smp.j];
            sum += av * bv;
            scale += std::fabs(av * bv);
        }
        smp.ref = sum;
        smp.scale = std::max(scale, 1e-30);
        out.push_back(smp);
    }
    return out;
}

// Largest |C - ref| / scale over the samples.
double sample_error(const std::vector<Sample>& samples, const Operands& o) {
    double worst = 0;
    for (const Sample& smp : samples) {
        const double e = std::fabs(double(o.c[smp.c_index]) - smp.ref) / smp.scale;
        worst = std::max(worst, std::isfinite(e) ? e : INFINITY);
    }
    return worst;
}

std::vector<float> sample_values(const std::vector<Sample>& samples, const Operands& o) {
    std::vector<float> v;
    for (const Sample& smp : samples) {
        v.push_back(o.c[smp.c_index]);
    }
    return v;
}

// Normalized error bound for the float64-reference check: a float32 dot product of length K has
// an error of order sqrt(K) * 2^-24 of the sum of |terms| (worst case K * 2^-24).
constexpr double kCheckTol = 1e-5;

// ---------------------------------------------------------------------------------------------
// Benchmark

struct Options {
    double min_time = 0.2;
    std::vector<std::string> filters;
    std::string dump_path;
    int stress_calls = 2000;
    bool pair = true;
};

bool selected(const Shape& s, const Options& opt) {
    if (opt.filters.empty()) return true;
    for (const std::string& f : opt.filters) {
        if (s.name.find(f) != std::string::npos) return true;
    }
    return false;
}

std::atomic<int> g_failures{0};

void report_check(const std::string& what, const Shape& s, double err) {
    if (err <= kCheckTol) return;
    g_failures++;
    std::printf("# FAIL %s %s: normalized error %.3g > %.1g\n", what.c_str(), s.name.c_str(), err,
                kCheckTol);
}

// Repeats the op until it has run kWarmCalls times (counting the `done` seconds already spent on
// its first call) or for half the measuring time, whichever comes first; returns the time of the
// last call. oneDNN needs this: its first ~8 calls of a shape in a thread ran at 35-60% speed.
constexpr int kWarmCalls = 8;

double warm_up(const Shape& s, Operands& o, const Options& opt, double done) {
    const double budget = std::max(0.05, 0.5 * opt.min_time);
    double last = done > 0 ? done : INFINITY;
    for (int n = done > 0 ? 1 : 0; n < kWarmCalls && done < budget; ++n) {
        const double t0 = now_s();
        run_op(s, o);
        last = now_s() - t0;
        done += last;
    }
    return last;
}

// One CSV row. Rates in flop/s: by wall time, and by the CPU time the measuring thread(s) really
// got (robust against other processes on a shared host). cpu_per_wall < 1 means the thread was
// descheduled; proc_per_thread is process CPU / calling-thread CPU (1.0 = no library threads).
constexpr const char* kCsvHeader =
    "variant,shape,dims,mode,gflops,gflops_cpu,cpu_per_wall,proc_per_thread,step_flops";

void print_row(const std::string& label, const Shape& s, const char* mode, double rate_wall,
               double rate_cpu, double cpu_per_wall, double proc_per_thread) {
    char extra[32] = "";
    if (std::isfinite(proc_per_thread)) std::snprintf(extra, sizeof extra, "%.3f", proc_per_thread);
    std::printf("%s,%s,%s,%s,%.3f,%.3f,%.3f,%s,%.6g\n", label.c_str(), s.name.c_str(),
                s.dims().c_str(), mode, rate_wall * 1e-9, rate_cpu * 1e-9, cpu_per_wall, extra,
                s.flops() * s.per_step);
    std::fflush(stdout);
}

// Long on purpose: one benchmark case per library, each a few lines of setup that read best side
// by side (the same timing loop, the same checks) rather than behind another layer of helpers.
void bench_shape(const Shape& s, const Options& opt, const std::string& label, std::FILE* dump) {
    const double flops = s.flops();
    std::vector<Operands> ops;
    ops.emplace_back(s, 1000 + 2 * hash_string(s.name) % 1000);
    if (opt.pair) ops.emplace_back(s, 1001 + 2 * hash_string(s.name) % 1000);

    // Solo: check (on the first call), warm up, calibrate, time.
    Operands& o0 = ops[0];
    const std::vector<Sample> samples0 = make_samples(s, o0);
    double t = now_s();
    run_op(s, o0);
    const double first_call = now_s() - t;
    const double solo_err = sample_error(samples0, o0);
    report_check("solo", s, solo_err);
    const std::vector<float> solo_vals = sample_values(samples0, o0);
    if (dump != nullptr) {
        for (size_t n = 0; n < samples0.size(); ++n) {
            const Sample& smp = samples0[n];
            std::fprintf(dump, "%s\t%zu\t%lld\t%lld\t%.9g\t%.9g\n", s.name.c_str(), smp.call,
                         static_cast<long long>(smp.i), static_cast<long long>(smp.j),
                         double(solo_vals[n]), smp.scale);
        }
    }
    const double call_s = std::min(first_call, warm_up(s, o0, opt, first_call));
    const int reps = int(std::clamp(std::ceil(opt.min_time / std::max(call_s, 1e-7)), 1.0, 1e6));
    const double proc0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
    const double thread0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
    t = now_s();
    for (int r = 0; r < reps; ++r) {
        run_op(s, o0);
    }
    const double solo_s = now_s() - t;
    const double solo_cpu = cpu_s(CLOCK_THREAD_CPUTIME_ID) - thread0;
    const double proc_cpu = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - proc0;
    print_row(label, s, "1T", flops * reps / solo_s, flops * reps / solo_cpu, solo_cpu / solo_s,
              proc_cpu / solo_cpu);
    if (!opt.pair) return;

    // Pair: two threads, each on its own operands, checked and then timed together.
    double secs[2] = {0, 0};
    double thread_cpu[2] = {0, 0};  // CPU seconds of each worker during its timed loop
    double errs[2] = {0, 0};
    double post_errs[2] = {0, 0};
    int threads_per_call[2] = {0, 0};
    bool same_as_solo = false;
    std::barrier sync(2);
    auto worker = [&](int id) {
        backend_thread_init();
        threads_per_call[id] = backend_threads_per_call();
        Operands& o = ops[size_t(id)];
        o.reset_c(s);
        const std::vector<Sample> samples = make_samples(s, o);
        sync.arrive_and_wait();
        run_op(s, o);
        sync.arrive_and_wait();
        errs[id] = sample_error(samples, o);
        if (id == 0) same_as_solo = sample_values(samples, o) == solo_vals;
        warm_up(s, o, opt, 0.0);
        sync.arrive_and_wait();
        const double t0 = now_s();
        const double c0 = cpu_s(CLOCK_THREAD_CPUTIME_ID);
        for (int r = 0; r < reps; ++r) {
            run_op(s, o);
        }
        secs[id] = now_s() - t0;
        thread_cpu[id] = cpu_s(CLOCK_THREAD_CPUTIME_ID) - c0;
        // With beta = 0 every call rewrites C: check the output of the last concurrent call.
        if (s.g.beta == 0.0f) post_errs[id] = sample_error(samples, o);
    };
    std::thread th0(worker, 0);
    std::thread th1(worker, 1);
    th0.join();
    th1.join();
    for (int id = 0; id < 2; ++id) {
        report_check("2T thread " + std::to_string(id), s, errs[id]);
        report_check("2T-timed thread " + std::to_string(id), s, post_errs[id]);
        if (threads_per_call[id] != 1 && g_omp_threads != 0) {
            g_failures++;
            std::printf("# FAIL %s: worker %d would use %d library threads per call\n",
                        s.name.c_str(), id, threads_per_call[id]);
        }
    }
    if (!same_as_solo) {
        std::printf("# note %s: concurrent result not bitwise equal to solo result (within tol)\n",
                    s.name.c_str());
    }
    const double work = flops * reps;
    const double per_thread = 0.5 * (work / secs[0] + work / secs[1]);
    const double per_thread_cpu = 0.5 * (work / thread_cpu[0] + work / thread_cpu[1]);
    const double cpu_per_wall = 0.5 * (thread_cpu[0] / secs[0] + thread_cpu[1] / secs[1]);
    print_row(label, s, "2T-per-thread", per_thread, per_thread_cpu, cpu_per_wall, NAN);
    print_row(label, s, "2T-aggregate", 2.0 * work / std::max(secs[0], secs[1]),
              2.0 * per_thread_cpu, cpu_per_wall, NAN);
}

// Two threads run many small concurrent calls of mixed shapes and compare every output with the
// result the same call gave on one thread alone.
void stress(int calls) {
    std::vector<Shape> shapes;
    {
        Shape s;
        s.name = "stress NT";
        s.g = {false, true, 64, 64, 64, 2304, 2304, 64, 0.0f};
        shapes.push_back(s);
        s.name = "stress NN";
        s.g = {false, false, 96, 128, 80, 80, 128, 128, 0.0f};
        shapes.push_back(s);
        s.name = "stress TN";
        s.g = {true, false, 72, 56, 256, 72, 56, 56, 1.0f};
        shapes.push_back(s);
        s.name = "stress odd";
        s.g = {false, true, 37, 53, 71, 71, 71, 53, 0.0f};
        shapes.push_back(s);
        s.name = "stress mid";
        s.g = {false, true, 256, 384, 384, 384, 384, 384, 0.0f};
        shapes.push_back(s);
        for (Shape& x : shapes) {
            finish_shape(x);
        }
    }
    struct Case {
        std::vector<Operands> ops;                 // per thread
        std::vector<std::vector<float>> expected;  // per thread, whole C
    };
    std::vector<Case> cases(shapes.size());
    for (size_t n = 0; n < shapes.size(); ++n) {
        for (int id = 0; id < 2; ++id) {
            cases[n].ops.emplace_back(shapes[n], 77 + 10 * n + size_t(id));
            Operands& o = cases[n].ops.back();
            run_op(shapes[n], o);
            cases[n].expected.emplace_back(o.c.get(), o.c.get() + shapes[n].c_len);
        }
    }
    std::atomic<int> mismatches{0};
    std::atomic<int> failures{0};
    std::barrier sync(2);
    auto worker = [&](int id) {
        backend_thread_init();
        sync.arrive_and_wait();
        for (int it = 0; it < calls; ++it) {
            const size_t n = size_t(it + 3 * id) % shapes.size();
            Operands& o = cases[n].ops[size_t(id)];
            o.reset_c(shapes[n]);
            run_op(shapes[n], o);
            const std::vector<float>& want = cases[n].expected[size_t(id)];
            if (std::memcmp(o.c.get(), want.data(), want.size() * sizeof(float)) == 0) continue;
            mismatches++;
            for (size_t e = 0; e < want.size(); ++e) {
                const double diff = std::fabs(double(o.c[e]) - double(want[e]));
                if (!(diff <= 1e-4 * (1.0 + std::fabs(double(want[e]))))) {
                    failures++;
                    break;
                }
            }
        }
    };
    const double t0 = now_s();
    std::thread th0(worker, 0);
    std::thread th1(worker, 1);
    th0.join();
    th1.join();
    std::printf(
        "# stress: 2 threads x %d concurrent calls (5 small shapes, %.1f s): "
        "%d wrong results, %d not bitwise equal to the solo result\n",
        calls, now_s() - t0, failures.load(), mismatches.load());
    if (failures > 0) g_failures++;
}

int run_benchmark(const Options& opt) {
    const std::string label = backend_label();
    std::printf("# backend: %s\n", backend_description().c_str());
    std::printf("# label: %s, library threads per call in main thread: %d\n", label.c_str(),
                backend_threads_per_call());
    if (backend_threads_per_call() != 1 && g_omp_threads != 0) {
        die("library would use more than 1 thread per call");
    }
    std::FILE* dump = nullptr;
    if (!opt.dump_path.empty()) {
        dump = std::fopen(opt.dump_path.c_str(), "w");
        if (dump == nullptr) die("cannot write " + opt.dump_path);
    }
    if (opt.stress_calls > 0) stress(opt.stress_calls);
    std::printf("%s\n", kCsvHeader);
    for (const Shape& s : all_shapes()) {
        if (selected(s, opt)) bench_shape(s, opt, label, dump);
    }
    if (dump != nullptr) std::fclose(dump);
    if (g_failures > 0) {
        std::printf("# %d correctness failures\n", g_failures.load());
        return 1;
    }
    std::printf("# all correctness checks passed (tolerance %.0e of sum |a*b|)\n", kCheckTol);
    return 0;
}

int run_info() {
    std::printf("label: %s\n", backend_label().c_str());
    std::printf("backend: %s\n", backend_description().c_str());
    int worker_threads = 0;
    std::thread th([&] {
        backend_thread_init();
        worker_threads = backend_threads_per_call();
    });
    th.join();
    std::printf("library threads per call: main thread %d, new worker thread %d\n",
                backend_threads_per_call(), worker_threads);
#if defined(BACKEND_DNNL)
    int fresh = 0;
    std::thread th2([&] { fresh = omp_get_max_threads(); });
    th2.join();
    std::printf(
        "OpenMP max threads in a new pthread without omp_set_num_threads: %d "
        "(OMP_NUM_THREADS=%s)\n",
        fresh, std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "unset");
#endif
    return 0;
}

int run_blis_arch_index(const std::string& name) {
#if defined(BACKEND_BLIS)
    for (int i = 0; i < int(BLIS_NUM_ARCHS); ++i) {
        if (name == bli_arch_string(arch_t(i))) {
            std::printf("%d\n", i);
            return 0;
        }
    }
#else
    (void)name;
#endif
    return 1;
}

// ---------------------------------------------------------------------------------------------
// Cross-backend comparison of dumps

struct DumpEntry {
    double value = 0, scale = 0;
};

std::map<std::string, DumpEntry> read_dump(const std::string& path) {
    std::ifstream in(path);
    if (!in) die("cannot read " + path);
    std::map<std::string, DumpEntry> m;
    std::string line;
    while (std::getline(in, line)) {
        const std::vector<std::string> f = split(line, '\t');
        if (f.size() != 6) die("bad dump line in " + path + ": " + line);
        m[f[0] + "\t" + f[1] + "\t" + f[2] + "\t" + f[3]] = {std::stod(f[4]), std::stod(f[5])};
    }
    return m;
}

int run_compare(const std::string& ref_path, const std::string& other_path, double rtol) {
    const auto ref = read_dump(ref_path);
    const auto other = read_dump(other_path);
    size_t compared = 0, bad = 0;
    double worst = 0;
    std::string worst_key;
    for (const auto& [key, r] : ref) {
        const auto it = other.find(key);
        if (it == other.end()) continue;
        ++compared;
        const double e = std::fabs(it->second.value - r.value) / std::max(r.scale, 1e-30);
        if (!(e <= rtol)) ++bad;
        if (!(e <= worst)) {
            worst = e;
            worst_key = key;
        }
    }
    std::string where = split(worst_key, '\t').empty() ? "" : split(worst_key, '\t')[0];
    std::printf("%zu sampled entries compared, max |diff|/sum|a*b| = %.2e%s%s, %zu over rtol %.0e",
                compared, worst, where.empty() ? "" : " at ", where.c_str(), bad, rtol);
    if (compared == 0 || bad > 0) {
        std::printf(" -> MISMATCH\n");
        return 1;
    }
    std::printf(" -> ok\n");
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Summary of several runs: median per (shape, variant, mode)

// metric "wall": GFLOP/s by wall time; "cpu": by the CPU time the measuring threads got.
// Long on purpose: reading the runs, grouping, weighting and printing the table is one linear
// report whose parts share the grouped data; a benchmark script, not library code.
int run_summarize(const std::vector<std::string>& paths, const std::string& metric) {
    if (metric != "wall" && metric != "cpu") die("--metric must be wall or cpu");
    const size_t rate_field = metric == "wall" ? 4 : 5;
    std::vector<std::string> variants, shapes;
    std::map<std::string, std::string> dims;
    std::map<std::string, double> step_flops;
    using Key = std::tuple<std::string, std::string, std::string>;  // shape, variant, mode
    std::map<Key, std::vector<double>> gflops;
    std::map<std::pair<std::string, std::string>, std::vector<double>> cpu_per_wall,
        proc_per_thread;
    auto add_unique = [](std::vector<std::string>& v, const std::string& x) {
        if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
    };
    for (const std::string& path : paths) {
        std::ifstream in(path);
        if (!in) die("cannot read " + path);
        std::string line;
        while (std::getline(in, line)) {
            if (line.empty() || line[0] == '#' || line.rfind("variant,", 0) == 0) continue;
            const std::vector<std::string> f = split(line, ',');
            if (f.size() != 9) die("unexpected line in " + path + ": " + line);
            add_unique(variants, f[0]);
            add_unique(shapes, f[1]);
            dims[f[1]] = f[2];
            step_flops[f[1]] = std::stod(f[8]);
            gflops[{f[1], f[0], f[3]}].push_back(std::stod(f[rate_field]));
            if (f[3] != "2T-aggregate") cpu_per_wall[{f[0], f[3]}].push_back(std::stod(f[6]));
            if (!f[7].empty()) proc_per_thread[{f[0], f[3]}].push_back(std::stod(f[7]));
        }
    }
    if (variants.empty()) die("no results found");

    size_t name_w = 10, dims_w = 4, var_w = 0;
    for (const std::string& s : shapes) {
        name_w = std::max({name_w, s.size(), s.find(' ') + std::string(" step-weighted").size()});
        dims_w = std::max(dims_w, dims[s].size());
    }
    std::vector<size_t> col_w;
    for (const std::string& v : variants) {
        col_w.push_back(std::max<size_t>(8, v.size()));
        var_w = std::max(var_w, v.size());
    }

    const char* unit = metric == "wall" ? "GFLOP/s" : "GFLOP per CPU-second";
    const std::pair<const char*, const char*> modes[] = {
        {"1T", "single thread alone"},
        {"2T-per-thread", "2 threads concurrently, per thread"},
        {"2T-aggregate", "2 threads concurrently, aggregate"}};
    for (const auto& [mode, title] : modes) {
        size_t runs = SIZE_MAX;
        for (const auto& [key, v] : gflops) {
            if (std::get<2>(key) == mode) runs = std::min(runs, v.size());
        }
        if (runs == SIZE_MAX) continue;
        std::printf("\n== %s: median %s over %zu run(s) ==\n", title, unit, runs);
        std::printf("%-*s  %-*s", int(name_w), "shape", int(dims_w), "op");
        for (size_t c = 0; c < variants.size(); ++c) {
            std::printf("  %*s", int(col_w[c]), variants[c].c_str());
        }
        std::printf("  best (vs 2nd)\n");
        for (const std::string& s : shapes) {
            std::printf("%-*s  %-*s", int(name_w), s.c_str(), int(dims_w), dims[s].c_str());
            std::vector<std::pair<double, std::string>> ranked;
            for (size_t c = 0; c < variants.size(); ++c) {
                const auto it = gflops.find({s, variants[c], mode});
                if (it == gflops.end()) {
                    std::printf("  %*s", int(col_w[c]), "-");
                    continue;
                }
                const double m = median(it->second);
                ranked.push_back({m, variants[c]});
                std::printf("  %*.1f", int(col_w[c]), m);
            }
            std::sort(ranked.rbegin(), ranked.rend());
            if (ranked.size() >= 2) {
                std::printf("  %s (+%.0f%%)\n", ranked[0].second.c_str(),
                            100.0 * (ranked[0].first / ranked[1].first - 1.0));
            } else {
                std::printf("  %s\n", ranked.empty() ? "-" : ranked[0].second.c_str());
            }
        }
        // Effective rate over a training step: total flops / total time, shapes weighted by how
        // often they run (12 layers + LM head), per configuration prefix.
        std::vector<std::string> groups;
        for (const std::string& s : shapes) {
            add_unique(groups, s.substr(0, s.find(' ')));
        }
        for (const std::string& grp : groups) {
            std::printf("%-*s  %-*s", int(name_w), (grp + " step-weighted").c_str(), int(dims_w),
                        "all");
            for (size_t c = 0; c < variants.size(); ++c) {
                double total_flops = 0, total_time = 0;
                bool complete = true;
                for (const std::string& s : shapes) {
                    if (s.substr(0, s.find(' ')) != grp) continue;
                    const auto it = gflops.find({s, variants[c], mode});
                    if (it == gflops.end()) {
                        complete = false;
                        continue;
                    }
                    total_flops += step_flops[s];
                    total_time += step_flops[s] / (median(it->second) * 1e9);
                }
                if (complete && total_time > 0) {
                    std::printf("  %*.1f", int(col_w[c]), total_flops / total_time * 1e-9);
                } else {
                    std::printf("  %*s", int(col_w[c]), "-");
                }
            }
            std::printf("\n");
        }
    }

    double peak = 0;
    std::string peak_at;
    for (const auto& [key, v] : gflops) {
        if (std::get<2>(key) != "1T" || median(v) <= peak) continue;
        peak = median(v);
        peak_at =
            std::get<1>(key) + " on " + std::get<0>(key) + " (" + dims[std::get<0>(key)] + ")";
    }
    std::printf("\nsingle-core peak (best single-thread median): %.1f %s, %s\n", peak, unit,
                peak_at.c_str());
    // proc/thread CPU > 1 during solo calls would mean hidden library threads; CPU/wall well below
    // 1 means other processes took the CPU during the measurement (then prefer --metric cpu).
    std::printf("threading and host-load check (medians; max for the 1T process/thread ratio):\n");
    for (const std::string& v : variants) {
        std::printf("  %-*s", int(var_w), v.c_str());
        const auto proc = proc_per_thread.find({v, "1T"});
        if (proc != proc_per_thread.end()) {
            std::printf("  1T process/thread CPU max %.2f",
                        *std::max_element(proc->second.begin(), proc->second.end()));
        }
        for (const char* mode : {"1T", "2T-per-thread"}) {
            const auto it = cpu_per_wall.find({v, mode});
            if (it != cpu_per_wall.end())
                std::printf("  %s CPU/wall %.2f", mode, median(it->second));
        }
        std::printf("\n");
    }
    return 0;
}

[[noreturn]] void usage() {
    std::fprintf(stderr,
                 "usage: bench_sgemm [--min-time S] [--filter SUB[,SUB]] [--dump FILE]\n"
                 "                   [--stress-calls N] [--omp-threads N] [--no-pair]\n"
                 "       bench_sgemm --info | --blis-arch-index NAME\n"
                 "       bench_sgemm --compare REF OTHER [--rtol R]\n"
                 "       bench_sgemm --summarize [--metric wall|cpu] RUN.csv...\n");
    std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
    const std::vector<std::string> args(argv + 1, argv + argc);
    Options opt;
    double rtol = 1e-5;
    std::string mode = "bench";
    std::string metric = "wall";
    std::vector<std::string> positional;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string& a = args[i];
        auto value = [&]() -> const std::string& {
            if (i + 1 >= args.size()) usage();
            return args[++i];
        };
        if (a == "--summarize" || a == "--compare" || a == "--info" || a == "--blis-arch-index") {
            mode = a;
        } else if (a == "--metric") {
            metric = value();
        } else if (a == "--rtol") {
            rtol = std::stod(value());
        } else if (a == "--min-time") {
            opt.min_time = std::stod(value());
        } else if (a == "--filter") {
            for (const std::string& f : split(value(), ',')) {
                if (!f.empty()) opt.filters.push_back(f);
            }
        } else if (a == "--dump") {
            opt.dump_path = value();
        } else if (a == "--stress-calls") {
            opt.stress_calls = std::stoi(value());
        } else if (a == "--omp-threads") {
            g_omp_threads = std::stoi(value());
        } else if (a == "--no-pair") {
            opt.pair = false;
        } else if (a.rfind("--", 0) == 0) {
            usage();
        } else {
            positional.push_back(a);
        }
    }
    if (mode == "--summarize") return run_summarize(positional, metric);
    if (mode == "--compare") {
        if (positional.size() != 2) usage();
        return run_compare(positional[0], positional[1], rtol);
    }
    if (mode == "--blis-arch-index") {
        if (positional.size() != 1) usage();
        return run_blis_arch_index(positional[0]);
    }
    if (!positional.empty()) usage();
    backend_process_init();
    return mode == "--info" ? run_info() : run_benchmark(opt);
}
