// Does the processor's bf16 dot product (vdpbf16ps, AVX512_BF16) make the engine's matrix
// products faster than widening bf16 weights to float32 and using fused multiply-adds?
// One thread; a tile of NR rows x NC panels of 16 columns over K = 512 inputs, as engine.cpp's
// lin_rows, and a bare loop of 16 independent instructions of each kind (their throughput).
//   g++ -O3 -march=native -std=c++17 dot_vs_fma.cpp -o dot_vs_fma && ./dot_vs_fma; rm -f dot_vs_fma
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

static const int K = 512;
#include "../engine_kernel.h"  // fma_tile, best_ns

template <int NR, int NC>  // bf16 inputs in pairs, vdpbf16ps: 32 multiply-adds an instruction
static void dot_tile(const uint16_t* x, const uint16_t* W, float* y) {
    __m512 acc[NR][NC] = {};
    for (int k = 0; k < K; k += 2) {
        __m512bh w[NC];
        for (int c = 0; c < NC; c++) w[c] = (__m512bh)_mm512_loadu_si512(W + (c * K + k) * 16);
        for (int r = 0; r < NR; r++) {
            int32_t pair;
            std::memcpy(&pair, x + r * K + k, 4);
            __m512bh xs = (__m512bh)_mm512_set1_epi32(pair);
            for (int c = 0; c < NC; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xs, w[c]);
        }
    }
    for (int r = 0; r < NR; r++) for (int c = 0; c < NC; c++) _mm512_storeu_ps(y + (r * NC + c) * 16, acc[r][c]);
}

template <int NR, int NC> static void tile_row() {
    std::vector<float> x(NR * K, 0.5f), y(NR * NC * 16);
    std::vector<uint16_t> xb(NR * K, 0x3f00), W(NC * K * 16, 0x3e80);
    double f = best_ns([&] { fma_tile<NR, NC>(x.data(), W.data(), y.data(), NC * 16); });
    double d = best_ns([&] { dot_tile<NR, NC>(xb.data(), W.data(), y.data()); });
    double flop = 2.0 * NR * NC * 16 * K;
    printf("| tile %dx%d | %.0f | %.0f | %.0f | %.0f | %.2f |\n", NR, NC, f, flop / f, d, flop / d, f / d);
}

int main() {
    printf("| kernel (K = 512, 1 thread) | fma ns | fma GFLOP/s | dot ns | dot GFLOP/s | fma time / dot time |\n|---|---|---|---|---|---|\n");
    tile_row<8, 2>();
    tile_row<4, 4>();
    tile_row<1, 4>();
    // bare instruction throughput: 16 independent accumulators, 4096 steps
    __m512 a[16];
    for (auto& v : a) v = _mm512_set1_ps(1.f);
    __m512 m = _mm512_set1_ps(0.999f);
    __m512bh p = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    const int steps = 4096;
    double f = best_ns([&] {
        for (int s = 0; s < steps; s++) for (int i = 0; i < 16; i++) a[i] = _mm512_fmadd_ps(a[i], m, m);
        asm volatile("" : "+m"(a));
    }, 2000);
    double d = best_ns([&] {
        for (int s = 0; s < steps; s++) for (int i = 0; i < 16; i++) a[i] = _mm512_dpbf16_ps(a[i], p, p);
        asm volatile("" : "+m"(a));
    }, 2000);
    printf("\nbare instructions: vfmadd231ps zmm %.3f ns each (%.0f GFLOP/s), vdpbf16ps zmm %.3f ns each (%.0f GFLOP/s)\n",
           f / (steps * 16), 32.0 * steps * 16 / f, d / (steps * 16), 64.0 * steps * 16 / d);
}
