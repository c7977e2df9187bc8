#!/usr/bin/env bash
# The command line as a user runs it: `kvrt generate` gives the reference ids through the serving
# core, logs go to stderr and program output to stdout, and a device without a backend is
# refused by name.   usage: kvrt_cli_test.sh <kvrt binary> <source dir>
set -u
kvrt=$1
src=$2
. "$(dirname "$0")/lib.sh"
model=$src/../shared/models/stories260k

# A warning (an attention backend that does not load) goes to stderr; stdout stays TOML.
"$kvrt" config check "$src/configs/default.toml" --set attention.backend=nope \
  >"$out/config.toml" 2>"$out/config.err"
check "config check exits 0" test $? -eq 0
check "the warning is on stderr" grep -q "attention.backend" "$out/config.err"
check "stdout has no log line" bash -c "! grep -qE '^\[[0-9]{4}-' '$out/config.toml'"
check "stdout reads back as a config" bash -c \
  "'$kvrt' config check '$out/config.toml' --set attention.backend=nope >/dev/null 2>&1"

# device.kind = "cuda" on a machine without a GPU (or a build without the toolkit): refused with
# the reason, never run on the CPU instead.
if ! nvidia-smi >/dev/null 2>&1; then
  "$kvrt" generate --set device.kind=cuda --prompt hi >"$out/cuda.out" 2>"$out/cuda.err"
  check "cuda is refused" test $? -ne 0
  check "the refusal says why" grep -qE \
    'device.kind = "cuda": (no CUDA device|this build has no CUDA backend)' "$out/cuda.err"
fi
"$kvrt" generate --set device.kind=tpu --prompt hi >"$out/tpu.out" 2>"$out/tpu.err"
check "an unknown device kind is refused" test $? -ne 0

# Capacity flags that would turn into nonsense integers are refused, naming the flag.
for w in -1 1e30 inf nan; do
  "$kvrt" capacity --weights-gib "$w" >"$out/cap.out" 2>"$out/cap.err"
  check "capacity --weights-gib $w is refused" test $? -ne 0
  check "and names --weights-gib" grep -q -- "--weights-gib: expected a number of GiB" "$out/cap.err"
done
"$kvrt" capacity --gpus 0 >"$out/cap.out" 2>"$out/cap.err"
check "capacity --gpus 0 is refused" test $? -ne 0
check "and names --gpus" grep -q -- "--gpus 0 must be a positive multiple" "$out/cap.err"
# Capacity says which device budget it assumed.
"$kvrt" capacity >"$out/cap.out" 2>&1
check "capacity without --gpu-memory says it assumed the default" \
  grep -q "(\[device\] memory's default: give --gpu-memory SIZE for your GPU)" "$out/cap.out"
"$kvrt" capacity --gpu-memory 80GiB >"$out/cap.out" 2>&1
check "capacity --gpu-memory 80GiB says so" grep -q "of 80.0 GiB (--gpu-memory)" "$out/cap.out"

# Sampling parameters the scheduler does not check are refused by the serving core, by name.
"$kvrt" generate --set model.preset=synth-tiny --prompt hi --temperature=-1 >"$out/t.out" 2>"$out/t.err"
check "generate --temperature -1 is refused" test $? -ne 0
check "and names temperature" grep -q "temperature: expected a finite number >= 0" "$out/t.err"

if [ -f "$model/model.safetensors" ]; then
  # The reference ids of issue 3, through the serving core, at TP 1 and 2, with a prefix that
  # the cache would hold: the CLI's -v line lists the generated ids.
  expected="432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 408 419 292 411 322 265 282 295 433 426"
  for tp in 1 2; do
    "$kvrt" generate --set "model.path=\"$model\"" --set tp.size=$tp --ignore-eos \
      --prompt "Once upon a time" --max-new-tokens 27 -v >"$out/gen.out" 2>"$out/gen.err"
    check "generate TP $tp exits 0" test $? -eq 0
    check "generate TP $tp gives the reference ids" grep -qx "generated ids: $expected" \
      "$out/gen.err"
    check "generate TP $tp prints the text on stdout" grep -q "^Once upon a time" "$out/gen.out"
  done
  # Too long for the model's context: refused with the reason, exit code non-zero.
  "$kvrt" generate --set "model.path=\"$model\"" --prompt "Once upon a time" \
    --max-new-tokens 100000 >"$out/long.out" 2>"$out/long.err"
  check "an impossible request exits non-zero" test $? -ne 0
  check "and says why" grep -q "max_new_tokens" "$out/long.err"
