#include "core/runtime/start.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <thread>
#include <toml++/toml.h>

#include "core/comm/mpi_group.h"

namespace kvrt::runtime {
namespace {

// One rank's start-up record: its status, where it runs, and what it loaded.
constexpr size_t kStatusBytes = 1024, kWhereBytes = 128, kRecordBytes = 8192;

std::string table_text(const toml::table* t) {
  if (t == nullptr) return "(none)";
  std::ostringstream out;
  out << toml::toml_formatter(*t, toml::format_flags::none);
  std::string text = out.str();
  for (char& c : text) {
    if (c == '\n') c = ' ';
  }
  return text;
}

std::string plugin_text(const plugin::LoadedPlugin& p) {
  return p.name + " " + (p.desc.version ? p.desc.version : "(no version)") + " (ABI " +
         std::to_string(p.desc.abi_major) + "." + std::to_string(p.desc.abi_minor) + ")";
}

// What every rank must agree on, one "key\tvalue" per line, in a fixed order.
std::string fingerprint(Session& s) {
  const config::Config& cfg = s.cfg;
  const Runtime& rt = s.rt;
  const model::ModelConfig& m = rt.model;
  std::ostringstream out;
  out << "model\t" << rt.model_name << "\n";
  out << "model shape\t" << m.architecture << ", " << m.num_hidden_layers << " layers, hidden "
      << m.hidden_size << ", " << m.num_attention_heads << " heads / " << m.num_key_value_heads
      << " KV heads, vocab " << m.vocab_size << "\n";
  out << "weights\t" << (rt.bf16_weights ? "bf16" : "f32") << "\n";
  out << "model.matmul_precision\t" << cfg.model.matmul_precision;
  if (cfg.model.matmul_precision == "auto") {
    out << " (" << (rt.bf16_activations ? "medium" : "highest") << ")";
  }
  out << "\n";
  out << "tp.size\t" << cfg.tp.size << "\n";
  out << "tp.dcp_size\t" << cfg.tp.dcp_size << "\n";
  Result<const plugin::LoadedPlugin*> store = s.registry.load(cfg.kv.store);
  Result<const plugin::LoadedPlugin*> attention = s.registry.load(cfg.attention.backend);
  if (store.ok()) {
    out << "kv.store\t" << plugin_text(**store) << "\n";
    out << "[kv." << (*store)->name << "]\t" << table_text(cfg.plugin_table("kv", (*store)->name))
        << "\n";
  }
  if (attention.ok()) {
    out << "attention.backend\t" << plugin_text(**attention) << "\n";
    out << "[attention." << (*attention)->name << "]\t"
        << table_text(cfg.plugin_table("attention", (*attention)->name)) << "\n";
  }
  out << "scheduler.page_size\t" << cfg.scheduler.page_size << "\n";
  out << "KV pages per rank\t" << rt.plan.num_pages << "\n";
  return out.str();
}

std::string field(const std::vector<uint8_t>& all, int rank, size_t offset, size_t bytes) {
  const char* p = reinterpret_cast<const char*>(all.data() + rank * kRecordBytes + offset);
  return std::string(p, strnlen(p, bytes));
}

// The lines of a fingerprint as (key, value).
std::vector<std::pair<std::string, std::string>> lines(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const size_t tab = line.find('\t');
    out.emplace_back(line.substr(0, tab), tab == std::string::npos ? "" : line.substr(tab + 1));
  }
  return out;
}

// Every rank's record on every rank, then the same verdict on every rank. `host` is where this
// rank runs (MpiGroup::host).
Status handshake(comm::Communicator& comm, const std::string& host, const Status& mine,
                 const std::string& print) {
  const int rank = comm.rank(), size = comm.size();
  std::vector<uint8_t> record(kRecordBytes, 0), all(kRecordBytes * size);
  status_to_record(mine, std::span<uint8_t>(record).first(kStatusBytes));
  const std::string where = host + ", pid " + std::to_string(getpid());
  std::memcpy(record.data() + kStatusBytes, where.data(), std::min(where.size(), kWhereBytes - 1));
  const size_t print_at = kStatusBytes + kWhereBytes, print_bytes = kRecordBytes - print_at - 1;
  if (print.size() > print_bytes) {
    return Status::Internal("the start-up record of TP rank " + std::to_string(rank) +
                            " is over " + std::to_string(print_bytes) + " bytes");
  }
  std::memcpy(record.data() + print_at, print.data(), print.size());
  const std::vector<size_t> counts(size, kRecordBytes);
  if (Status s = comm.all_gather(record.data(), counts, all.data(), comm::ElementType::kU8,
                                 nullptr);
      !s.ok()) {
    return s.WithContext("TP start-up");
  }
  auto name = [&](int r) {
    return "TP rank " + std::to_string(r) + " of " + std::to_string(size) + " (" +
           field(all, r, kStatusBytes, kWhereBytes) + ")";
  };
  for (int r = 0; r < size; ++r) {
    const Status theirs =
        status_from_record(std::span<const uint8_t>(all).subspan(r * kRecordBytes, kStatusBytes));
    if (theirs.ok()) continue;
    if (rank != 0 && r != rank) {
      return Status::Internal("TP rank " + std::to_string(rank) + ": not starting: TP rank " +
                              std::to_string(r) + " failed (rank 0 says why)");
    }
    return theirs.WithContext(name(r) + " failed to start");
  }
  const auto reference = lines(field(all, 0, print_at, print_bytes));
  for (int r = 1; r < size; ++r) {
    const auto theirs = lines(field(all, r, print_at, print_bytes));
    for (size_t i = 0; i < std::max(reference.size(), theirs.size()); ++i) {
      const std::string key = i < reference.size() ? reference[i].first : theirs[i].first;
      const std::string a = i < reference.size() ? reference[i].second : "(nothing)";
      const std::string b = i < theirs.size() ? theirs[i].second : "(nothing)";
      if (i >= reference.size() || i >= theirs.size() || reference[i] != theirs[i]) {
        return Status::ConfigError(name(r) + " is configured differently from TP rank 0 (" +
                                   field(all, 0, kStatusBytes, kWhereBytes) + "): " + key +
                                   ": rank 0 has " + a + ", rank " + std::to_string(r) + " has " +
                                   b);
      }
    }
  }
  if (rank == 0) {
    std::string hosts;
    for (int r = 0; r < size; ++r) {
      hosts += (r ? "; " : "") + std::to_string(r) + " on " + field(all, r, kStatusBytes, kWhereBytes);
    }
    spdlog::info("TP {} over MPI: ranks {}", size, hosts);
  }
  return Status::Ok();
}

}  // namespace

