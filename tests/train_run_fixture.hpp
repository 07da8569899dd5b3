// The fixture of the tests that check what one train_gpt2 run does: a scratch directory with a
// corpus, and the small model trained there (one process, or under mpiexec).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "process_support.hpp"

namespace gpt2::test {

// The flags every TrainRun passes before the test's own.
inline std::string train_run_flags() {
    return small_model(16) +
           " --batch-size 2 --threads 1 --val-every 0 --sample-every 0 --lr 1e-3 --warmup-steps 2"
           " --seed 5";
}

class TrainRun : public ::testing::Test {
  protected:
    void SetUp() override {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        dir_ = std::make_unique<ScratchDir>(std::string("gpt2-run-") + info->name());
        write_corpus(dir_->path() / "corpus.txt", 30000);
    }
    [[nodiscard]] std::string path(const std::string& name) const { return *dir_ / name; }
    [[nodiscard]] std::string command(const std::string& flags, int ranks = 0) const {
        // The test's own flags replace the fixture's (a flag given twice is refused).
        return (ranks > 0 ? mpiexec(ranks) : std::string()) + build_path("train_gpt2") +
               without_given(train_run_flags() + " --data " + path("corpus.txt"), flags) + " " +
               flags;
    }
    [[nodiscard]] ProcessResult train(const std::string& flags, int ranks = 0) const {
        return run_command(command(flags, ranks));
    }
    std::unique_ptr<ScratchDir> dir_;
};

// How often `what` occurs in `text` (overlapping occurrences counted).
inline std::size_t count_of(const std::string& text, const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
        ++n;
    return n;
}

}  // namespace gpt2::test
