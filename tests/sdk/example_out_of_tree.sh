#!/usr/bin/env bash
# Installs this build into a staging prefix, builds the SDK example against it with
# find_package(kvrt) from a separate build tree (naming no build type: the plugin is optimised
# anyway), and runs the installed conformance suite on it. Then builds tests/sdk/kv_q4 (a 4-bit
# store with a Hadamard rotation, correct and with planted value bugs) the same way: the correct
# one passes with no property skipped, every mutant fails the property that catches it.
set -euo pipefail
build=$1 example=$2 cc=$3 cxx=$4 q4=$5
stage=$build/example-stage
rm -rf "$stage" "$build/example-build" "$build/q4-build"
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

# The 4-bit store and its mutants, out of tree.
cmake -S "$q4" -B "$build/q4-build" -DCMAKE_PREFIX_PATH="$stage" \
      -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
cmake --build "$build/q4-build" -j 2
conformance() {  # conformance <variant>: the suite's output; its exit status in $status
  set +e
  out=$("$stage/bin/kvrt-conformance" --plugin "$build/q4-build/kv_q4_$1.so" 2>&1)
  status=$?
  set -e
}
conformance none
echo "$out"
if [ "$status" -ne 0 ] || ! grep -Eq 'kv_q4_none: [0-9]+ passed, 0 failed, 0 skipped' <<<"$out"; then
  echo "FAIL: the correct 4-bit store did not pass with nothing skipped" >&2
  exit 1
fi
for mutant in nibble_twice:write_gather_round_trip scale_25:rounding one_row:head_isolation \
              truncate:rounding no_inverse:write_gather_round_trip \
              no_gather:write_gather_round_trip; do
  name=${mutant%%:*} property=${mutant#*:}
  conformance "$name"
  if [ "$status" -eq 0 ] || ! grep -q "FAIL \] kv_q4_$name: $property: " <<<"$out"; then
    echo "$out"
    echo "FAIL: mutant $name was not caught by $property (exit $status)" >&2
    exit 1
  fi
  echo "mutant $name: caught by $property ($(grep -c 'FAIL \]' <<<"$out") properties failed)"
done
