#include "comm/http_listen.h"

#include <httplib.h>
#include <sys/socket.h>

#include <glog/logging.h>

namespace fleet {
namespace {

// Connections the kernel queues until the listener accepts them (the
// system's own cap, net.core.somaxconn, applies on top).
constexpr int kListenBacklog = SOMAXCONN;

}  // namespace

int BindHttpServer(httplib::Server& server, const std::string& host, int port) {
  // httplib calls this for every socket it tries; the last is the bound one.
  socket_t bound = INVALID_SOCKET;
  server.set_socket_options([&bound](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    bound = sock;
  });
  if (port == 0) {
    port = server.bind_to_any_port(host);
  } else if (!server.bind_to_port(host, port)) {
    port = -1;
  }
  server.set_socket_options([](socket_t) {});  // `bound` goes out of scope
  if (port <= 0) return -1;
  // listen() again on the listening socket only widens its queue.
  if (::listen(bound, kListenBacklog) != 0) {
    PLOG(WARNING) << "cannot widen the listen backlog of " << host << ":" << port;
  }
  return port;
}

}  // namespace fleet
