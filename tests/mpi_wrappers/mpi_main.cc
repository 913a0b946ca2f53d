// GoogleTest main for tests run under mpirun: every rank runs every test; only rank 0 prints
// progress, every rank prints failures. Exit status 77 when every test skipped (no device, too
// few ranks): ctest's SKIP_RETURN_CODE then reports a skip, not a pass.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {
// The failures of a rank other than 0 (whose progress is not printed), with its rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  // (The test's name is kept here: UnitTest::current_test_info() would take the lock that
  // OnTestPartResult is called under.)
  void OnTestStart(const ::testing::TestInfo& t) override { test_ = std::string(t.test_suite_name()) + "." + t.name(); }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::printf("rank %d: %s: %s:%d: Failure\n%s\n", rank_, test_.c_str(), r.file_name() ? r.file_name() : "?",
                r.line_number(), r.message());
    std::fflush(stdout);
  }

 private:
  int rank_;
  std::string test_;
};
}  // namespace

int main(int argc, char** argv) {
  // THC_TEST_THREAD_MULTIPLE=1: MPI_THREAD_MULTIPLE (nonblocking calls progress on a thread);
  // otherwise MPI_Init, where they complete inside the start call.
  const char* tm = std::getenv("THC_TEST_THREAD_MULTIPLE");
  if (tm && std::strcmp(tm, "1") == 0) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_MULTIPLE) {
      MPI_Finalize();
      return 77;  // skipped: this MPI has no MPI_THREAD_MULTIPLE
    }
  } else {
    MPI_Init(&argc, &argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  // Any rank's failure fails the run on every rank.
  int worst = rc;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const auto& u = *::testing::UnitTest::GetInstance();
  const int all_skipped = u.test_to_run_count() > 0 && u.skipped_test_count() == u.test_to_run_count() ? 1 : 0;
  int every = 0;
  MPI_Allreduce(&all_skipped, &every, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (worst == 0 && every) worst = 77;
  MPI_Finalize();
  return worst;
}
