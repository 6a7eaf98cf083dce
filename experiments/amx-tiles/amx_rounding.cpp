// Can the engine's float32 multiply-adds compute exactly what AMX's tdpbf16ps computes? If they
// could, the engine could use the tiles for many rows and multiply-adds for one with the same
// numbers (exact mode and batch independence need one result whatever the call). 2,000 random
// products y (16 x 16) = b + x (16 x 128, bf16) @ W (128 x 16, bf16) on the tiles, each output
// compared bit for bit with emulations of the sum: in order with fused multiply-adds (what the
// engine does), by pairs of products, and by each tile step's 32 products summed exactly.
//   g++ -O2 -march=native -ffp-contract=off experiments/amx-tiles/amx_rounding.cpp -o amx_rounding && ./amx_rounding; rm -f amx_rounding
#include <cmath>
#include <random>

#include "amx_tiles.h"

static const int K = 128, N = 16, M = 16;
static float bf(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; std::memcpy(&f, &u, 4); return f; }
static uint16_t to_bf(float x) { uint32_t u; std::memcpy(&u, &x, 4); return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16); }

int main() {
    if (!amx_tiles_ready()) return 0;
    std::mt19937 g(1);
    std::normal_distribution<float> nd(0, 1);
    alignas(64) uint16_t A[M * K], B[K * N];
    alignas(64) float C[M * N];
    float W[K * N], bias[N];
    long fma_order = 0, pairs = 0, steps_exact = 0, total = 0;
    for (int trial = 0; trial < 2000; trial++) {
        for (int i = 0; i < M * K; i++) A[i] = to_bf(nd(g) * (trial % 3 ? 1.f : 30.f));
        for (int i = 0; i < K * N; i++) W[i] = bf(to_bf(nd(g) * 0.1f));
        for (int n = 0; n < N; n++) bias[n] = nd(g);
        for (int kk = 0; kk < K / 2; kk++)  // B tile rows: pairs of inputs side by side per column
            for (int n = 0; n < N; n++) {
                B[(kk * N + n) * 2] = to_bf(W[(2 * kk) * N + n]);
                B[(kk * N + n) * 2 + 1] = to_bf(W[(2 * kk + 1) * N + n]);
            }
        for (int r = 0; r < M; r++) for (int n = 0; n < N; n++) C[r * N + n] = bias[n];
        _tile_loadd(0, C, N * 4);
        for (int k = 0; k < K; k += 32) {
            _tile_loadd(1, A + k, K * 2);
            _tile_loadd(2, B + (k / 2) * N * 2, 64);
            _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, C, N * 4);
        for (int r = 0; r < M; r++)
            for (int n = 0; n < N; n++) {
                float s = bias[n], p = bias[n], e = bias[n];
                for (int k = 0; k < K; k++) s = std::fmaf(bf(A[r * K + k]), W[k * N + n], s);
                for (int k = 0; k < K; k += 2) p = p + (bf(A[r * K + k]) * W[k * N + n] + bf(A[r * K + k + 1]) * W[(k + 1) * N + n]);
                for (int k0 = 0; k0 < K; k0 += 32) {
                    double step = 0;
                    for (int k = k0; k < k0 + 32; k++) step += (double)bf(A[r * K + k]) * W[k * N + n];
                    e = e + (float)step;
                }
                const float y = C[r * N + n];
                fma_order += s == y; pairs += p == y; steps_exact += e == y; total++;
            }
    }
    _tile_release();
    printf("| emulation of tdpbf16ps | outputs bit for bit equal |\n|---|---|\n");
    printf("| in order, fused multiply-adds (the engine) | %ld of %ld (%.0f%%) |\n", fma_order, total, 100.0 * fma_order / total);
    printf("| by pairs of products | %ld of %ld (%.0f%%) |\n", pairs, total, 100.0 * pairs / total);
    printf("| each step's 32 products summed exactly, then added | %ld of %ld (%.0f%%) |\n", steps_exact, total, 100.0 * steps_exact / total);
}
