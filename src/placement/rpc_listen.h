// The listening side of `easel rpc-server`: a TCP port handed out by the OS (--port 0) and held
// for the server, and the check that it is this process that listens on it (so that a client
// told the port, e.g. a test that started the server, talks to that server and no other).
#pragma once

#include <string>

namespace easel::placement {

/// A TCP port on `host` picked by the OS (bind to port 0) and held while the object lives: the
/// socket is bound with SO_REUSEADDR but never listens, so no other process is handed the port,
/// while ggml's RPC server, which binds with SO_REUSEADDR too, can bind and listen on it (Linux
/// allows a second SO_REUSEADDR bind while the first socket does not listen). POSIX only.
class PortReservation {
public:
    /// Reserves a port on `host` (an IPv4 address such as 127.0.0.1 or 0.0.0.0). Throws
    /// Error(InvalidInput) for a host that is not an IPv4 address, Error(Io) when no port can be
    /// bound, Error(Unsupported) on Windows.
    explicit PortReservation(const std::string& host);
    ~PortReservation();
    PortReservation(const PortReservation&) = delete;
    PortReservation& operator=(const PortReservation&) = delete;
    int port() const { return port_; }

private:
    int fd_ = -1;
    int port_ = 0;
};

/// Whether a socket of this process listens on TCP port `port` (IPv4). Linux: an entry of
/// /proc/net/tcp in LISTEN state on that port whose socket inode is one of this process's open
/// file descriptors (/proc/self/fd), so another process listening on the port does not count.
/// Elsewhere: whether a TCP connection to 127.0.0.1:port succeeds (weaker: any listener counts).
bool self_listening_on(int port);

}  // namespace easel::placement
