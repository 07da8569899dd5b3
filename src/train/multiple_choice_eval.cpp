#include "train/multiple_choice_eval.hpp"

#include <algorithm>

namespace gpt2 {

std::vector<double> ending_losses(const Model& model, ThreadLocalTrainingContext& ctx,
                                  const MultipleChoiceExample& example,
                                  std::vector<std::int32_t>& rows) {
    const int T = ctx.seq_len();
    const auto context = static_cast<int>(example.context.size());
    for (const auto& ending : example.endings) {
        // Row inputs are every token but the last; the first ending token is predicted from the
        // last context token.
        if (context + static_cast<int>(ending.size()) - 1 > T) return {};
    }
    const int endings = static_cast<int>(example.endings.size());
    std::vector<double> means(static_cast<std::size_t>(endings), 0.0);
    int longest = 1;
    for (const auto& ending : example.endings)
        longest = std::max(longest, context + static_cast<int>(ending.size()) - 1);
    // An example's endings go through one forward together (rows padded to the longest) when they
    // fit the worker's context, else one by one (rows of their own length). Either way the row
    // count of every matrix product is the example's, never the split's: OpenBLAS's results for
    // a row depend on the product's row count, and groups sized by the worker's batch made
    // acc_norm differ between splits wherever two endings' losses were a few last bits apart.
    const bool together =
        static_cast<long>(endings) * longest <= static_cast<long>(std::max(1, ctx.max_batch())) * T;
    const int group = together ? endings : 1;
    for (int first = 0; first < endings; first += group) {
        int length = 1;
        for (int r = 0; r < group; ++r) {
            length = std::max(
                length,
                context +
                    static_cast<int>(example.endings[static_cast<std::size_t>(first + r)].size()) -
                    1);
        }
        const auto cells = static_cast<std::size_t>(group) * static_cast<std::size_t>(length);
        rows.assign(2 * cells, 0);  // padding after a row: causal, never read
        const std::span<std::int32_t> inputs(rows.data(), cells);
        const std::span<std::int32_t> targets(rows.data() + cells, cells);
        for (int r = 0; r < group; ++r) {
            const auto& ending = example.endings[static_cast<std::size_t>(first + r)];
            std::vector<std::int32_t> tokens(example.context);
            tokens.insert(tokens.end(), ending.begin(), ending.end());
            for (std::size_t t = 0; t + 1 < tokens.size(); ++t) {
                inputs[static_cast<std::size_t>(r) * length + t] = tokens[t];
                targets[static_cast<std::size_t>(r) * length + t] = tokens[t + 1];
            }
        }
        (void)forward_loss(model, ctx, TokenBatch{inputs, targets, group, length});
        for (int r = 0; r < group; ++r) {
            const auto& ending = example.endings[static_cast<std::size_t>(first + r)];
            const int begin = std::max(context - 1, 0);
            const int end = context + static_cast<int>(ending.size()) - 1;
            double sum = 0.0;
            for (int t = begin; t < end; ++t)
                sum += ctx.acts.losses[static_cast<std::size_t>(r) * length + t];
            means[static_cast<std::size_t>(first + r)] = end > begin ? sum / (end - begin) : 0.0;
        }
    }
    return means;
}

MultipleChoiceScore evaluate_multiple_choice(const Model& model, WorkerGroup& workers,
                                             const Communicator& comm,
                                             std::span<const MultipleChoiceExample> examples) {
    const int W = workers.contributing_workers();
    const auto ranks = static_cast<std::size_t>(comm.size());
    const auto rank = static_cast<std::size_t>(comm.rank());
    struct alignas(64) Counts {
        std::int64_t correct = 0, scored = 0, too_long = 0;
    };
    std::vector<Counts> counts(static_cast<std::size_t>(workers.size()));
    workers.pool().run([&](int w) {
        if (w >= W) return;  // a worker without sequences has no room for rows
        std::vector<std::int32_t> rows;
        Counts& mine = counts[static_cast<std::size_t>(w)];
        std::size_t turn = 0;
        for (std::size_t i = rank; i < examples.size(); i += ranks, ++turn) {
            if (turn % static_cast<std::size_t>(W) != static_cast<std::size_t>(w)) continue;
            const std::vector<double> losses =
                ending_losses(model, workers.context(w), examples[i], rows);
            if (losses.empty()) {
                ++mine.too_long;
                continue;
            }
            // The first of equal losses wins, as torch's argmin.
            const auto best = std::min_element(losses.begin(), losses.end()) - losses.begin();
            ++mine.scored;
            if (best == examples[i].label) ++mine.correct;
        }
    });
    MultipleChoiceScore total;
    for (const Counts& c : counts) {
        total.correct += c.correct;
        total.scored += c.scored;
        total.too_long += c.too_long;
    }
    // Sums of small integers: exact in double.
    total.correct =
        static_cast<std::int64_t>(comm.allreduce_sum(static_cast<double>(total.correct)));
    total.scored = static_cast<std::int64_t>(comm.allreduce_sum(static_cast<double>(total.scored)));
    total.too_long =
        static_cast<std::int64_t>(comm.allreduce_sum(static_cast<double>(total.too_long)));
    return total;
}

std::int32_t max_token(std::span<const MultipleChoiceExample> examples) {
    std::int32_t top = 0;
    for (const MultipleChoiceExample& e : examples) {
        for (const std::int32_t t : e.context)
            top = std::max(top, t);
        for (const auto& ending : e.endings)
            for (const std::int32_t t : ending)
                top = std::max(top, t);
    }
    return top;
}

}  // namespace gpt2
