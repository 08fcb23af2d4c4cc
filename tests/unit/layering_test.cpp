// The layers of src/ depend one way (docs/architecture.md "Layers"): every `#include "DIR/..."`
// of a file in src/LAYER/ names LAYER itself or a layer below it in kAllowed. A file that reaches
// up (models including pipeline, placement including models ...) fails
// Layering.SourceTreeFollowsTheLayers with the file, the line and the rule it breaks; a new folder
// under src/ fails it too until it is given its place in the table (and in the drawing).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

/// Each layer of src/ and the layers it may include (its own is always allowed). The same table
/// as the drawing in docs/architecture.md; keep the two together.
const std::map<std::string, std::set<std::string>>& allowed() {
    static const std::map<std::string, std::set<std::string>> t = {
        {"core", {}},
        {"io", {"core"}},
        {"nn", {"io", "core"}},
        {"text", {"io", "core"}},
        {"sampling", {"core"}},
        {"placement", {"nn", "io", "core"}},
        {"runtime", {"placement", "nn", "io", "core"}},
        {"lora", {"text", "nn", "io", "core"}},
        {"models", {"lora", "runtime", "placement", "sampling", "text", "nn", "io", "core"}},
        {"pipeline", {"lora", "models", "runtime", "placement", "sampling", "text", "nn", "io", "core"}},
        {"server", {"pipeline", "lora", "models", "runtime", "placement", "sampling", "text", "nn", "io", "core"}},
    };
    return t;
}

/// The violations of the table under `src` (a tree laid out as src/LAYER/...), one line each:
/// "src/nn/x.h:3: nn includes models/y.h; nn may include io, core". A folder of src/ that is not
/// in the table is one violation.
std::vector<std::string> violations(const fs::path& src) {
    std::vector<std::string> out;
    const std::regex inc(R"re(^\s*#\s*include\s*"([A-Za-z0-9_]+)/[^"]+")re");
    for (const auto& top : fs::directory_iterator(src)) {
        if (!top.is_directory()) continue;
        const std::string layer = top.path().filename().string();
        auto rule = allowed().find(layer);
        if (rule == allowed().end()) {
            out.push_back("src/" + layer + "/: a folder the layer table does not know; give it its place in tests/unit/layering_test.cpp "
                          "and in docs/architecture.md");
            continue;
        }
        for (const auto& e : fs::recursive_directory_iterator(top.path())) {
            if (!e.is_regular_file()) continue;
            const std::string ext = e.path().extension().string();
            if (ext != ".h" && ext != ".cpp" && ext != ".inc" && ext != ".hpp") continue;
            std::ifstream f(e.path());
            std::string line;
            int n = 0;
            while (std::getline(f, line)) {
                ++n;
                std::smatch m;
                if (!std::regex_search(line, m, inc)) continue;
                const std::string dep = m[1].str();
                if (dep == layer || rule->second.count(dep)) continue;
                if (!allowed().count(dep)) continue;  // not a layer of src/ (a library's own folder)
                std::string may;
                for (const auto& d : rule->second) may += (may.empty() ? "" : ", ") + d;
                out.push_back(fs::relative(e.path(), src.parent_path()).string() + ":" + std::to_string(n) + ": " + layer + " includes " +
                              line.substr(line.find('"') + 1, line.rfind('"') - line.find('"') - 1) + "; " + layer + " may include " +
                              (may.empty() ? "nothing of easel" : may));
            }
        }
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (auto& x : v) s += x + "\n";
    return s;
}

void write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
}

}  // namespace

TEST(Layering, SourceTreeFollowsTheLayers) {
    const fs::path src = fs::path(EASEL_SOURCE_DIR) / "src";
    ASSERT_TRUE(fs::is_directory(src)) << src;
    for (const auto& [layer, deps] : allowed()) EXPECT_TRUE(fs::is_directory(src / layer)) << "src/" << layer << " is in the table but absent";
    const auto v = violations(src);
    EXPECT_TRUE(v.empty()) << v.size() << " include(s) against the layers (docs/architecture.md):\n" << joined(v);
}

TEST(Layering, CheckerCatchesAnUpwardIncludeAndAnUnknownFolder) {
    const fs::path root = fs::temp_directory_path() / ("easel_layering_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()));
    fs::remove_all(root);
    const fs::path src = root / "src";
    write(src / "nn" / "ok.h", "#include \"io/weight_index.h\"\n#include \"nn/block.h\"\n#include <ggml.h>\n#include \"local.inc\"\n");
    write(src / "models" / "ok.cpp", "#include \"runtime/graph_runner.h\"\n#include \"placement/plan.h\"\n");
    EXPECT_TRUE(violations(src).empty()) << joined(violations(src));

    write(src / "nn" / "sub" / "bad.cpp", "// a comment\n  #  include \"models/family.h\"\n");
    write(src / "placement" / "bad.h", "#include \"pipeline/cache.h\"\n");
    auto v = violations(src);
    ASSERT_EQ(v.size(), 2u) << joined(v);
    EXPECT_EQ(v[0], "src/nn/sub/bad.cpp:2: nn includes models/family.h; nn may include core, io") << joined(v);
    EXPECT_EQ(v[1], "src/placement/bad.h:1: placement includes pipeline/cache.h; placement may include core, io, nn") << joined(v);

    write(src / "newlayer" / "x.h", "\n");
    v = violations(src);
    ASSERT_EQ(v.size(), 3u) << joined(v);
    EXPECT_NE(v[0].find("src/newlayer/: a folder the layer table does not know"), std::string::npos) << v[0];
    fs::remove_all(root);
}
