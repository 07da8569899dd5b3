// Shared memory between the ranks of one machine: mappings see each other's writes, failures are
// clean errors naming /dev/shm, no name is left behind, and a step over shared weights and
// gradients trains exactly as one over the rank's own (the multi-rank cases run through mpiexec
// in test_mpi_training).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/random.hpp"
#include "core/shared_memory.hpp"
#include "optim/adamw.hpp"
#include "parallel/allreduce.hpp"
#include "parallel/comm.hpp"
#include "parallel/shared_replica.hpp"
#include "train/step.hpp"

namespace gpt2 {
namespace {

std::string unique_name(const std::string& what) {
    return "/gpt2-mpi-test-" + std::to_string(::getpid()) + "-" + what;
}

// Entries of /dev/shm whose name starts with `prefix`.
int entries_starting_with(const std::string& prefix) {
    int count = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
        if (entry.path().filename().string().starts_with(prefix)) ++count;
    }
    return count;
}

TEST(SharedMapping, TwoMappingsOfOneNameShareTheirMemory) {
    const std::string name = unique_name("pair");
    const SharedMapping created = SharedMapping::create(name, 1 << 20);
    const SharedMapping opened = SharedMapping::open(name, 1 << 20);
    SharedMapping::unlink(name);
    EXPECT_NE(created.data(), opened.data());
    EXPECT_EQ(opened.data()[12345], std::byte{0});  // it starts as zeros
    created.data()[12345] = std::byte{42};
    EXPECT_EQ(opened.data()[12345], std::byte{42});
    EXPECT_EQ(entries_starting_with(name.substr(1)), 0);
}

TEST(SharedMapping, FailuresNameTheObjectAndTheSize) {
    const std::string name = unique_name("twice");
    const SharedMapping first = SharedMapping::create(name, 4096);
    try {
        (void)SharedMapping::create(name, 4096);
        ADD_FAILURE() << "a second create of one name succeeded";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
    try {
        (void)SharedMapping::open(name, 8192);
        ADD_FAILURE() << "opening with another size succeeded";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("wrong size"), std::string::npos) << e.what();
    }
    SharedMapping::unlink(name);
    // More than /dev/shm holds: an error now, not a SIGBUS when the pages are touched.
    try {
        (void)SharedMapping::create(unique_name("huge"), std::size_t{1} << 50);
        ADD_FAILURE() << "a petabyte of shared memory was reserved";
    } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("/dev/shm"), std::string::npos) << e.what();
    }
    EXPECT_EQ(entries_starting_with(unique_name("").substr(1)), 0);
}

TEST(SharedMapping, TheCommunicatorLeavesNoNameBehind) {
    const Communicator comm = Communicator::single_process();
    const std::string ours = "gpt2-mpi-" + std::to_string(::getpid()) + "-";
    const Communicator::SharedMemory shared = comm.map_shared(1 << 16);
    ASSERT_TRUE(shared.mapping) << shared.error;
    EXPECT_EQ(shared.mapping->size(), 1u << 16);
    EXPECT_EQ(entries_starting_with(ours), 0);
    const Communicator::SharedMemory too_big = comm.map_shared(std::size_t{1} << 50);
    EXPECT_FALSE(too_big.mapping);
    EXPECT_NE(too_big.error.find("/dev/shm"), std::string::npos) << too_big.error;
    EXPECT_EQ(entries_starting_with(ours), 0);
}

struct Trained {
    std::vector<double> losses;
    std::vector<float> params;
};

// Ten steps of a small model with 2 workers, its weights and gradient in shared memory or not;
// with `unshare_at`, back in the rank's own memory from that step on.
Trained train_ten_steps(bool share, Precision precision, int unshare_at = -1) {
    const ModelConfig config{32, 97, 128, 2, 4, 32};
    const int B = 4, T = 32;
    Model model(config);
    init_parameters(model, 7);
    set_precision(model, precision);
    const std::size_t P = model.layout.total();
    AdamW optimizer(P);
    WorkerGroup group(config, 2, B, T, false, precision);
    const Communicator comm = Communicator::single_process();
    const std::vector<Range> slices = {Range{0, P}};
    std::unique_ptr<GradientExchange> exchange;
    if (share) {
        const float* own = model.params.data();
        SharedGradients shared;
        const std::string error = share_replica_memory(model, group, comm, shared);
        EXPECT_EQ(error, "");
        EXPECT_NE(model.params.data(), own);  // the weights moved into the mapping
        auto exchanged =
            std::make_unique<SharedMemoryExchange>(comm, std::move(shared), slices, nullptr, 0);
        EXPECT_EQ(exchanged->rank_gradients().size(), 1u);
        EXPECT_EQ(exchanged->rank_gradients()[0], group.gradient().data());
        exchange = std::move(exchanged);
    } else {
        exchange = std::make_unique<AllreduceExchange>(comm, P, 0);
    }
    Rng rng(99);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(B) * T + 1);
    Trained result;
    for (int step = 0; step < 10; ++step) {
        if (step == unshare_at) {
            const float* mapped = model.params.data();
            const float* mapped_gradient = group.gradient().data();
            unshare_replica_memory(model, group);
            exchange = std::make_unique<AllreduceExchange>(comm, P, 0);
            share = false;
            EXPECT_NE(model.params.data(), mapped);
            EXPECT_NE(group.gradient().data(), mapped_gradient);
            EXPECT_EQ(model.params.size(), P);
            EXPECT_TRUE(std::all_of(group.gradient().begin(), group.gradient().end(),
                                    [](float g) { return g == 0.0f; }));
        }
        for (auto& t : tokens)
            t = static_cast<std::int32_t>(rng.below(97));
        const std::span<const std::int32_t> all(tokens);
        const StepBatch batch{all.first(tokens.size() - 1), all.subspan(1), 1, B};
        const StepRules rules{AdamWHyper{1e-3f, 0.9f, 0.95f, 1e-5f, 0.1f}, 1.0f};
        const StepMetrics m =
            train_step(TrainState{model, optimizer, group, *exchange}, batch, rules);
        EXPECT_FALSE(m.skipped);
        result.losses.push_back(m.loss);
    }
    result.params.assign(model.params.data(), model.params.data() + P);
    return result;
}

TEST(SharedReplica, TrainsBitwiseAsTheRanksOwnMemory) {
    for (const Precision precision : {Precision::Fp32, Precision::Bf16}) {
        const Trained own = train_ten_steps(false, precision);
        const Trained shared = train_ten_steps(true, precision);
        EXPECT_EQ(shared.losses, own.losses);
        EXPECT_TRUE(std::equal(own.params.begin(), own.params.end(), shared.params.begin()));
        // Undone after 5 steps (another machine could not share): the weights come along.
        const Trained unshared = train_ten_steps(true, precision, 5);
        EXPECT_EQ(unshared.losses, own.losses);
        EXPECT_TRUE(std::equal(own.params.begin(), own.params.end(), unshared.params.begin()));
    }
}

}  // namespace
}  // namespace gpt2