int Session::rank() const { return mpi != nullptr ? mpi->rank() : 0; }

Status refuse_under_launcher(const std::string& what) {
  const int n = comm::launcher_world_size();
  if (n <= 1) return Status::Ok();
  return Status::Unsupported(what + " runs in one process, but an MPI launcher started " +
                             std::to_string(n) +
                             " kvrt processes: under mpirun, generate, bench and serve run as TP "
                             "ranks; run " + what + " without mpirun");
}

Result<std::unique_ptr<Session>> start(const std::string& config_path,
                                       const std::vector<std::string>& overrides) {
  auto session = std::make_unique<Session>();
  config::Config& cfg = session->cfg;
  const int launched = comm::launcher_world_size();
  Status s = Status::Ok();
  if (Result<config::Config> loaded = config::load(config_path, overrides); loaded.ok()) {
    cfg = std::move(*loaded);
  } else {
    s = loaded.status();
  }
  if (s.ok() && launched > 1 && cfg.tp.backend == "threads") {
    s = Status::ConfigError(cfg.source + ": tp.backend = \"threads\", but an MPI launcher started " +
                            std::to_string(launched) +
                            " kvrt processes: set tp.backend = \"mpi\" (or \"auto\"), or run one "
                            "process");
  }
  const bool mpi = launched > 1 || (s.ok() && cfg.tp.backend == "mpi");
  if (!mpi) {
    if (!s.ok()) return s;
    wire_plugins(session->registry, cfg);
    Result<Runtime> rt = build_runtime(cfg, session->registry);
    if (!rt.ok()) return rt.status();
    session->rt = std::move(*rt);
    return session;
  }

  // One rank of an MPI job: every rank gets to the handshake, whatever failed before it.
  Result<comm::MpiGroup*> group = comm::MpiGroup::world(s.ok() ? cfg.tp.timeout_s : 60);
  if (!group.ok()) return group.status();
  comm::MpiGroup& g = **group;
  session->mpi = &g;
  std::unique_ptr<comm::Communicator> startup = g.startup_communicator();
  if (s.ok() && cfg.tp.size != g.size()) {
    if (cfg.tp.size == 1) {
      cfg.tp.size = g.size();  // one TP rank per process
    } else {
      s = Status::ConfigError(cfg.source + ": tp.size = " + std::to_string(cfg.tp.size) +
                              ", but the MPI launcher started " + std::to_string(g.size()) +
                              (g.size() == 1 ? " process" : " processes") +
                              ": run one process per TP rank (mpirun -np " +
                              std::to_string(cfg.tp.size) + ")");
    }
  }
  if (s.ok()) {
    wire_plugins(session->registry, cfg);
    Result<Runtime> rt = build_runtime(cfg, session->registry, &g);
    if (rt.ok()) {
      session->rt = std::move(*rt);
    } else {
      s = rt.status();
    }
  }
  const std::string print = s.ok() ? fingerprint(*session) : "";
  Status verdict = handshake(*startup, g.host(), s, print);
  if (!verdict.ok()) {
    if (session->rt.engine != nullptr) session->rt.engine->mark_broken(verdict);
    return verdict;
  }
  return session;
}

int follow(Session& session) {
  exec::Engine& engine = *session.rt.engine;
  spdlog::debug("TP rank {}: following rank 0", session.rank());
  Status s = engine.follow();
  if (s.ok()) return 0;
  std::fprintf(stderr, "kvrt: TP rank %d: %s\n", session.rank(), s.message().c_str());
  // Rank 0 saw the same failure and is answering its clients before it ends the job (MPI_Abort);
  // this rank leaves it that time, and ends the job itself if rank 0 is the one that hangs.
  const double grace = std::min(10.0, session.cfg.tp.timeout_s);
  std::this_thread::sleep_for(std::chrono::duration<double>(grace));
  return 1;
}

}  // namespace kvrt::runtime
