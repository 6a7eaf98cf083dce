// What the AMX benchmarks here share: asking the kernel for tile data and configuring tiles 0-7
// as 16 rows x 64 bytes (a C tile 16 x 16 floats, an A tile 16 rows x 32 bf16, a B tile 16 pairs
// x 16 columns). Compile with -march=native on a processor with AMX.
#pragma once
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cstdint>
#include <cstdio>
#include <cstring>

// true where the tiles are ready; else says why and returns false
static bool amx_tiles_ready() {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */)) {
        printf("AMX: the kernel does not grant tile data here\n");
        return false;
    }
    struct { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg;
    std::memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
    return true;
}
