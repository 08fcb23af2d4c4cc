#include "core/error.h"
#include "placement/devices.h"

#include <gtest/gtest.h>

using namespace easel;

TEST(Devices, CpuIsListedWithMemory) {
    auto devs = placement::list_devices();
    ASSERT_FALSE(devs.empty());
    bool cpu = false;
    for (auto& d : devs)
        if (d.type == "cpu") {
            cpu = true;
            EXPECT_GT(d.total_bytes, 0u);
            EXPECT_LE(d.free_bytes, d.total_bytes);
        }
    EXPECT_TRUE(cpu);
}

TEST(Devices, FindByCaseInsensitivePrefix) {
    EXPECT_NE(placement::find_device("cpu"), nullptr);
    EXPECT_NE(placement::find_device("Cp"), nullptr);
    EXPECT_THROW(placement::find_device("nosuchdevice"), Error);
}

TEST(Devices, MalformedRpcEndpointIsRejected) {
    try {
        placement::add_rpc_servers("localhost");
        FAIL() << "expected an error";
    } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::InvalidInput);
        EXPECT_NE(std::string(e.what()).find("host:port"), std::string::npos);
    }
    EXPECT_THROW(placement::add_rpc_servers("127.0.0.1:99999"), Error);
}
