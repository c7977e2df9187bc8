// KVRT_UNROLL: put before a loop over a SIMD micro-kernel's array of register vectors. Such
// loops must be unrolled completely, or the arrays live in memory instead of registers (GCC -O2
// does not unroll them by itself; matmul_bf16 with 3 or 4 rows was 2.7x slower).
#pragma once

#define KVRT_UNROLL _Pragma("GCC unroll 16")
