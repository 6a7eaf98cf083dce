// One attention head's work in the engine (engine.cpp's attend: scores, softmax, weighted sums),
// for g queries over a window of 208 keys (a window's average span in whole 32-key steps) with
// bf16 keys and values, on the tiles and with the float32 multiply-adds: the best of 20 runs of
// 2,000 heads. "cache": 4 heads' keys and values, cycled (they stay in L1/L2); "beyond L2": 1,000
// heads' (26 MB), as at batch 16 and up, where each call reads every image's windows.
//   g++ -O3 -march=native -fopenmp -std=c++17 experiments/attention-on-tiles/one_head.cpp -o one_head && taskset -c 1 ./one_head; rm -f one_head
#include "../../sr_blockwise/engine.cpp"
#include <chrono>
#include <cstdio>
#include <vector>

static double head_us(int g, int heads, bool tiles) {
    const int hd = 32, CL = 576, cnt = 208;
    std::vector<uint16_t> K((size_t)heads * CL * hd), V((size_t)heads * CL * hd);
    for (size_t i = 0; i < K.size(); i++) { K[i] = 0x3c00 + (i * 7 % 200); V[i] = 0x3c00 + (i * 13 % 200); }
    std::vector<float> q(16 * 3 * 128), out(16 * 128);
    for (size_t i = 0; i < q.size(); i++) q[i] = (float)((i * 37) % 100) / 100.f;
    float* scores = (float*)std::aligned_alloc(64, 16 * 640 * 4);
    uint16_t* probs = (uint16_t*)std::aligned_alloc(64, 16 * 640 * 2);
    int lo[16], hi[16];
    for (int i = 0; i < g; i++) { lo[i] = 128; hi[i] = 128 + cnt - g + i; }  // consecutive queries of one block
    amx_call_start();
    double best = 1e9;
    for (int rep = 0; rep < 20; rep++) {
        const int N = 2000;
        auto t0 = std::chrono::steady_clock::now();
        for (int it = 0; it < N; it++) {
            const size_t h = (size_t)(it % heads) * CL * hd;
            attend<uint16_t>(q.data(), 3 * 128, g, lo, hi, K.data() + h, V.data() + h, hd, out.data(), 128, scores,
                             probs, tiles);
        }
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / N;
        best = us < best ? us : best;
    }
    amx_call_end();
    std::free(scores);
    std::free(probs);
    return best;
}

int main() {
    if (!engine_amx()) { std::printf("no AMX tiles on this processor (or the kernel refused them)\n"); return 1; }
    std::printf("| queries | keys and values | multiply-adds (us a head) | tiles (us a head) |\n|---|---|---|---|\n");
    for (int g : {1, 2, 4, 7})
        for (int heads : {4, 1000})
            std::printf("| %d | %s | %.3f | %.3f |\n", g, heads == 4 ? "cache" : "beyond L2", head_us(g, heads, false),
                        head_us(g, heads, true));
}
