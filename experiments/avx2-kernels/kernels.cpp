// Microbenchmark of the engine's linear-layer and attention kernels on one thread: the engine
// source named by -DENGINE_SOURCE is included whole (its kernels are static functions). Prints
// one line of microseconds: linear (K x N, n rows, bf16 then float32 weights), then attention
// (one head of width 32, n queries over a window of 250 keys, bf16 then float32 keys and values).
#include ENGINE_SOURCE
#include <chrono>
#include <cstdio>
#include <vector>

template <typename F>
static double best_us(F f, int reps) {  // the fastest of 10 rounds
    double best = 1e9;
    for (int round = 0; round < 10; round++) {
        auto t0 = std::chrono::steady_clock::now();
        for (int r = 0; r < reps; r++) f();
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
        best = us < best ? us : best;
    }
    return best;
}

int main() {
    srand(0);
    const int shapes[2][2] = {{128, 512}, {512, 128}}, rows[] = {1, 2, 4, 7};
    std::vector<float> x(16 * 512), y(16 * 512), b(512, 0.1f), Wf(512 * 512);
    std::vector<uint16_t> Wb(512 * 512);
    for (auto& v : x) v = (rand() % 100) / 100.f;
    for (size_t i = 0; i < Wf.size(); i++) { Wf[i] = (rand() % 100) / 100.f; Wb[i] = 0x3f80 + rand() % 64; }
    for (int bf = 1; bf >= 0; bf--)
        for (auto& s : shapes)
            for (int n : rows) {
                const int K = s[0], N = s[1];
                const size_t panel = (size_t)K * 16;
                printf("%.2f ", best_us([&] {
                    if (bf) lin_range(x.data(), K, n, Wb.data(), panel, 0, N, b.data(), y.data(), N, K);
                    else lin_range(x.data(), K, n, Wf.data(), panel, 0, N, b.data(), y.data(), N, K);
                }, 2000));
            }
    const int hd = 32, keys = 250;
    std::vector<float> q(MAXK * 128), out(MAXK * 128), sc(MAXK * 1024), Kf(512 * hd), Vf(512 * hd);
    std::vector<uint16_t> Kb(512 * hd), Vb(512 * hd), probs(MAXK * 1024);
    for (auto& v : q) v = (rand() % 100) / 100.f;
    for (size_t i = 0; i < Kf.size(); i++) { Kf[i] = Vf[i] = (rand() % 100) / 100.f; Kb[i] = Vb[i] = 0x3f80 + rand() % 64; }
    for (int bf = 1; bf >= 0; bf--)
        for (int n : rows) {
            int lo[MAXK], hi[MAXK];
            for (int i = 0; i < n; i++) { lo[i] = 0; hi[i] = keys - n + i; }
            printf("%.2f ", best_us([&] {
                if (bf) attend<uint16_t>(q.data(), 128, n, lo, hi, Kb.data(), Vb.data(), hd, out.data(), 128, sc.data(), probs.data(), false);
                else attend<float>(q.data(), 128, n, lo, hi, Kf.data(), Vf.data(), hd, out.data(), 128, sc.data(), probs.data(), false);
            }, 2000));
        }
    printf("\n");
}
