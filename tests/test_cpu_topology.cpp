// CPU lists and cores: the kernel's list format parsed (and refused when malformed), and CPUs
// grouped into cores from a sysfs tree written by the test (SMT siblings numbered far apart, as on
// Intel and AMD servers, or adjacent, as on some VMs), so worker defaults and pinning take one
// CPU per core first on any machine the suite runs on.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "scratch_files.hpp"
#include "threads/cpu_topology.hpp"

namespace gpt2 {
namespace {

namespace fs = std::filesystem;
using Cpus = std::vector<int>;

TEST(CpuList, ParsesTheKernelsFormat) {
    EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (Cpus{0, 1, 2, 3, 8, 10, 11}));
    EXPECT_EQ(parse_cpu_list("5"), (Cpus{5}));
    EXPECT_EQ(parse_cpu_list("0,64"), (Cpus{0, 64}));
    EXPECT_EQ(parse_cpu_list("\n"), Cpus{});  // an empty mask is printed as an empty line
    EXPECT_EQ(parse_cpu_list("3,1-2,2"), (Cpus{1, 2, 3}));  // ascending, each once
}

TEST(CpuList, RefusesWhatIsNotOne) {
    for (const char* bad : {"a", "1,", ",1", "1--2", "3-1", "-1", "1-", "1 2", "0-3:1/2",
                            "99999999999", "1,,2", "0x3"}) {
        EXPECT_EQ(parse_cpu_list(bad), std::nullopt) << bad;
    }
}

// A sysfs cpu directory: each CPU's topology lists as given (file name -> text).
class FakeCpuTree {
  public:
    explicit FakeCpuTree(const std::string& name) : dir_("gpt2-cpu-tree-" + name) {}
    void write(int cpu, const std::string& file, const std::string& text) const {
        const fs::path topology = root() / ("cpu" + std::to_string(cpu)) / "topology";
        fs::create_directories(topology);
        std::ofstream(topology / file) << text;
    }
    [[nodiscard]] const fs::path& root() const { return dir_.path(); }

  private:
    test::ScratchDir dir_;
};

TEST(Cores, SiblingsNumberedApartComeAfterEveryCoresFirstThread) {
    // 4 cores x 2 threads: CPU c and c + 4 share core c (Linux's numbering on x86 servers).
    const FakeCpuTree tree("apart");
    for (int c = 0; c < 4; ++c) {
        const std::string list = std::to_string(c) + "," + std::to_string(c + 4) + "\n";
        tree.write(c, "core_cpus_list", list);
        tree.write(c + 4, "core_cpus_list", list);
    }
    const auto all = cores_first(Cpus{0, 1, 2, 3, 4, 5, 6, 7}, tree.root());
    EXPECT_EQ(all.cores, 4);
    EXPECT_EQ(all.cpus, (Cpus{0, 1, 2, 3, 4, 5, 6, 7}));
    // mpirun --bind-to core on such a machine: one core's two threads are one core.
    const auto bound = cores_first(Cpus{1, 5}, tree.root());
    EXPECT_EQ(bound.cores, 1);
    EXPECT_EQ(bound.cpus, (Cpus{1, 5}));
    // A mask holding only second threads still counts their cores.
    EXPECT_EQ(cores_first(Cpus{4, 6}, tree.root()).cores, 2);
}

TEST(Cores, AdjacentSiblingsAreReorderedOneCpuPerCoreFirst) {
    // 3 cores x 2 threads numbered 0-1, 2-3, 4-5; kernels before 5.7 name the file
    // thread_siblings_list.
    const FakeCpuTree tree("adjacent");
    for (int cpu = 0; cpu < 6; ++cpu)
        tree.write(cpu, "thread_siblings_list",
                   std::to_string(cpu / 2 * 2) + "-" + std::to_string(cpu / 2 * 2 + 1) + "\n");
    const auto all = cores_first(Cpus{0, 1, 2, 3, 4, 5}, tree.root());
    EXPECT_EQ(all.cores, 3);
    EXPECT_EQ(all.cpus, (Cpus{0, 2, 4, 1, 3, 5}));
}

TEST(Cores, TheNewerFileWinsAndACpuWithoutAReadableListIsACoreOfItsOwn) {
    const FakeCpuTree tree("fallback");
    tree.write(0, "core_cpus_list", "0-1\n");
    tree.write(0, "thread_siblings_list", "0\n");  // ignored: core_cpus_list is there
    tree.write(1, "core_cpus_list", "0-1\n");
    tree.write(2, "core_cpus_list", "garbage\n");
    tree.write(3, "core_cpus_list", "4-5\n");  // does not name CPU 3
    // CPU 4 has no directory at all.
    const auto result = cores_first(Cpus{0, 1, 2, 3, 4}, tree.root());
    EXPECT_EQ(result.cores, 4);
    EXPECT_EQ(result.cpus, (Cpus{0, 2, 3, 4, 1}));
}

TEST(Cores, ThisMachinesMaskAndOnlineCpusAreConsistent) {
    const auto mask = affinity_cpus();
    ASSERT_FALSE(mask.empty());
    EXPECT_TRUE(std::is_sorted(mask.begin(), mask.end()));
    const auto online = online_cpus();
    for (const int cpu : mask)
        EXPECT_TRUE(std::binary_search(online.begin(), online.end(), cpu)) << cpu;
    const auto mine = cores_first(mask);
    EXPECT_GE(mine.cores, 1);
    EXPECT_LE(mine.cores, static_cast<int>(mask.size()));
    EXPECT_EQ(available_cores(), mine.cores);
    EXPECT_EQ(available_cpus(), static_cast<int>(mask.size()));
    // Every CPU of the mask once, reordered.
    auto sorted = mine.cpus;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, mask);
    // The parent (ctest or a shell) may run at least where this process may, or is unknown.
    const auto parent = parent_affinity_cpus();
    if (!parent.empty()) {
        for (const int cpu : mask)
            EXPECT_TRUE(std::binary_search(parent.begin(), parent.end(), cpu)) << cpu;
    }
}

}  // namespace
}  // namespace gpt2
