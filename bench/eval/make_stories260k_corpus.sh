#!/usr/bin/env bash
# Writes bench/eval/stories260k-samples.txt: the evaluation corpus for stories260k, the model's
# own samples at temperature 1 from fixed seeds and prompts, one story per line. Text the model
# wrote is fine for comparing KV formats with each other, since every store reads the same tokens
# and is measured against the f32 reference; it says nothing about the model's quality.
#   usage: bench/eval/make_stories260k_corpus.sh [BUILD]   (run from the repository root)
set -euo pipefail
build=${1:-build}
model=../shared/models/stories260k
out=bench/eval/stories260k-samples.txt
prompts=("Once upon a time" "One day" "Lily and Tom" "The little dog" "There was a big tree"
         "Mom said" "The sun was shining" "Ben had a red ball")
: >"$out"
seed=1
for round in 1 2 3; do
  for prompt in "${prompts[@]}"; do
    # Samples end at EOS or after 400 tokens; newlines inside a story become spaces.
    "./$build/bin/kvrt" generate --set "model.path=\"$model\"" --prompt "$prompt" \
      --temperature 1 --seed "$seed" --max-new-tokens 400 2>/dev/null | tr '\n' ' ' |
      sed 's/  */ /g; s/ $//' >>"$out"
    echo >>"$out"
    seed=$((seed + 1))
  done
done
echo "$out: $(wc -l <"$out") stories, $(wc -w <"$out") words"
