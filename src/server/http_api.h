// The server's HTTP side (cpp-httplib): the routes of the OpenAI images API, the AUTOMATIC1111
// API, easel's jobs API (and sd.cpp's /sdcpp/v1 names for it), the web page at /, the
// --api-key check and the shapes of error bodies. Each route parses with job_request.h and
// acts through Service. docs/server.md documents every route and field.
#pragma once

#include "server/service.h"

#include <memory>
#include <string>

namespace httplib {
class Server;
}

namespace easel::server {

struct HttpOptions {
    std::string api_key;         ///< --api-key: required as "Authorization: Bearer KEY" on API routes
    std::string html;            ///< the page at / (--serve-html-path's file, else the embedded page)
    int threads = 48;            ///< HTTP worker threads
    int max_sync_waiters = 32;   ///< requests waiting for their job (txt2img, OpenAI) at once
    int max_streams = 16;        ///< open event streams
    int read_timeout_s = 10;     ///< a client that sends nothing for this long is dropped
};

/// The page embedded in the binary (src/server/web/index.html).
std::string embedded_page();

/// Registers every route of `svr` on `service`. The returned object must outlive `svr`'s run.
class HttpApi {
public:
    HttpApi(httplib::Server& svr, Service& service, HttpOptions opt);
    ~HttpApi();
    struct State;

private:
    std::unique_ptr<State> st_;
};

}  // namespace easel::server
