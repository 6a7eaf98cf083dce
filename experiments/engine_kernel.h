// What the engine-kernel benchmarks in experiments/*/ share: engine.cpp's way of multiplying by
// bf16 weights (widened to float32, fused multiply-adds; panels of 16 columns, K x 16 each) and a
// best-of-N timer. Include it from a benchmark that defines K, its inputs per row.
#pragma once
#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdint>

// y[r, 16c : 16c + 16] (rows ldy apart) = x[r, 0:K] @ W[0:K, panel c] for NR rows and NC panels
template <int NR, int NC>
static void fma_tile(const float* x, const uint16_t* W, float* y, int ldy) {
    __m512 acc[NR][NC] = {};
    for (int k = 0; k < K; k++) {
        __m512 w[NC];
        for (int c = 0; c < NC; c++)
            w[c] = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(W + ((size_t)c * K + k) * 16))), 16));
        for (int r = 0; r < NR; r++) {
            __m512 xs = _mm512_set1_ps(x[r * K + k]);
            for (int c = 0; c < NC; c++) acc[r][c] = _mm512_fmadd_ps(xs, w[c], acc[r][c]);
        }
    }
    for (int r = 0; r < NR; r++) for (int c = 0; c < NC; c++) _mm512_storeu_ps(y + r * ldy + c * 16, acc[r][c]);
}

// the fastest of reps runs of f, in ns
template <class F> static double best_ns(F f, int reps = 20000) {
    double best = 1e18;
    for (int i = 0; i < reps; i++) {
        auto t0 = std::chrono::steady_clock::now();
        f();
        best = std::min(best, std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
}
