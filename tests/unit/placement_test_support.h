// Helpers of the placement tests (placement_family_test.cpp, placement_vae_test.cpp,
// placement_vae_encoder_test.cpp): the measured peak per device against the plan's prediction.
#pragma once

#include "placement/plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace easel::test_support {

/// GoogleTest checks, for every device of placement::device_peaks(plans) (the predicted peak
/// bytes per device over all the plans): a measured peak in `measured` (bytes per device name, as
/// models::Family::placement_peaks), within 10% of the prediction (0.9 p <= m <= 1.1 p) and not
/// above the budget of any plan's unit on that device (budget 0: none). `what` names the case in
/// the failure messages; `print`: one line per device with both figures in MiB. A device without
/// a measurement is a fatal failure (returns from this function).
inline void expect_peaks_within_10_percent(const std::vector<placement::ModulePlan>& plans, const std::map<std::string, uint64_t>& measured,
                                           const std::string& what, bool print = false) {
    for (auto& [d, p] : placement::device_peaks(plans)) {
        ASSERT_TRUE(measured.count(d)) << what << ": no measured peak on " << d;
        const double m = (double)measured.at(d);
        EXPECT_LE(m, 1.1 * (double)p) << what << " on " << d << ": measured " << m << " predicted " << p;
        EXPECT_GE(m, 0.9 * (double)p) << what << " on " << d << ": measured " << m << " predicted " << p;
        for (auto& pl : plans)
            for (auto& u : pl.devices)
                if (u.device == d && u.budget) {
                    EXPECT_LE(m, (double)u.budget) << what << " on " << d;
                }
        if (print)
            std::printf("  %-52s %-24s measured %8.4f MiB, predicted %8.4f MiB\n", what.c_str(), d.c_str(), m / 1048576.0, (double)p / 1048576.0);
    }
}

}  // namespace easel::test_support
