// Training across simulated hosts (scripts/multihost_rig.sh: network namespaces joined by
// rate-limited veth links, ranks talking TCP only): two hosts train as one, and a host that dies
// ends the job, which scripts/train_resilient.sh resumes to the end. Needs root and network
// namespaces; skipped with the reason otherwise.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "core/file_io.hpp"
#include "formats/checkpoint.hpp"
#include "process_support.hpp"
#include "test_support.hpp"
#include "train/log_lines.hpp"

namespace gpt2 {
namespace {

using test::run_command;
using test::ScratchDir;

const std::string kScripts = std::string(GPT2_SOURCE_DIR) + "/scripts/";
// AdamW pinned: these tests are about how the gradient travels between hosts (Muon's exchange:
// test_muon_training.cpp), and --optimizer auto would take Muon at some of their batches.
const std::string kModelFlags = test::small_model(32) +
                                " --optimizer adamw --lr 1e-3 --warmup-steps 2 --eps 1e-5"
                                " --val-every 0 --sample-every 0 --seed 5 --val-tokens 256";

// A rig of `hosts` namespaces for one test, removed by the destructor.
class Rig {
  public:
    Rig(int hosts, const std::string& rate) : name_("mh" + std::to_string(::getpid() % 100000)) {
        const auto up = run_command(kScripts + "multihost_rig.sh up " + name_ + " " +
                                    std::to_string(hosts) + " " + rate);
        status_ = up.exit_code;
        output_ = up.output;
    }
    ~Rig() { (void)run_command(kScripts + "multihost_rig.sh down " + name_); }
    Rig(const Rig&) = delete;
    Rig& operator=(const Rig&) = delete;
    [[nodiscard]] int status() const { return status_; }
    [[nodiscard]] const std::string& output() const { return output_; }
    [[nodiscard]] std::string mpirun(int ranks) const {
        return kScripts + "multihost_rig.sh mpirun " + name_ + " -np " + std::to_string(ranks) +
               " ";
    }
    [[nodiscard]] const std::string& name() const { return name_; }

