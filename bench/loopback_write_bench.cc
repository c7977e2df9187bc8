// The floor under a streamed answer's cost: the CPU one thread spends writing one server-sent
// event to a TCP connection over loopback while another thread reads it, as kvrt serve's
// network threads do once per event (once per token at stream_interval = 1). On loopback the
// writer's system call also runs the receiving side's TCP processing, so this is what a
// streamed token costs the server's process at the least, whatever the server does above the
// socket. bench/http_overhead.sh turns it into the floor of its CPU ratio.
//
// Counters: cpu_us_per_write (the writing thread's CPU time per write), bytes per write.
#include <arpa/inet.h>
#include <benchmark/benchmark.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

[[noreturn]] void die(const char* what) {
  std::perror(what);
  std::exit(1);
}

// A connected pair over 127.0.0.1: {writer, reader}.
std::pair<int, int> loopback_pair() {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("bind");
  if (listen(listener, 1) != 0) die("listen");
  if (getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) die("getsockname");
  const int writer = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(writer, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) die("connect");
  const int reader = accept(listener, nullptr, nullptr);
  if (reader < 0) die("accept");
  close(listener);
  const int one = 1;  // as the server's sockets: no Nagle delay on small writes
  setsockopt(writer, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return {writer, reader};
}

void BM_LoopbackEventWrite(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const auto [writer, reader] = loopback_pair();
  std::atomic<bool> done{false};
  std::thread drain([reader = reader, &done] {
    std::vector<char> buffer(1 << 16);
    while (!done.load(std::memory_order_relaxed)) {
      if (recv(reader, buffer.data(), buffer.size(), 0) <= 0) break;
    }
  });
  const std::string event(bytes, 'x');
  const double cpu0 = thread_cpu_seconds();
  for (auto _ : state) {
    size_t sent = 0;
    while (sent < bytes) {
      const ssize_t n = send(writer, event.data() + sent, bytes - sent, MSG_NOSIGNAL);
      if (n < 0 && errno != EINTR) die("send");
      if (n > 0) sent += static_cast<size_t>(n);
    }
  }
  const double cpu = thread_cpu_seconds() - cpu0;
  done = true;
  shutdown(writer, SHUT_WR);
  drain.join();
  close(writer);
  close(reader);
  state.counters["cpu_us_per_write"] = cpu * 1e6 / static_cast<double>(state.iterations());
  state.counters["bytes"] = static_cast<double>(bytes);
}

}  // namespace

// 160 bytes: a /generate event of a model without a tokenizer (ids and meta_info); 1 KiB: one
// carrying a few hundred bytes of text.
BENCHMARK(BM_LoopbackEventWrite)->Arg(160)->Arg(1024)->UseRealTime()->MinTime(0.5);

BENCHMARK_MAIN();
