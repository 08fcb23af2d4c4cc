// Linked into easel_tests: every test process (ctest runs each test in its own) gets its own
// easel cache folder, so no test reads or writes the user's ~/.cache/easel (a stale entry there
// could stand in for the code under test) and no two tests share entries. XDG_CACHE_HOME (which
// pipeline::default_cache_dir() reads first) and HOME point into a new temporary folder, removed
// at exit; the easel processes a test starts inherit them. The command tests get the same from
// tests/cli/lib/isolated.bash.
#include <cstdlib>
#include <filesystem>
#include <string>

#include <unistd.h>

namespace {

struct IsolatedCache {
    std::filesystem::path dir;
    IsolatedCache() {
        std::string t = (std::filesystem::temp_directory_path() / "easel_test_home_XXXXXX").string();
        if (!::mkdtemp(t.data())) std::abort();
        dir = t;
        std::filesystem::create_directories(dir / "cache");
        ::setenv("XDG_CACHE_HOME", (dir / "cache").c_str(), 1);
        ::setenv("HOME", dir.c_str(), 1);
    }
    ~IsolatedCache() {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
    }
} g_isolated_cache;

}  // namespace
