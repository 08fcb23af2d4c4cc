#include "placement/rpc_listen.h"

#include "core/error.h"

#ifndef _WIN32
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#endif

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace easel::placement {

#ifdef _WIN32

PortReservation::PortReservation(const std::string&) {
    fail(ErrorKind::Unsupported, "rpc-server --port 0 is not supported on Windows: pass a port");
}
PortReservation::~PortReservation() = default;
bool self_listening_on(int) { return false; }

#else

PortReservation::PortReservation(const std::string& host) {
    in_addr addr{};
    if (inet_pton(AF_INET, host.c_str(), &addr) != 1)
        fail(ErrorKind::InvalidInput, "rpc-server: host '{}' is not an IPv4 address (example: 127.0.0.1)", host);
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) fail(ErrorKind::Io, "rpc-server: cannot create a socket: {}", std::strerror(errno));
    int one = 1;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr = addr;
    sa.sin_port = 0;
    socklen_t len = sizeof sa;
    if (::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 || ::bind(fd_, (sockaddr*)&sa, sizeof sa) != 0 ||
        ::getsockname(fd_, (sockaddr*)&sa, &len) != 0) {
        const int e = errno;
        ::close(fd_);
        fd_ = -1;
        fail(ErrorKind::Io, "rpc-server: cannot get a free port on {}: {}", host, std::strerror(e));
    }
    port_ = ntohs(sa.sin_port);
}

PortReservation::~PortReservation() {
    if (fd_ >= 0) ::close(fd_);
}

#ifdef __linux__
namespace {
/// Inodes of the sockets this process has open (/proc/self/fd links "socket:[N]").
std::set<std::string> own_socket_inodes() {
    std::set<std::string> out;
    std::error_code ec;
    for (auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
        std::error_code ec2;
        const std::string target = std::filesystem::read_symlink(e.path(), ec2).string();
        if (!ec2 && target.rfind("socket:[", 0) == 0 && target.back() == ']') out.insert(target.substr(8, target.size() - 9));
    }
    return out;
}
}  // namespace

bool self_listening_on(int port) {
    // /proc/net/tcp: "sl local_address rem_address st tx:rx tr:tm retrnsmt uid timeout inode ...",
    // addresses as HEXIP:HEXPORT, st 0A = LISTEN
    std::ifstream f("/proc/net/tcp");
    std::string line;
    std::getline(f, line);  // header
    std::set<std::string> inodes;
    while (std::getline(f, line)) {
        std::istringstream s(line);
        std::string sl, local, remote, st, txrx, trtm, retr, uid, timeout, inode;
        if (!(s >> sl >> local >> remote >> st >> txrx >> trtm >> retr >> uid >> timeout >> inode)) continue;
        const size_t colon = local.find(':');
        if (st != "0A" || colon == std::string::npos) continue;
        if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) inodes.insert(inode);
    }
    if (inodes.empty()) return false;
    for (auto& i : own_socket_inodes())
        if (inodes.count(i)) return true;
    return false;
}
#else
bool self_listening_on(int port) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return false;
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(fd, (sockaddr*)&sa, sizeof sa) == 0;
    ::close(fd);
    return ok;
}
#endif

#endif

}  // namespace easel::placement