  private:
    std::string name_;
    int status_ = 1;
    std::string output_;
};

#define REQUIRE_RIG(rig)                                      \
    if ((rig).status() == 77) GTEST_SKIP() << (rig).output(); \
    ASSERT_EQ((rig).status(), 0) << (rig).output()

TEST(Multihost, TwoHostsOverTcpTrainAsOneHostWithBucketsAndWithZeroOne) {
    const Rig rig(2, "1gbit");
    REQUIRE_RIG(rig);
    // A second rig of the same name is an error, not a skip.
    const auto again = run_command(kScripts + "multihost_rig.sh up " + rig.name() + " 2 none");
    EXPECT_EQ(again.exit_code, 1) << again.output;
    EXPECT_NE(again.output.find("exists"), std::string::npos) << again.output;
    const ScratchDir dir("gpt2-multihost");
    test::write_corpus(dir.path() / "corpus.txt", 60000);
    const std::string common =
        kModelFlags + " --data " + (dir / "corpus.txt") + " --max-steps 10 --checkpoint-every 0";
    const auto one = run_command(test::build_path("train_gpt2") + common +
                                 " --threads 2 --batch-size 8 --out-dir " + (dir / "single") +
                                 " --metrics-file " + (dir / "single.jsonl"));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    // One allreduce, overlapped tiny buckets, the automatic choice (buckets: the ranks are on
    // two machines), ZeRO-1 after backward (explicitly and by default) and in tiny buckets.
    const std::vector<std::pair<std::string, std::string>> variants = {
        {"one", "--bucket-mb 0"},
        {"buckets", "--bucket-mb 0.004"},
        {"auto", ""},
        {"zero", "--zero 1 --bucket-mb 0"},
        {"zero_auto", "--zero 1"},
        {"zero_buckets", "--zero 1 --bucket-mb 0.004"}};
    for (const auto& [name, flags] : variants) {
        const auto two = run_command(rig.mpirun(2) + test::build_path("train_gpt2") + common +
                                     " --threads 1 --batch-size 4 " + flags + " --out-dir " +
                                     (dir / name) + " --metrics-file " + (dir / (name + ".jsonl")));
        ASSERT_EQ(two.exit_code, 0) << two.output;
        EXPECT_NE(two.output.find("ranks x workers 2 x 1"), std::string::npos) << two.output;
        const std::string one(log_lines::kOneAllreduce), summed(log_lines::kSummedWhileBackward);
        const std::string mode =
            name == "one"       ? one + " (--bucket-mb 0)"
            : name == "buckets" ? summed
            : name == "auto" ? "buckets of 25 MiB, " + summed + " (auto: ranks on several machines)"
            : name == "zero" ? "ZeRO-1, one reduce-scatter"
            : name == "zero_buckets" ? "ZeRO-1, summed in buckets of 0.004 MiB while backward runs"
                                     : "ZeRO-1, one reduce-scatter";
        EXPECT_NE(two.output.find(mode), std::string::npos) << two.output;
        const std::vector<double> expected =
            test::metrics_values(dir / "single.jsonl", "train", "loss");
        const std::vector<double> actual =
            test::metrics_values(dir / (name + ".jsonl"), "train", "loss");
        ASSERT_EQ(expected.size(), 10u);
        ASSERT_EQ(actual.size(), expected.size()) << name;
        for (std::size_t s = 0; s < expected.size(); ++s)
            EXPECT_NEAR(actual[s], expected[s], 1e-5 * expected[s]) << name << " step " << s + 1;
        const LoadedModel a = load_checkpoint(dir / "single/model_000010.bin");
        const LoadedModel b = load_checkpoint(dir / (name + "/model_000010.bin"));
        EXPECT_TRUE(test::same_training(a.model.config, b.model.params.span(),
                                        a.model.params.span(), 1e-5, 1e-2))
            << name;
    }
}

// Two ranks on each of the two hosts: each host's ranks share one copy of the weights, and
// each slice of the gradient is summed over TCP between the hosts in buckets while backward runs
// (auto); the same training as one host, and its checkpoint resumes on one host.
TEST(Multihost, TwoRanksOnEachHostShareTheirMemoryAndAllreduceSlicesBetweenHosts) {
    const Rig rig(2, "1gbit");
    REQUIRE_RIG(rig);
    const ScratchDir dir("gpt2-multihost-shared");
    test::write_corpus(dir.path() / "corpus.txt", 60000);
    const std::string common = kModelFlags + " --data " + (dir / "corpus.txt") +
                               " --checkpoint-every 5 --lr-decay-steps 10";
    const auto one = run_command(test::build_path("train_gpt2") + common +
                                 " --max-steps 10 --threads 2 --batch-size 8 --out-dir " +
                                 (dir / "single") + " --metrics-file " + (dir / "single.jsonl"));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    const std::string four = "RIG_SLOTS=2 " + rig.mpirun(4) + test::build_path("train_gpt2") +
                             common + " --threads 1 --batch-size 2 --out-dir " + (dir / "hosts") +
                             " --metrics-file " + (dir / "hosts.jsonl");
    const auto first = run_command(four + " --max-steps 5");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    EXPECT_NE(first.output.find("ranks x workers 4 x 1"), std::string::npos) << first.output;
    EXPECT_NE(first.output.find("shared memory on each machine, each rank sums and updates 1/2 of "
                                "the weights, and its slice is summed across the 2 machines in "
                                "buckets of 25 MiB while backward runs (auto: 2 ranks on each "
                                "machine)"),
              std::string::npos)
        << first.output;
    // Resumed with many small buckets of the slices in flight over TCP.
    const auto resumed = run_command(four + " --max-steps 10 --resume auto --bucket-mb 0.004");
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const std::vector<double> expected =
        test::metrics_values(dir / "single.jsonl", "train", "loss");
    const std::vector<double> actual = test::metrics_values(dir / "hosts.jsonl", "train", "loss");
    ASSERT_EQ(expected.size(), 10u);
    ASSERT_EQ(actual.size(), expected.size());
    for (std::size_t s = 0; s < expected.size(); ++s)
        EXPECT_NEAR(actual[s], expected[s], 1e-5 * expected[s]) << "step " << s + 1;
    const LoadedModel a = load_checkpoint(dir / "single/model_000010.bin");
    const LoadedModel b = load_checkpoint(dir / "hosts/model_000010.bin");
    EXPECT_TRUE(test::same_training(a.model.config, b.model.params.span(), a.model.params.span(),
                                    1e-5, 1e-2));
}

// Host 2 is killed (every process in it) while the job trains: the job ends (mpirun notices the
// lost daemon), train_resilient.sh logs the restart and resumes from the last checkpoint, and the
// run reaches its last step with the same final model as an uninterrupted run.
TEST(Multihost, AKilledHostEndsTheJobAndTheResilientScriptFinishesIt) {
    const Rig rig(2, "1gbit");
    REQUIRE_RIG(rig);
    const ScratchDir dir("gpt2-multihost-kill");
    test::write_corpus(dir.path() / "corpus.txt", 60000);
    const std::string train = test::build_path("train_gpt2") + kModelFlags + " --data " +
                              (dir / "corpus.txt") +
                              " --max-steps 3000 --checkpoint-every 200 --keep-checkpoints 0 "
                              "--log-every 50 --threads 1 --batch-size 4 --resume auto --out-dir ";
    const std::string script =
        kScripts + "train_resilient.sh --max-restarts 2 --log " + (dir / "restarts.log") + " -- " +
        rig.mpirun(2) + train + (dir / "out") + " > " + (dir / "job.txt") + " 2>&1 & job=$!; " +
        // wait (at most 120 s) for training to be under way, kill host 2, wait for the job
        test::wait_for_log(dir / "job.txt", "step 250/3000 | loss") + kScripts +
        "multihost_rig.sh kill-host " + rig.name() +
        " 2; echo killed; timeout 240 tail --pid=$job -f /dev/null; wait $job; echo job exit $?";
    {
        std::ofstream file(dir / "kill.sh");
        file << script << "\n";
    }
    const auto result = run_command("bash " + (dir / "kill.sh"));
    const std::string job = read_text_file(dir / "job.txt");
    EXPECT_NE(result.output.find("killed"), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("job exit 0"), std::string::npos) << result.output << job;
    EXPECT_NE(job.find("[train_resilient] restart 1/2 after exit code"), std::string::npos) << job;
    EXPECT_NE(job.find(log_lines::kResumingFrom), std::string::npos) << job;
    EXPECT_NE(job.find("[train_resilient] finished after 1 restart(s)"), std::string::npos) << job;
    std::ifstream log_file(dir / "restarts.log");
    const std::string log((std::istreambuf_iterator<char>(log_file)), {});
    EXPECT_NE(log.find("restart 1/2 after exit code"), std::string::npos) << log;

    const auto whole = run_command(test::build_path("train_gpt2") + kModelFlags + " --data " +
                                   (dir / "corpus.txt") +
                                   " --max-steps 3000 --checkpoint-every 0 --threads 2 "
                                   "--batch-size 8 --out-dir " +
                                   (dir / "whole"));
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const LoadedModel expected = load_checkpoint(dir / "whole/model_003000.bin");
    const LoadedModel resumed = load_checkpoint(dir / "out/model_003000.bin");
    EXPECT_TRUE(test::same_training(expected.model.config, resumed.model.params.span(),
                                    expected.model.params.span(), 1e-4, 1e-2));
}

// The restart loop itself: a command without --resume auto is refused (a restart would start over);
// a failing one is restarted N times with its exit code and error line, then its code is returned.
TEST(ResilientScript, RefusesWithoutResumeAutoAndGivesUpAfterTheRestarts) {
    const auto refused = run_command(kScripts + "train_resilient.sh -- true");
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find("must pass --resume auto"), std::string::npos) << refused.output;

