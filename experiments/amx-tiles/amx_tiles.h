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

// y (R x N, R the A and C tiles' rows) = xb (R x K bf16) @ W (K x N bf16, panels of K x 16, a
// panel's inputs in pairs as the tiles read them): C tiles 0-3 (16 x 16 float32, four panels), A
// tile 4 (16 rows x 32 bf16 inputs), B tiles 5-7 in turn (16 pairs of inputs x 16 columns x 2;
// with two B tiles in turn instead of three a product took 1.6x as long). K % 32 == 0, N % 64 == 0.
static inline void amx_product(const uint16_t* xb, const uint16_t* W, float* y, int K, int N) {
    for (int p = 0; p < N / 16; p += 4) {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int k = 0; k < K; k += 32) {
            _tile_loadd(4, xb + k, K * 2);
            _tile_loadd(5, W + ((size_t)(p + 0) * K + k) * 16, 64); _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, W + ((size_t)(p + 1) * K + k) * 16, 64); _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(7, W + ((size_t)(p + 2) * K + k) * 16, 64); _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(5, W + ((size_t)(p + 3) * K + k) * 16, 64); _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, y + (p + 0) * 16, N * 4); _tile_stored(1, y + (p + 1) * 16, N * 4);  // tile numbers
        _tile_stored(2, y + (p + 2) * 16, N * 4); _tile_stored(3, y + (p + 3) * 16, N * 4);  // are constants
    }
}

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
