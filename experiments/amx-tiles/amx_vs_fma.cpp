// Would the processor's AMX tiles make a verify call's matrix products cost about what a 1-token
// call's do? One thread; y (R x 128) = x (R x 512) @ W (512 x 128), bf16 weights as the engine
// keeps them: the engine's way (weights widened, float32 fused multiply-adds, tiles of 8 rows x 32
// columns, or 1 row x 64 columns) against AMX (x rounded to bf16, 16-row tiles, tdpbf16ps).
//   g++ -O3 -march=native -std=c++17 experiments/amx-tiles/amx_vs_fma.cpp -o amx_vs_fma && ./amx_vs_fma; rm -f amx_vs_fma
#include <cstdlib>

#include "amx_tiles.h"  // amx_tiles_ready, amx_product

static const int K = 512, N = 128;
#include "../engine_kernel.h"  // fma_tile, best_ns

template <class T> struct Aligned {  // 64-byte aligned, as torch's tensors are (tile loads
    T* p;                            // want rows 64 bytes apart)
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
    double a16 = best_ns([&] { amx_product(xb.data(), W.data(), y.data(), K, N); });
    printf("| 16 rows (or fewer, padded), AMX tdpbf16ps | %.0f | %.0f |\n", a16, 16 * flop1 / a16);
    _tile_release();
    printf("\n7 rows cost %.1fx 1 row with multiply-adds; with AMX 1 to 16 rows cost %.2fx the multiply-adds' 1 row\n",
           f7 / f1, a16 / f1);
}
