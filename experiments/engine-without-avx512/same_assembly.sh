#!/usr/bin/env bash
# Is the engine an AVX-512 processor builds the same machine code as before the portable path?
# Compiles engine.cpp of commit fb8d5b3 (AVX-512 only) and of the working tree for two AVX-512
# targets, and compares their assembly less line notes and label numbers (same_assembly.log).
#   bash experiments/engine-without-avx512/same_assembly.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
before=$(mktemp --suffix=.cpp)
trap 'rm -f "$before"' EXIT
git show fb8d5b3:sr_blockwise/engine.cpp > "$before"
asm() { g++ -O3 -march="$1" -fopenmp -fPIC -std=c++17 -S "$2" -o - 2>/dev/null |
        grep -v '^\s*\.loc\|^\s*\.file\|^# [0-9]* "' | sed -E 's/\.L(FB|FE|CFI)[0-9]+/.L\1/g' | md5sum | cut -c1-16; }
for target in sapphirerapids skylake-avx512; do
    a=$(asm "$target" "$before"); b=$(asm "$target" sr_blockwise/engine.cpp)
    echo "$target: before $a, now $b: $([ "$a" = "$b" ] && echo same || echo DIFFERENT)"
done
