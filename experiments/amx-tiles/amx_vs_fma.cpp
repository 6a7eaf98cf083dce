// Would the processor's AMX tiles make a verify call's matrix products cost about what a 1-token
// call's do? One thread; y (R x 128) = x (R x 512) @ W (512 x 128), bf16 weights as the engine
// keeps them: the engine's way (weights widened, float32 fused multiply-adds, tiles of 8 rows x 32
// columns, or 1 row x 64 columns) against AMX (x rounded to bf16, 16-row tiles, tdpbf16ps).
//   g++ -O3 -march=native -std=c++17 experiments/amx-tiles/amx_vs_fma.cpp -o amx_vs_fma && ./amx_vs_fma; rm -f amx_vs_fma
#include <cstdlib>

#include "amx_tiles.h"  // amx_tiles_ready

static const int K = 512, N = 128;
#include "../engine_kernel.h"  // fma_tile, best_ns

// AMX: C tiles 0-3 (16 x 16 float32, four panels), A tile 4 (16 rows x 32 bf16 inputs), B tiles
// 5-7 in turn (16 pairs of inputs x 16 columns x 2: a panel's 32 inputs, pairs side by side; with
// two B tiles in turn instead of three a product took 1.6x as long)
static void amx_rows(const uint16_t* xb, const uint16_t* Wp, float* y) {
    for (int p = 0; p < N / 16; p += 4) {
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int k = 0; k < K; k += 32) {
            _tile_loadd(4, xb + k, K * 2);
            _tile_loadd(5, Wp + ((size_t)(p + 0) * K + k) * 16, 64); _tile_dpbf16ps(0, 4, 5);
            _tile_loadd(6, Wp + ((size_t)(p + 1) * K + k) * 16, 64); _tile_dpbf16ps(1, 4, 6);
            _tile_loadd(7, Wp + ((size_t)(p + 2) * K + k) * 16, 64); _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(5, Wp + ((size_t)(p + 3) * K + k) * 16, 64); _tile_dpbf16ps(3, 4, 5);
        }
        _tile_stored(0, y + (p + 0) * 16, N * 4); _tile_stored(1, y + (p + 1) * 16, N * 4);  // tile numbers
        _tile_stored(2, y + (p + 2) * 16, N * 4); _tile_stored(3, y + (p + 3) * 16, N * 4);  // are constants
    }
}

template <class T> struct Aligned {  // 64-byte aligned, as torch's tensors are (tile loads of
    T* p;                            // unaligned rows took 2.9x as long)
    explicit Aligned(size_t n, T v) : p((T*)std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64)) { std::fill(p, p + n, v); }
    ~Aligned() { std::free(p); }
    T* data() { return p; }
};

int main() {
    Aligned<float> x(16 * K, 0.5f), y(16 * N, 0.f);
    Aligned<uint16_t> xb(16 * K, 0x3f00), W(K * N, 0x3e80);
    const double flop1 = 2.0 * K * N;
    printf("| y = x @ W, K %d, N %d, 1 thread | ns | GFLOP/s |\n|---|---|---|\n", K, N);
    double f1 = best_ns([&] { fma_tile<1, 4>(x.data(), W.data(), y.data(), N); fma_tile<1, 4>(x.data(), W.data() + 4 * K * 16, y.data() + 64, N); });
    printf("| 1 row, float32 multiply-adds (1 x 64 tiles) | %.0f | %.0f |\n", f1, flop1 / f1);
    double f7 = best_ns([&] { for (int c = 0; c < N / 32; c++) fma_tile<7, 2>(x.data(), W.data() + (size_t)c * 2 * K * 16, y.data() + c * 32, N); });
    printf("| 7 rows, float32 multiply-adds (8 x 32 tiles) | %.0f | %.0f |\n", f7, 7 * flop1 / f7);
    double f16 = best_ns([&] { for (int r = 0; r < 16; r += 8) for (int c = 0; c < N / 32; c++) fma_tile<8, 2>(x.data() + r * K, W.data() + (size_t)c * 2 * K * 16, y.data() + r * N + c * 32, N); });
    printf("| 16 rows, float32 multiply-adds (8 x 32 tiles) | %.0f | %.0f |\n", f16, 16 * flop1 / f16);
    if (!amx_tiles_ready()) return 0;
    double a16 = best_ns([&] { amx_rows(xb.data(), W.data(), y.data()); });
    printf("| 16 rows (or fewer, padded), AMX tdpbf16ps | %.0f | %.0f |\n", a16, 16 * flop1 / a16);
    _tile_release();
    printf("\n7 rows cost %.1fx 1 row with multiply-adds; with AMX 1 to 16 rows cost %.2fx the multiply-adds' 1 row\n",
           f7 / f1, a16 / f1);
}
