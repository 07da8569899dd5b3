// The prompt pass of a KvCacheSession: a chunk of prompt positions as matrix products (fp32 GEMM,
// widened compact rows or bf16/int8 pieces), their keys and values written to the cache on the way.
// The block's variants (the norm, rotary positions, QK-norm, grouped-query heads, the MLP's
// activation, biases or none) are the training block's (model/block_parts.hpp).
#include <algorithm>
#include <cstring>

#include "model/block_parts.hpp"
#include "model/kv_cache.hpp"
#include "model/kv_cache_passes.hpp"
#include "ops/decode_attention.hpp"
#include "ops/gemm.hpp"
#include "ops/kernels.hpp"
#include "ops/prompt_products.hpp"

namespace gpt2 {

using namespace kv_cache_detail;

namespace {

// The input of a prompt's products: M rows of K activations, and, for products with pieces, the
// same split into them (rows padded to Mp).
struct PromptInput {
    const float* x = nullptr;  // (M, K), rows lda apart
    int M = 0, K = 0, Mp = 0;
    int lda = 0;
    const Bf16* bf16 = nullptr;         // (kBf16Pieces * Mp, K)
    const std::int8_t* int8 = nullptr;  // (kInt8Pieces * Mp, K)
    const float* scales = nullptr;      // (kInt8Pieces * Mp)
};

// Where a pieces product's partial results go, and the widened rows' scratch.
struct ProductScratch {
    float* weight_rows;  // kFp32RowsPerGemm * K floats
    float* f32;          // kBf16Pieces * Mp * kPiecesColumns floats
    std::int32_t* s32;   // kInt8Pieces * Mp * kPiecesColumns
};

// out[i, 0:n] (row stride ldo) = (accumulate ? out : 0) + bias[0:n] + in[i, 0:K] @ weight(n, K)^T
// for i < M: a slice of a linear layer (bias null: none). fp32 weights: the bias first, then the
// product added onto it by the fp32 GEMM (the order of matmul_forward and
// matmul_residual_forward). Compact weights: the pieces products when
// `in` carries pieces, else the rows widened to fp32 for the same GEMM.
void linear_rows(float* out, int ldo, const PromptInput& in, const WeightRows& weight,
                 const float* bias, int n, bool accumulate, const ProductScratch& scratch) {
    if (n <= 0) return;
    const int M = in.M, K = in.K;
    if (weight.compact.bf16 != nullptr && in.bf16 != nullptr) {
        for (int j0 = 0; j0 < n; j0 += kPiecesColumns) {
            const int cols = std::min(kPiecesColumns, n - j0);
            pieces_product(out + j0, ldo, in.bf16, M, in.Mp, K,
                           weight.compact.bf16 + static_cast<long>(j0) * K, cols,
                           bias != nullptr ? bias + j0 : nullptr, accumulate, scratch.f32);
        }
        return;
    }
    if (weight.compact.int8 != nullptr && in.int8 != nullptr) {
        for (int j0 = 0; j0 < n; j0 += kPiecesColumns) {
            const int cols = std::min(kPiecesColumns, n - j0);
            pieces_product(out + j0, ldo, in.int8, in.scales, M, in.Mp, K,
                           weight.compact.int8 + static_cast<long>(j0) * K,
                           weight.compact.scales + j0, cols, bias != nullptr ? bias + j0 : nullptr,
                           accumulate, scratch.s32);
        }
        return;
    }
    for (int i = 0; i < M; ++i) {
        float* o = out + static_cast<long>(i) * ldo;
        if (bias == nullptr) {
            if (!accumulate) std::fill(o, o + n, 0.0f);
        } else if (accumulate) {
            for (int j = 0; j < n; ++j)
                o[j] += bias[j];
        } else {
            std::memcpy(o, bias, sizeof(float) * static_cast<std::size_t>(n));
        }
    }
    const bool widened = weight.compact.bf16 != nullptr || weight.compact.int8 != nullptr;
    const int block = widened ? kFp32RowsPerGemm : n;
    for (int j0 = 0; j0 < n; j0 += block) {
        const int rows = std::min(block, n - j0);
        gemm_nt(M, rows, K, 1.0f, in.x, in.lda, weight.as_fp32(j0, rows, K, scratch.weight_rows), K,
                1.0f, out + j0, ldo);
    }
}

// Copies positions [0, count) of a head's bf16 cache into its fp32 staging copy (exact).
void stage_positions(const HeadCache<Bf16>& store, const HeadCache<float>& stage, int count, int hs,
                     int maxT) {
    if (count <= 0) return;
    for (int d = 0; d < hs; ++d) {
        const long at = static_cast<long>(d) * maxT;
        convert_to_float(stage.keys_t + at, store.keys_t + at, static_cast<std::size_t>(count));
    }
    convert_to_float(stage.values, store.values,
                     static_cast<std::size_t>(count) * static_cast<std::size_t>(hs));
}

// Writes M positions' keys and values (rows `ld` apart, hs each) into a head's cache at pos0..;
// a bf16 cache also gets them, rounded, in its fp32 staging copy (what attention then reads, as a
// token's attention reads the rounded cache).
void write_positions(const HeadCache<float>& cache, const float* k, const float* v, int ld, int M,
                     int pos0, int hs, int maxT) {
    for (int i = 0; i < M; ++i) {
        const float* ki = k + static_cast<long>(i) * ld;
        for (int d = 0; d < hs; ++d)
            cache.keys_t[static_cast<long>(d) * maxT + pos0 + i] = ki[d];
        std::memcpy(cache.values + static_cast<long>(pos0 + i) * hs, v + static_cast<long>(i) * ld,
                    sizeof(float) * static_cast<std::size_t>(hs));
    }
}
// With `stage` null, the bf16 cache alone.
void write_positions(const HeadCache<Bf16>& store, const HeadCache<float>* stage, const float* k,
                     const float* v, int ld, int M, int pos0, int hs, int maxT) {
    for (int i = 0; i < M; ++i) {
        const float* ki = k + static_cast<long>(i) * ld;
        const float* vi = v + static_cast<long>(i) * ld;
        const long row = static_cast<long>(pos0 + i) * hs;
        for (int d = 0; d < hs; ++d) {
            const long at = static_cast<long>(d) * maxT + pos0 + i;
            const Bf16 key = to_bf16(ki[d]), value = to_bf16(vi[d]);
            store.keys_t[at] = key;
            store.values[row + d] = value;
            if (stage != nullptr) {
                stage->keys_t[at] = to_float(key);
                stage->values[row + d] = to_float(value);
            }
        }
    }
}

}  // namespace

// Longer than the usual screen, on purpose, as forward_token.
void KvCacheSession::forward_prompt(std::span<const std::int32_t> tokens, bool logits) {
    Generator& g = gen_;
    const ModelConfig& c = model_.config;
    const int M = static_cast<int>(tokens.size());
    const int pos0 = length();
    const int C = c.channels, hs = c.head_size(), maxT = c.max_seq_len;
    const int KVH = c.kv_heads(), group = c.num_heads / KVH, KV = KVH * hs;
    const int QKV = c.qkv_width(), H = c.mlp_hidden(), F = c.fc_width();
    const bool rotary = c.arch.positions == PositionKind::Rotary;
    const int W = workers_;
    const bool bf16_cache = kv_bf16_.size() > 0;
    const bool pieces = compact_ != nullptr && g.prompt_products_ == PromptProducts::Pieces;
    const bool int8_pieces = pieces && compact_->format() == WeightFormat::Int8;
    const int Mp =
        pieces ? (M + kPiecesRowMultiple - 1) / kPiecesRowMultiple * kPiecesRowMultiple : M;
    embed(tokens, pos0, g.x_);
    const auto rows_at = [&](const float* weight, long count) {
        return weight_rows(compact_, weight, count);
    };
    // A bias at `offset`, or none where the model has no biases.
    const auto at = [](const float* bias, long offset) {
        return bias != nullptr ? bias + offset : nullptr;
    };
    // One pool.run per chunk; the phases inside are separated by barriers (7 per layer, 9 with
    // pieces). Each phase writes only its worker's share (of rows, columns or heads), and the next
    // reads what all shares wrote.
    run_workers([&](int worker) {
        Generator::WorkerScratch& ws = g.worker_scratch_[static_cast<std::size_t>(worker)];
        const ProductScratch products{ws.weight_rows, ws.products_f32, ws.products_s32};
        // The worker's rows of an input for the products: split into the shared pieces (the
        // padding rows too), where the products take pieces.
        const Range rows = split_range(static_cast<std::size_t>(Mp), worker, W);
        const auto i0 = static_cast<int>(rows.begin), i1 = static_cast<int>(rows.end);
        // x: K values a row, rows ldx apart.
        const auto split_rows = [&](const float* x, int K, int ldx) {
            if (int8_pieces) {
                split_into_int8_pieces(g.pieces_int8_.data(), g.piece_scales_, x, ldx, M, Mp, K, i0,
                                       i1);
            } else if (pieces) {
                split_into_bf16_pieces(g.pieces_bf16_.data(), x, ldx, M, Mp, K, i0, i1);
            }
        };
        // An input of K values a row, rows lda apart.
        const auto input = [&](const float* x, int K, int lda) {
            PromptInput in{x, M, K, Mp, lda};
            if (int8_pieces) {
                in.int8 = g.pieces_int8_.data();
                in.scales = g.piece_scales_;
            } else if (pieces) {
                in.bf16 = g.pieces_bf16_.data();
            }
            return in;
        };
        // The worker's rows of the block's norm of the residual stream into the generator's ln_,
        // and their pieces.
        const auto norm_rows = [&](const float* weight, const float* bias) {
            const int real_end = std::min(i1, M);
            if (real_end > i0) {
                norm_forward(c, g.ln_ + static_cast<long>(i0) * C, g.ln_stats_ + i0,
                             g.ln_stats_ + g.chunk_rows_ + i0, g.x_ + static_cast<long>(i0) * C,
                             weight, bias, real_end - i0);
            }
            split_rows(g.ln_, C, C);
        };
        // QK-norm and rotary positions on one head of q or k in the M rows (rows QKV apart).
        const auto position_head = [&](float* head) {
            if (c.arch.qk_norm) {
                for (int i = 0; i < M; ++i) {
                    float rstd = 0.0f;
                    float* x = head + static_cast<long>(i) * QKV;
                    rmsnorm_forward(x, &rstd, x, nullptr, 1, hs, c.arch.norm_eps, hs);
                }
            }
            if (rotary) rotary_forward(head, g.rotary_, M, M, pos0, 1, hs, QKV);
        };
        const Range rq = column_share(static_cast<std::size_t>(QKV), worker, W);
        const Range r = column_share(static_cast<std::size_t>(C), worker, W);
        const Range rh = column_share(static_cast<std::size_t>(H), worker, W);
        const auto bq = static_cast<long>(rq.begin), b = static_cast<long>(r.begin),
                   bh = static_cast<long>(rh.begin);
        const auto nq = static_cast<int>(rq.end - rq.begin), n = static_cast<int>(r.end - r.begin),
                   nh = static_cast<int>(rh.end - rh.begin);
        for (int l = 0; l < c.num_layers; ++l) {
            const LayerView<const float> p = layer_view(model_.layout, model_.weights(), l);
            // Queries, keys and values, by column.
            norm_rows(p.ln1w, p.ln1b);
            barrier_->arrive_and_wait();
            linear_rows(g.qkv_ + bq, QKV, input(g.ln_, C, C), rows_at(p.qkvw + bq * C, nq),
                        at(p.qkvb, bq), nq, false, products);
            barrier_->arrive_and_wait();
            // By key/value head: its keys and values into the cache, then its group's queries
            // (one for GPT-2), each head's attention needing only its own q.
            const Range kv_heads = split_range(static_cast<std::size_t>(KVH), worker, W);
            for (auto kh = static_cast<int>(kv_heads.begin); kh < static_cast<int>(kv_heads.end);
                 ++kh) {
                float* k = g.qkv_ + C + static_cast<long>(kh) * hs;
                const float* v = g.qkv_ + C + KV + static_cast<long>(kh) * hs;
                position_head(k);
                const long head = (static_cast<long>(l) * 2 * KVH + kh) * maxT * hs;
                const long values = static_cast<long>(KVH) * maxT * hs;
                HeadCache<float> cache{};
                if (g.bf16_attention_) {
                    // The bf16 products read the cache as stored, the new positions rounded.
                    const HeadCache<Bf16> store{kv_bf16_.data() + head,
                                                kv_bf16_.data() + head + values};
                    write_positions(store, nullptr, k, v, QKV, M, pos0, hs, maxT);
                    for (int h = kh * group; h < (kh + 1) * group; ++h) {
                        const long col = static_cast<long>(h) * hs;
                        float* q = g.qkv_ + col;
                        position_head(q);
                        attend_prompt_rows_bf16(
                            g.atty_ + col, C, q, QKV, store.keys_t, store.values,
                            {ws.attention_pieces, ws.attention_floats}, M, pos0, hs, maxT);
                    }
                    continue;
                }
                if (bf16_cache) {
                    // Attention reads an fp32 copy of the head's cache: its earlier positions
                    // as stored, the new ones rounded as a token's attention would see them.
                    const HeadCache<Bf16> store{kv_bf16_.data() + head,
                                                kv_bf16_.data() + head + values};
                    cache = HeadCache<float>{ws.stage, ws.stage + static_cast<long>(maxT) * hs};
                    stage_positions(store, cache, pos0, hs, maxT);
                    write_positions(store, &cache, k, v, QKV, M, pos0, hs, maxT);
                } else {
                    cache = HeadCache<float>{kv_.data() + head, kv_.data() + head + values};
                    write_positions(cache, k, v, QKV, M, pos0, hs, maxT);
                }
                for (int h = kh * group; h < (kh + 1) * group; ++h) {
                    const long col = static_cast<long>(h) * hs;
                    float* q = g.qkv_ + col;
                    position_head(q);
                    attend_prompt_rows(g.atty_ + col, C, q, QKV, cache.keys_t, cache.values,
                                       ws.scores, M, pos0, hs, maxT);
                }
            }
            barrier_->arrive_and_wait();
            // Attention projection onto the residual stream, by output column.
            if (pieces) {
                split_rows(g.atty_, C, C);
                barrier_->arrive_and_wait();
            }
            linear_rows(g.x_ + b, C, input(g.atty_, C, C), rows_at(p.attprojw + b * C, n),
                        at(p.attprojb, b), n, true, products);
            barrier_->arrive_and_wait();
            // MLP up-projection and its activation, by hidden column (SwiGLU: the gate's and the
            // up-projection's columns, the activation into the gate's).
            norm_rows(p.ln2w, p.ln2b);
            barrier_->arrive_and_wait();
            linear_rows(g.fch_ + bh, F, input(g.ln_, C, C), rows_at(p.fcw + bh * C, nh),
                        at(p.fcb, bh), nh, false, products);
            if (c.arch.mlp == MlpKind::SwiGlu) {
                linear_rows(g.fch_ + H + bh, F, input(g.ln_, C, C),
                            rows_at(p.fcw + (H + bh) * C, nh), at(p.fcb, H + bh), nh, false,
                            products);
            }
            for (int i = 0; i < M; ++i)
                activation_columns(c, g.fch_ + static_cast<long>(i) * F + bh, nh);
            barrier_->arrive_and_wait();
            // MLP down-projection onto the residual stream, by output column.
            if (pieces) {
                split_rows(g.fch_, H, F);
                barrier_->arrive_and_wait();
            }
            linear_rows(g.x_ + b, C, input(g.fch_, H, F), rows_at(p.fcprojw + b * H, n),
                        at(p.fcprojb, b), n, true, products);
            barrier_->arrive_and_wait();
        }
        if (!logits) return;
        head_logits(worker, g.x_ + static_cast<long>(M - 1) * C);
    });
    context_.insert(context_.end(), tokens.begin(), tokens.end());
}

}  // namespace gpt2
