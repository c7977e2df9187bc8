# The README's commands. `make demo` and `make test` work on a fresh Debian machine as root:
# each installs what is missing with apt-get, configures, builds and runs.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

# Debian packages the build needs (see the README for what each is for).
PACKAGES = cmake g++ make pkg-config ccache libtomlplusplus-dev libboost-dev libspdlog-dev \
           libfmt-dev libcli11-dev libhwy-dev libxxhash-dev libgtest-dev libgmock-dev \
           libbenchmark-dev libopenblas-dev libsentencepiece-dev nlohmann-json3-dev curl \
           openmpi-bin libopenmpi-dev libpcre2-dev libutf8proc-dev

# What only the tests need: Chromium for the HTML report's browser test and libpng to read its
# screenshot. A machine that cannot install them still tests: that one test skips, saying why.
TEST_PACKAGES = chromium libpng-dev

# The fuzzers need clang and its libFuzzer runtime (installed only for `make fuzz`).
FUZZ_PACKAGES = clang-14 libclang-rt-14-dev
# Seconds per fuzz target: `make fuzz` (CI) and `make fuzz-long`.
FUZZ_SECONDS ?= 60
FUZZ_LONG_SECONDS ?= 300

.PHONY: deps test-deps npm-clients configure build demo report-screenshot test test-asan test-tsan fuzz fuzz-long fuzz-build bench install clean

deps:
	@missing=""; for p in $(PACKAGES) $(EXTRA_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

test-deps:
	@$(MAKE) --no-print-directory deps EXTRA_PACKAGES="$(TEST_PACKAGES)" || \
	  echo "could not install $(TEST_PACKAGES): the HTML report's browser test will be skipped"
	@$(MAKE) --no-print-directory npm-clients BUILD=$(BUILD)

# The real OpenAI-API clients cli.clients runs (tests/clients/package.json, versions pinned by
# its package-lock.json), installed with npm into the build folder; reinstalled only when the
# lock file changes. Without node/npm or the registry the test is skipped, saying why.
NPM_CLIENTS = $(BUILD)/npm-clients
npm-clients:
	@if ! command -v npm >/dev/null; then \
	  echo "npm not found: cli.clients (openai, Vercel AI SDK, LangChain) will be skipped"; \
	elif ! cmp -s tests/clients/package-lock.json $(NPM_CLIENTS)/node_modules/.kvrt-lock; then \
	  mkdir -p $(NPM_CLIENTS) && cp tests/clients/package.json tests/clients/package-lock.json $(NPM_CLIENTS)/ && \
	  (cd $(NPM_CLIENTS) && npm ci --no-audit --no-fund --loglevel=error) && \
	  cp tests/clients/package-lock.json $(NPM_CLIENTS)/node_modules/.kvrt-lock || \
	  echo "npm ci failed: cli.clients (openai, Vercel AI SDK, LangChain) will be skipped"; \
	fi

configure: deps
	cmake -S . -B $(BUILD) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The small real model the demo generates with: the copy this repository carries (llama2.c's
# stories260K, MIT; models/stories260k/README.md), so the demo shows real text on a bare clone.
STORIES = models/stories260k

demo: build
	./$(BUILD)/bin/kvrt plugins
	./$(BUILD)/bin/kvrt capacity --config configs/capacity-demo.toml
	@if [ -f $(STORIES)/model.safetensors ]; then \
	  echo "./$(BUILD)/bin/kvrt generate (stories260k, TP 2, kv_fp8_e4m3)"; \
	  ./$(BUILD)/bin/kvrt generate --set 'model.path="$(STORIES)"' --set tp.size=2 \
	    --set kv.store=kv_fp8_e4m3 --prompt "Once upon a time" --max-new-tokens 40 -v; \
	  echo "mpirun -np 2 ./$(BUILD)/bin/kvrt generate (the same, its two TP ranks as processes)"; \
	  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 \
	    ./$(BUILD)/bin/kvrt generate --set 'model.path="$(STORIES)"' \
	    --set kv.store=kv_fp8_e4m3 --prompt "Once upon a time" --max-new-tokens 40; \
	else echo "($(STORIES) not found: skipping the generation demo)"; fi
	@echo "./$(BUILD)/bin/kvrt bench --matrix: the KV-bound scenario (150 clients, long answers) with each store"
	./$(BUILD)/bin/kvrt bench --config configs/kv-bound.toml \
	  --workload bench/workloads/kv-bound.toml \
	  --matrix kv.store=kv_bf16_paged,kv_fp8_e4m3,kv_host_tiered \
	  --json-out $(BUILD)/demo-report.json --html-out $(BUILD)/demo-report.html

# The README's picture of the demo's report (after `make demo`), in headless Chromium.
report-screenshot:
	bench/screenshot.sh $(BUILD)/demo-report.html docs/bench-matrix-report.png 1240 2260
	rm -f docs/bench-matrix-report.png.log

test: test-deps build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

# The same suite under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: test-deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVRT_SANITIZE=address,undefined \
	  -DKVRT_BUILD_BENCH=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

# The threaded parts (the host tier's copy thread, concurrent writes, TP ranks, a FIFO's writer,
# the HTTP server's network and step threads, the tokenizer's shared merge cache) under TSan.
# OpenMP and OpenBLAS run one thread each: libgomp's barriers are not instrumented, so TSan
# would report its workers' reuse of the caller's stack as races.
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKVRT_SANITIZE=thread \
	  -DKVRT_BUILD_BENCH=OFF $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target kvrt-conformance kv_host_tiered_test \
	  engine_test stories260k_test stories260k_scheduler_test tiny_deepseek_v3_test kv_bf16_paged \
	  kv_fp8_e4m3 kv_f32_paged kv_int4 kv_host_tiered attn_cpu file_test server_test hf_tokenizer_test \
	  thread_communicator_test
	TSAN_OPTIONS=halt_on_error=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ctest --test-dir $(TSAN_BUILD) \
	  --output-on-failure -j $(JOBS) \
	  -R '^(conformance\.kv_(bf16|f32|fp8|int4|host)|HostTiered|EngineTest|MlaEngine|SpinBarrier|Communicator|StoresTpPages/|StoresTpDcpPages/|Stores/(Stories260k|TinyDeepseekV3|TinyDeepseekV3Dcp)Scheduler|Stories260kDcp\.|FileTest|ServerTest|HfTokenizerReference)'

# libFuzzer targets (tests/fuzz) built with clang, ASan and UBSan, each run for FUZZ_SECONDS.
fuzz-build:
	$(MAKE) deps EXTRA_PACKAGES="$(FUZZ_PACKAGES)"
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVRT_FUZZ=ON -DKVRT_BUILD_TESTS=OFF -DKVRT_BUILD_BENCH=OFF \
	  $(CMAKE_ARGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target kvrt_fuzzers

fuzz: fuzz-build
	tests/fuzz/run.sh $(FUZZ_BUILD)/bin $(FUZZ_SECONDS)

fuzz-long: fuzz-build
	tests/fuzz/run.sh $(FUZZ_BUILD)/bin $(FUZZ_LONG_SECONDS)

bench: build
	./$(BUILD)/bin/kv_store_bench --benchmark_counters_tabular=true
	./$(BUILD)/bin/attention_bench --benchmark_filter=decode_gather --benchmark_counters_tabular=true
	./$(BUILD)/bin/gemm_bench --benchmark_counters_tabular=true
	KVRT_SOURCE_DIR=. ./$(BUILD)/bin/tokenizer_bench --benchmark_counters_tabular=true

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
