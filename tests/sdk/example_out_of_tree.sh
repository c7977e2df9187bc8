#!/usr/bin/env bash
# Installs this build into a staging prefix, builds the SDK example against it with
# find_package(kvrt) from a separate build tree (naming no build type: the plugin is optimised
# anyway), and runs the installed conformance suite on it.
set -euo pipefail
build=$1 example=$2 cc=$3 cxx=$4
stage=$build/example-stage
rm -rf "$stage" "$build/example-build"
cmake --install "$build" --prefix "$stage" >/dev/null
# The install carries what kvrt runs with: configs, workloads and the eval corpus.
test -f "$stage/share/kvrt/configs/kv-bound.toml"
test -f "$stage/share/kvrt/workloads/kv-bound.toml"
test -f "$stage/share/kvrt/eval/stories260k-samples.txt"
cmake -S "$example" -B "$build/example-build" -DCMAKE_PREFIX_PATH="$stage" \
      -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
cmake --build "$build/example-build" -j 2
# No build type given: kvrt_add_plugin still optimises the plugin.
grep -q -- '-O3' "$build/example-build/CMakeFiles/kv_int8.dir/flags.make"
plugin=$(find "$build/example-build" -name 'kv_int8.so' | head -n 1)
# The installed tool finds the installed plugins (lib/kvrt) by itself.
"$stage/bin/kvrt" plugins
KVRT_PLUGIN_PATH="$(dirname "$plugin")" "$stage/bin/kvrt" plugins | grep -q '^kv_int8 '
"$stage/bin/kvrt-conformance" --plugin "$plugin"