    const auto failing = run_command(kScripts +
                                     "train_resilient.sh --max-restarts 2 -- sh -c "
                                     "'echo error: rank 1 lost; exit 3' x --resume auto");
    EXPECT_EQ(failing.exit_code, 3) << failing.output;
    EXPECT_NE(failing.output.find("restart 1/2 after exit code 3: error: rank 1 lost"),
              std::string::npos)
        << failing.output;
    EXPECT_NE(failing.output.find("restart 2/2"), std::string::npos) << failing.output;
    EXPECT_NE(failing.output.find("giving up after 2 restart(s): exit code 3"), std::string::npos)
        << failing.output;

    const auto interrupted = run_command(kScripts +
                                         "train_resilient.sh --max-restarts 2 -- sh -c "
                                         "'echo interrupted; exit 130' x --resume auto");
    EXPECT_EQ(interrupted.exit_code, 130) << interrupted.output;
    EXPECT_NE(interrupted.output.find("stopped by a signal (exit code 130): not restarting"),
              std::string::npos)
        << interrupted.output;
    EXPECT_EQ(interrupted.output.find("restart 1/2"), std::string::npos) << interrupted.output;

    const auto fine =
        run_command(kScripts + "train_resilient.sh -- sh -c 'echo ok' x --resume auto");
    EXPECT_EQ(fine.exit_code, 0) << fine.output;
    EXPECT_EQ(fine.output.find("restart"), std::string::npos) << fine.output;
}

// The line logged with a restart is the job's first actual error: a rank's "error (rank R of N):"
// even after Open MPI's "Primary job terminated normally, but ..." preamble, and without one,
// Open MPI's line saying what happened to the rank, never the preamble.
TEST(ResilientScript, LogsTheFirstActualErrorLineNotOpenMpisPreamble) {
    const ScratchDir dir("gpt2-resilient-reason");
    {
        // What mpirun prints when a rank ends non-zero, then the line given as $1.
        std::ofstream job(dir.path() / "job.sh");
        job << "echo 'step 3/10 | loss 2.0 | lr 1.0e-03'\n"
               "echo '-------------------------------------------------------'\n"
               "echo 'Primary job  terminated normally, but 1 process returned'\n"
               "echo 'a non-zero exit code. Per user-direction, the job has been aborted.'\n"
               "echo '-------------------------------------------------------'\n"
               "echo \"$1\"\n"
               "echo 'mpirun detected that one or more processes exited with non-zero status, "
               "thus causing'\n"
               "exit 1\n";
    }
    const auto reason = [&](const std::string& line) {
        const auto result = run_command(kScripts + "train_resilient.sh --max-restarts 0 -- bash " +
                                        (dir / "job.sh") + " '" + line + "' --resume auto");
        EXPECT_EQ(result.exit_code, 1) << result.output;
        const std::string said = "giving up after 0 restart(s): exit code 1: ";
        const std::size_t at = result.output.find(said);
        if (at == std::string::npos) return "(none in: " + result.output + ")";
        const std::size_t end = result.output.find('\n', at);
        return result.output.substr(at + said.size(), end - at - said.size());
    };
    EXPECT_EQ(reason("error (rank 1 of 2): --data corpus.txt: no such file"),
              "error (rank 1 of 2): --data corpus.txt: no such file");
    EXPECT_EQ(reason("error: --val-tokens 8 is less than --seq-len 64"),
              "error: --val-tokens 8 is less than --seq-len 64");
    const std::string killed =
        "mpirun noticed that process rank 1 with PID 4242 on node a exited on signal 9 (Killed).";
    EXPECT_EQ(reason(killed), killed);
}

}  // namespace
}  // namespace gpt2