else
  echo "skipped the generation checks: $model not found"
fi
# kvrt tokenize / detokenize on the released tokenizers (references: transformers.js's
# tokenizers, @lenml/tokenizers 3.7; with special tokens as Python transformers adds them).
toks=$src/../shared/tokenizers
if [ -f "$toks/qwen3/tokenizer.json" ]; then
  printf 'line one\r\nline  two\t\r\n123456 caf\xc3\xa9' >"$out/crlf.txt"
  "$kvrt" tokenize "$toks/qwen3" --file "$out/crlf.txt" --json >"$out/tok.json" 2>"$out/tok.err"
  check "tokenize --file keeps CRLF and the missing newline (qwen3)" grep -qx \
    '{"ids":\[1056,825,319,1056,220,1378,4474,16,17,18,19,20,21,51950\]}' "$out/tok.json"
  "$kvrt" tokenize "$toks/llama-3.1" --file "$out/crlf.txt" >"$out/tok.txt" 2>"$out/tok.err"
  check "tokenize prints the ids on one line (llama-3.1)" grep -qx \
    '1074 832 319 1074 220 1403 4574 4513 10961 53050' "$out/tok.txt"
  : >"$out/empty.txt"
  "$kvrt" tokenize "$toks/deepseek-v3" --file "$out/empty.txt" --json >"$out/tok.json" 2>&1
  check "an empty file gives no ids" grep -qx '{"ids":\[\]}' "$out/tok.json"
  "$kvrt" tokenize "$toks/deepseek-v3" --text Hi --add-special-tokens --json >"$out/tok.json" 2>&1
  check "--add-special-tokens adds DeepSeek-V3's BOS (add_bos_token)" grep -qx \
    '{"ids":\[0,23166\]}' "$out/tok.json"
  "$kvrt" tokenize "$toks/llama-3.1" --text Hi --add-special-tokens --json >"$out/tok.json" 2>&1
  check "--add-special-tokens adds Llama 3.1's BOS (post-processor)" grep -qx \
    '{"ids":\[128000,13347\]}' "$out/tok.json"
  echo '[{"role": "user", "content": "Hello! Who are you?"}]' >"$out/messages.json"
  "$kvrt" tokenize "$toks/qwen3" --messages "$out/messages.json" >"$out/tok.txt" 2>"$out/tok.err"
  check "tokenize --messages renders qwen3's template" grep -qx \
    '151644 872 198 9707 0 10479 525 498 30 151645 198 151644 77091 198' "$out/tok.txt"
  "$kvrt" tokenize "$toks/qwen3" --messages "$out/messages.json" --no-generation-prompt \
    >"$out/tok.txt" 2>"$out/tok.err"
  check "--no-generation-prompt leaves the assistant turn out" grep -qx \
    '151644 872 198 9707 0 10479 525 498 30 151645 198' "$out/tok.txt"
  "$kvrt" detokenize "$toks/qwen3" --ids 151644,872,198,9707 --json >"$out/detok.json" 2>&1
  check "detokenize keeps special tokens" grep -qxF '{"text":"<|im_start|>user\nHello"}' \
    "$out/detok.json"
  "$kvrt" detokenize "$toks/qwen3" --ids 151644,872,198,9707 --skip-special-tokens \
    >"$out/detok.txt" 2>&1
  check "--skip-special-tokens leaves them out" diff "$out/detok.txt" <(printf 'user\nHello\n')
  "$kvrt" detokenize "$toks/qwen3" --ids 5,999999 >"$out/detok.txt" 2>"$out/detok.err"
  check "an id outside the vocabulary is refused" test $? -ne 0
  check "and named" grep -q "999999 is outside the vocabulary" "$out/detok.err"
  "$kvrt" tokenize "$toks/qwen3" >"$out/tok.txt" 2>"$out/tok.err"
  check "tokenize without input is refused" grep -q "exactly one of --text" "$out/tok.err"
  "$kvrt" tokenize "$out" --text hi >"$out/tok.txt" 2>"$out/tok.err"
  check "a directory without a tokenizer is refused by name" grep -q "tokenizer.json" "$out/tok.err"
else
  echo "skipped the tokenize checks: $toks not found"
fi
exit $failed
