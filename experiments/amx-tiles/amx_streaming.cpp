// Where do a 1-row product's weights come from, and does that decide between the tiles and the
// multiply-adds? One thread; y (1 x 128) = x (1 x 512) @ W (512 x 128), bf16 weights, cycling
// through copies of W that together take 128 KB (L2 holds them), 1 MB, 1.5 MB (the L2 holds them
// only in part) or 8 MB (they come from L3 every time), as a batch-1 decoding call's weights do.
// Three ways: the engine's float32 multiply-adds (1 row x 4 panels); the tiles with one set of
// A and B tiles (C 0-3, A 4, B 5-7 in turn, 4 panels a block); the tiles as engine.cpp's
// amx_block runs them (C 0-1, two steps' A and B tiles alternating: 2-3 and 4-7, 2 panels a
// block). Median ns of 3,000 runs.
//   g++ -O3 -march=native -std=c++17 experiments/amx-tiles/amx_streaming.cpp -o amx_streaming && ./amx_streaming; rm -f amx_streaming
#include <cstdlib>
#include <vector>
#include "amx_tiles.h"  // amx_tiles_ready, amx_product (one set of tiles)
static const int K = 512, N = 128;
#include "../engine_kernel.h"  // fma_tile

// A and C tiles (0-4) as many rows as the product has, B tiles (5-7) 16 pairs of inputs
static void tiles_for_rows(int rows, int a_and_c) {
    struct { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg;
    std::memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = t < a_and_c ? rows : 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
}

// the tiles as engine.cpp's amx_block runs them, two steps' A and B tiles alternating: C 0-1, A 2-3, B 4-7
static void alternating(const uint16_t* xb, const uint16_t* W, float* y) {
    for (int p = 0; p < N / 16; p += 2) {
        const uint16_t *w0 = W + (size_t)p * K * 16, *w1 = w0 + (size_t)K * 16;
        _tile_zero(0); _tile_zero(1);
        for (int k = 0; k < K; k += 64) {
            _tile_loadd(2, xb + k, K * 2); _tile_loadd(4, w0 + (size_t)k * 16, 64); _tile_loadd(5, w1 + (size_t)k * 16, 64);
            _tile_loadd(3, xb + k + 32, K * 2);
            _tile_loadd(6, w0 + (size_t)(k + 32) * 16, 64); _tile_loadd(7, w1 + (size_t)(k + 32) * 16, 64);
            _tile_dpbf16ps(0, 2, 4); _tile_dpbf16ps(1, 2, 5);
            _tile_dpbf16ps(0, 3, 6); _tile_dpbf16ps(1, 3, 7);
        }
        _tile_stored(0, y + p * 16, N * 4); _tile_stored(1, y + (p + 1) * 16, N * 4);
    }
}

template <class F> static double median_ns(F f, int reps = 3000) {
    std::vector<double> t(reps);
    for (auto& v : t) {
        auto t0 = std::chrono::steady_clock::now();
        f();
        v = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    }
    std::nth_element(t.begin(), t.begin() + reps / 2, t.end());
    return t[reps / 2];
}

int main() {
    if (!amx_tiles_ready()) return 0;
    const size_t per = (size_t)K * N, copies = 64;
    uint16_t* W = (uint16_t*)std::aligned_alloc(64, copies * per * 2);
    uint16_t* xb = (uint16_t*)std::aligned_alloc(64, 16 * K * 2);
    float* x = (float*)std::aligned_alloc(64, K * 4);
    float* y = (float*)std::aligned_alloc(64, 16 * N * 4);
    std::fill(W, W + copies * per, 0x3e80); std::fill(xb, xb + 16 * K, 0x3f00); std::fill(x, x + K, 0.5f);
    printf("| weights cycled through | multiply-adds, ns | tiles, one set, ns | tiles, alternating, ns |\n|---|---|---|---|\n");
    for (int n : {1, 8, 12, 64}) {
        size_t i = 0;
        auto next = [&] { return W + (i++ % n) * per; };
        const double fma = median_ns([&] { const uint16_t* w = next(); fma_tile<1, 4>(x, w, y, N); fma_tile<1, 4>(x, w + 4 * per / 8, y + 64, N); });
        tiles_for_rows(1, 5);
        const double one = median_ns([&] { amx_product(xb, next(), y, K, N); });
        tiles_for_rows(1, 4);
        const double alt = median_ns([&] { alternating(xb, next(), y); });
        printf("| %zu KB | %.0f | %.0f | %.0f |\n", n * per * 2 / 1024, fma, one, alt);
    }
    _tile_release();
}
