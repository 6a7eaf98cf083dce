// One decoding call of the Image Transformer as a single native function, for sr_blockwise.engine.
//
// Why native: at these model sizes (d = 128, 4 layers) a call is ~1.5M multiply-adds per token,
// microseconds of arithmetic, while PyTorch spends milliseconds launching its ~1,300 operations.
// Here a call is one function: the decoder step for every token of the block, p1's logits, the
// acceptance rule, the commit, and the next block's proposals, for every live image of a batch.
//
// Why exact: every token's (row's) arithmetic is the same sequence of float operations whatever
// call it comes in and whatever else is in the batch. A linear layer accumulates each output over
// its inputs in order (tiles of rows only share the weight loads), with float32 multiply-adds or,
// for bfloat16 weights on a processor with AMX, on its tiles, whose every output row reads only
// its own input row (see amx_range); attention reads a query's own window [block start of the
// previous block, the query] in position order (on the tiles too: attend_group_tiles). So a
// query's state is bit for bit the same alone (greedy) or inside a k-token verify call, and exact
// mode equals greedy decoding by construction.
//
// Layouts (row-major; float32 but for bfloat16 weight matrices, keys and values: see Mat and
// Engine): a linear layer's weight is stored transposed, in x out, so a tile of rows streams it
// once; a layer's keys and values are per image and attention head (key_at, value_at).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
#include <omp.h>
#include <x86intrin.h>
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#define ENGINE_AMX 1
#else
#define ENGINE_AMX 0
#endif

// 16 floats: one AVX-512 register. Without AVX-512 (F, BW and VL: an AVX2 processor) a v16 is
// two 8-float vectors in two registers: GCC keeps a 64-byte vector type it has no register for in
// memory, 16 bytes a move (calls several times slower). The few AVX-512 instructions used have
// portable equivalents there (the #else branches) doing the same operations in the same order.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define ENGINE_AVX512 1
#else
#define ENGINE_AVX512 0
#endif
#if ENGINE_AVX512
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
static inline v16 splat(float x) { return (v16)_mm512_set1_ps(x); }
static inline v16 select(v16i m, v16 a, v16 b) { return m ? a : b; }
#define sum_of(x) _mm512_reduce_add_ps((__m512)(x))  // a macro: the instructions stay as they were written inline
static inline float max_lane(v16 x) { return _mm512_reduce_max_ps((__m512)x); }
#else
typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));
struct v16 {
    v8 lo, hi;
    float operator[](int i) const { return i < 8 ? lo[i] : hi[i - 8]; }
};
struct v16i { v8i lo, hi; };
// loads and stores one 8-lane vector at a time: GCC copied a memcpy into a v16, or into an array
// of v8i, through the stack 16 bytes at a time, and each wide read of those stalled on the narrow
// stores before it (every kernel ran several times slower: experiments/avx2-kernels/)
static inline v8 ld8(const float* p) { v8 v; std::memcpy(&v, p, 32); return v; }
static inline void st8(float* p, v8 v) { std::memcpy(p, &v, 32); }
static inline v8i ld8i(const void* p) { v8i v; std::memcpy(&v, p, 32); return v; }
static inline v8 splat8(float x) { return v8{x, x, x, x, x, x, x, x}; }
// 8 pairs of bfloat16 at p as two 8-float vectors: each pair's first values, then its second (see ld_pairs)
static inline void ld_pairs8(const uint16_t* p, v8& first, v8& second) {
    const v8i u = ld8i(p);
    first = (v8)(u << 16);
    second = (v8)(u & (int)0xffff0000u);
}
// always inlined: a multiply and an add are fused into one multiply-add only where both are in
// one function, and a row's arithmetic must be the same in every kernel it passes through
#define V16_INLINE static inline __attribute__((always_inline))
#define V16_ARITHMETIC(op)                                                                                   \
    V16_INLINE v16 operator op(v16 a, v16 b) { return {a.lo op b.lo, a.hi op b.hi}; }                      \
    V16_INLINE v16 operator op(v16 a, float b) { return {a.lo op b, a.hi op b}; }                          \
    V16_INLINE v16 operator op(float a, v16 b) { return {a op b.lo, a op b.hi}; }                          \
    V16_INLINE void operator op##=(v16& a, v16 b) { a.lo op##= b.lo; a.hi op##= b.hi; }                    \
    V16_INLINE void operator op##=(v16& a, float b) { a.lo op##= b; a.hi op##= b; }
V16_ARITHMETIC(+) V16_ARITHMETIC(-) V16_ARITHMETIC(*) V16_ARITHMETIC(/)
#define V16_COMPARE(op)                                                                                      \
    V16_INLINE v16i operator op(v16 a, v16 b) { return {a.lo op b.lo, a.hi op b.hi}; }                     \
    V16_INLINE v16i operator op(v16 a, float b) { return {a.lo op b, a.hi op b}; }
V16_COMPARE(<) V16_COMPARE(>)
V16_INLINE v16 operator-(v16 a) { return {-a.lo, -a.hi}; }
V16_INLINE v16 splat(float x) { const v8 v = splat8(x); return {v, v}; }
V16_INLINE v16 select(v16i m, v16 a, v16 b) { return {m.lo ? a.lo : b.lo, m.hi ? a.hi : b.hi}; }
// _mm512_reduce_add_ps's tree: halves added, then quarters, eighths, the last pair
static inline float sum_of(v16 x) {
    const v8 a = x.hi + x.lo;
    float b[4];
    for (int i = 0; i < 4; i++) b[i] = a[i + 4] + a[i];
    return (b[2] + b[0]) + (b[3] + b[1]);
}
static inline float max_lane(v16 x) {
    float m = x[0];
    for (int i = 1; i < 16; i++) m = x[i] > m ? x[i] : m;
    return m;
}
// lanes l with j + l < cnt: a window's first cnt values, 16 at a time from j
static inline v16i lanes_below(int j, int cnt) {
    const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
    return {lane + j < cnt, lane + (j + 8) < cnt};
}
#endif
#if ENGINE_AVX512
static inline v16 ld(const float* p) { v16 v; std::memcpy(&v, p, 64); return v; }
static inline void st(float* p, v16 v) { std::memcpy(p, &v, 64); }
#else
V16_INLINE v16 ld(const float* p) { return {ld8(p), ld8(p + 8)}; }
V16_INLINE void st(float* p, v16 v) { st8(p, v.lo); st8(p + 8, v.hi); }
#endif

// e^x for x <= 88, ~1 ulp: 2^n * e^r with |r| <= ln2/2 and a degree-6 polynomial
static inline v16 vexp(v16 x) {
    x = select(x < -87.f, splat(-87.f), x);
    v16 t = x * 1.44269504088896341f;
#if ENGINE_AVX512
    v16 n = (v16)_mm512_roundscale_ps((__m512)t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#elif defined(__AVX__)
    const int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    v16 n = {(v8)_mm256_round_ps((__m256)t.lo, nearest), (v8)_mm256_round_ps((__m256)t.hi, nearest)};
#else  // no AVX, no fused multiply-add to fold t's product into: nearest, ties to even, |t| < 2^22
    v16 n = (t + 12582912.f) - 12582912.f;
#endif
    v16 r = x - n * 0.693359375f + n * 2.12194440e-4f;
    v16 p = splat(1.f / 720);
    p = p * r + 1.f / 120; p = p * r + 1.f / 24; p = p * r + 1.f / 6; p = p * r + 0.5f; p = p * r + 1.f; p = p * r + 1.f;
#if ENGINE_AVX512
    return (v16)_mm512_scalef_ps((__m512)p, (__m512)n);  // p 2^n, exact
#else
    // p 2^n, 2^n made from its bits: exact for -126 <= n <= 0, every lane whose e^x is used
    // (a softmax's lanes past its window, discarded, may hold anything)
    return p * v16{(v8)((__builtin_convertvector(n.lo, v8i) + 127) << 23),
                   (v8)((__builtin_convertvector(n.hi, v8i) + 127) << 23)};
#endif
}

static const int S = 3072;  // target tokens
static const int V = 256;   // intensities
static const int MAXK = 16; // tokens per call at most

// A weight matrix W (rows = inputs, columns = outputs) in panels of 16 columns, each panel rows x
// 16 contiguous: a tile of rows streams a few panels front to back (a prefetcher's easy case).
// Float32, or bfloat16 where every entry is a bfloat16 value already (weights trained in bf16 and
// exported at full precision): the same numbers in half the bytes. For the multiply-adds
// (bf16 1) bfloat16 panels go in pairs, interleaved: input k of the pair is 32 values, column j of
// the first panel, then of the second, so one 64-byte load and one instruction a panel widen them
// (see lin_rows). For AMX's tiles (bf16 2) a panel's inputs go in pairs instead (see amx_range).
struct Mat {
    const void* p;
    int bf16, rows;  // bf16: 0 float32, 1 bf16 panel pairs, 2 bf16 panels for the tiles
    Mat at(int col) const {  // the matrix from column `col` (a multiple of 32) on
        return {(const char*)p + (size_t)(col / 16) * rows * 16 * (bf16 ? 2 : 4), bf16, rows};
    }
};
struct Layer {
    const float *ln1_w, *ln1_b, *qkv_b, *out_b, *ln2_w, *ln2_b, *cq_b, *cout_b, *ln3_w, *ln3_b, *up_b, *down_b;
    Mat qkv_w, out_w, cq_w, cout_w, up_w, down_w;
};

struct Engine {
    int d, H, L, ff, n_layers, G, f;  // G head groups (heads 2..K), f hidden width per group
    int has_lr_prior, has_nbr_prior, nbr_draft;
    const Layer* layers;
    const float *tgt_emb, *dec_ln_w, *dec_ln_b;
    Mat lm_w;                                  // (d, 256)
    Mat heads_up_w, heads_down_w;              // (d, G*f); (G*f, G*d) nested (masked) and transposed
    const float *heads_up_b, *heads_down_b;    // (G*f), (G*d)
    const float *heads_ln_w, *heads_ln_b;      // (G, d)
    const float *lr_prior;   // (3, 511) log-prior over intensity - the input cell's intensity
    const float *nbr_prior;  // (K-1, refs, 3, 511)
    // per image
    int B, cache_len;
    // Keys and values are float32 (kv_bf16 0), or bfloat16 where the decoder layers' weights are
    // all bfloat16 (a decoder trained in bf16, whose keys and values were bf16 there too): half
    // the bytes to read, and reading them is most of an attention call (1.8 MB an image a call in
    // float32). kv_bf16 1: attention with float32 multiply-adds; 2: on AMX tiles (a head's width a
    // multiple of 32; see attend_group_tiles).
    int kv_bf16;
    // per layer: keys and values, cache_len * d / H of each an image and head, laid out as key_at
    // and value_at say. A ring: position p
    // lives in slot p mod 3L, and slots below L again at +3L, so every window (2 blocks from a
    // block start) is contiguous; 3 blocks suffice because a call writes at most MAXK < L ahead.
    void **k_cache, **v_cache;
    const void **enc_k, **enc_v;  // per layer: keys and values of the 192 encoder positions, as the caches
    int n_src;
    const float* pos_emb;  // (B, S, d): position (+ lr_skip) part of the decoder input
    const int32_t* cell;   // (B, S): the 8x8 input's intensity under each position
    float prior_weight;
    float guard, guard_slope;  // the cell guard on p1 (add_cell_guard; slope 0: off)
    float* work;  // workspace for B * MAXK rows (engine.py sizes it: work_floats)
    int threads;  // OpenMP threads a call runs on
    // sampling: Gumbel noise for each position's sure token (B, S, 256); speculative sampling
    // also the acceptance uniforms (B, S), the drafts' Gumbel noise (B, S, 256), and the logits
    // each image's current drafts were drawn from (B, MAXK - 1, 256)
    const float *noise_first, *noise_accept, *noise_draft;
    float* qlog;
    double* stage_ticks;  // where calls' time goes (see mark), or null
};

// Where a call's time goes (bench.call_breakdown): at the end of each stage (after its barrier,
// so the whole team is done) the team's first thread adds the processor's cycle count since its
// previous mark to the stage's total. A few reads of the counter a call; off when stage_ticks is
// null.
enum Stage { ST_EMBED, ST_QKV, ST_KV_WRITE, ST_SELF_ATT, ST_CROSS_ATT, ST_LINEAR, ST_NORM_GELU, ST_LOGITS,
             ST_ACCEPT, ST_DRAFT, N_STAGES };
static inline void mark(const Engine* E, int stage) {  // stage -1: a call's start
    static thread_local unsigned long long last = 0;
    if (!E->stage_ticks || omp_get_thread_num() != 0 || omp_get_ancestor_thread_num(1) > 0) return;
    const unsigned long long t = __rdtsc();
    if (stage >= 0) E->stage_ticks[stage] += (double)(t - last);
    last = t;
}

// ---------------------------------------------------------------- kernels

// 16 pairs of bfloat16 (32 values) as two float32 vectors, each pair's first values, then its
// second: exact, a bfloat16 being a float32's high half (`<< 16` for the low halves, masking for
// the high ones: one instruction each)
static inline void ld_pairs(const uint16_t* p, v16& first, v16& second) {
#if ENGINE_AVX512
    const __m512i u = _mm512_loadu_si512(p);
    first = (v16)_mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
    second = (v16)_mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32((int)0xffff0000u)));
#else
    ld_pairs8(p, first.lo, second.lo);
    ld_pairs8(p + 16, first.hi, second.hi);
#endif
}
// 16 floats (as bits) rounded to bfloat16, nearest, ties to even, as torch's .to(torch.bfloat16)
// rounds (the encoder's keys and values, which the decoder's must match)
#if ENGINE_AVX512
static inline __m256i round_bf16(__m512i u) {
    const __m512i half = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    return _mm512_cvtepi32_epi16(
        _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16));
}
#else
static inline void round_bf16(v16 x, uint16_t out[16]) {
    for (int h = 0; h < 2; h++) {
        const v8u u = (v8u)(h ? x.hi : x.lo), r = (u + (0x7fffu + ((u >> 16) & 1u))) >> 16;
        for (int i = 0; i < 8; i++) out[8 * h + i] = (uint16_t)r[i];
    }
}
#endif

// y[r, 0:16*NC] = b + x[r, 0:K] @ W[0:K, 0:16*NC] for NR rows (W: NC panels, `panel` elements
// apart; odd: a lone bf16 panel that is the second of its pair). Each output is accumulated over k
// in order, one multiply-add at a time, so a row's result does not depend on the rows beside it,
// on NR or on NC (the tiles only share the weight loads). Bfloat16 weights are widened, not
// multiplied with the processor's bf16 dot product: on the machine this was measured on, that
// instruction did half the float32 multiply-add rate (experiments/bf16-dot-products/). A pair of
// bf16 panels is one load: as 16 32-bit lanes, lane j holds column j of the first panel in its
// low half and of the second in its high half, so `<< 16` gives the first panel's floats and
// masking the low half off the second's (one instruction each, where widening 16 values by
// zero-extension and a shift took two).
#if !ENGINE_AVX512
// the same sums in 8-float registers: GCC keeps an array of v8 in registers, not one of v16 structs
// (nor one whose elements' addresses are taken)
template <int NR, int NC, typename WT>
static void lin_rows(const float* x, int ldx, const WT* W, size_t panel, const float* b, float* y, int ldy, int K,
                     int odd) {
    v8 acc[NR][2 * NC];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < 2 * NC; c++) acc[r][c] = b ? ld8(b + 8 * c) : v8{};
    for (int k = 0; k < K; k++) {
        v8 w[2 * NC];
        if constexpr (sizeof(WT) == 2) {
            for (int c = 0; c < NC; c += 2) {
                for (int h = 0; h < 2; h++) {
                    v8 first, second;
                    ld_pairs8(W + c * panel + (size_t)k * 32 + 16 * h, first, second);
                    w[2 * c + h] = NC == 1 && odd ? second : first;
                    if (c + 1 < NC) w[2 * c + 2 + h] = second;
                }
            }
        } else {
            for (int c = 0; c < 2 * NC; c++) w[c] = ld8(W + (c / 2) * panel + (size_t)k * 16 + 8 * (c % 2));
        }
        for (int r = 0; r < NR; r++) {
            const v8 xs = splat8(x[(size_t)r * ldx + k]);
            for (int c = 0; c < 2 * NC; c++) acc[r][c] += xs * w[c];
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < 2 * NC; c++) st8(y + (size_t)r * ldy + 8 * c, acc[r][c]);
}
#else
template <int NR, int NC, typename WT>
static void lin_rows(const float* x, int ldx, const WT* W, size_t panel, const float* b, float* y, int ldy, int K,
                     int odd) {
    v16 acc[NR][NC];
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) acc[r][c] = b ? ld(b + 16 * c) : splat(0.f);
    for (int k = 0; k < K; k++) {
        v16 w[NC];
        if constexpr (sizeof(WT) == 2) {
            for (int c = 0; c < NC; c += 2) {
                v16 first, second;
                ld_pairs(W + c * panel + (size_t)k * 32, first, second);
                w[c] = NC == 1 && odd ? second : first;
                if (c + 1 < NC) w[c + 1] = second;
            }
        } else {
            for (int c = 0; c < NC; c++) w[c] = ld(W + c * panel + (size_t)k * 16);
        }
        for (int r = 0; r < NR; r++) {
            v16 xs = splat(x[(size_t)r * ldx + k]);
            for (int c = 0; c < NC; c++) acc[r][c] += xs * w[c];
        }
    }
    for (int r = 0; r < NR; r++)
        for (int c = 0; c < NC; c++) st(y + (size_t)r * ldy + 16 * c, acc[r][c]);
}
#endif

// the last m < M + 1 rows of a column block (the tile of exactly m rows)
template <int M, int NC, typename WT>
static void lin_rest(int m, const float* x, int ldx, const WT* W, size_t panel, const float* b, float* y, int ldy,
                     int K, int odd) {
    if constexpr (M >= 1) {
        if (m == M) lin_rows<M, NC>(x, ldx, W, panel, b, y, ldy, K, odd);
        else lin_rest<M - 1, NC>(m, x, ldx, W, panel, b, y, ldy, K, odd);
    }
}

// n rows through one column block of NC panels: tiles of RT rows, then the rest
template <int RT, int NC, typename WT>
static void lin_block(const float* x, int ldx, int n, const WT* W, size_t panel, const float* b, float* y, int ldy,
                      int K, int odd = 0) {
    int r = 0;
    for (; r + RT <= n; r += RT) lin_rows<RT, NC>(x + (size_t)r * ldx, ldx, W, panel, b, y + (size_t)r * ldy, ldy, K, odd);
    lin_rest<RT - 1, NC>(n - r, x + (size_t)r * ldx, ldx, W, panel, b, y + (size_t)r * ldy, ldy, K, odd);
}

// columns [c0, c0 + nc) of y = b + x W for n rows, on the calling thread alone (c0 and nc
// multiples of 16), in tiles whose sums fit the registers. AVX-512 (32 registers): up to 4 rows,
// 4 panels (4 independent sums a row); more rows, 2 panels and 8 rows a tile, so a 7-token call
// reads each weight once; a lone panel last. AVX2 (16 registers of 8 floats): one row, 4 panels
// (8 sums); more rows, 2 panels and 2 rows a tile (8 sums, and bf16 weights' 4 widened vectors:
// with 3 rows their tiles spilled and took twice as long); a lone panel 6 rows a tile.
template <typename WT>
static void lin_range(const float* x, int ldx, int n, const WT* W, size_t panel, int c0, int nc, const float* b,
                      float* y, int ldy, int K) {
#if ENGINE_AVX512
    constexpr int one_row = 4, two_panel_rows = 8, one_panel_rows = 8;
#else
    constexpr int one_row = 1, two_panel_rows = 2, one_panel_rows = 6;
#endif
    for (int j0 = c0; j0 < c0 + nc;) {
        const int odd = sizeof(WT) == 2 && (j0 / 16) % 2;  // the second panel of a bf16 pair
        const WT* Wj = W + (j0 / 16 - odd) * panel;
        const float* bj = b ? b + j0 : nullptr;
        const int left = c0 + nc - j0;
        if (!odd && n <= one_row && left >= 64) {
            lin_block<one_row, 4>(x, ldx, n, Wj, panel, bj, y + j0, ldy, K);
            j0 += 64;
        } else if (!odd && left >= 32) {
            if (ENGINE_AVX512 && n <= 4) lin_block<4, 2>(x, ldx, n, Wj, panel, bj, y + j0, ldy, K);
            else lin_block<two_panel_rows, 2>(x, ldx, n, Wj, panel, bj, y + j0, ldy, K);
            j0 += 32;
        } else {
            lin_block<one_panel_rows, 1>(x, ldx, n, Wj, panel, bj, y + j0, ldy, K, odd);
            j0 += 16;
        }
    }
}

static void gelu(float* x, int n);

// y = b + x W[0:K, 0:N] for n rows, all rows through one column block before the next (the block
// of W stays in cache while every row uses it): blocks of 64 columns for up to 4 rows, of 32 for
// more. Called by a whole OpenMP team, the column blocks are shared out (orphaned `omp for`:
// outside a parallel region it runs them all). N a multiple of 16.
template <typename WT>
static void linear_t(const float* x, int ldx, int n, const WT* W, size_t panel, const float* b, float* y,
                     int ldy, int K, int N, bool then_gelu) {
    const int cw = n <= 4 ? 64 : 32, nb = (N + cw - 1) / cw;
    #pragma omp for schedule(static) nowait
    for (int blk = 0; blk < nb; blk++) {
        const int j0 = cw * blk, width = N - j0 < cw ? N - j0 : cw;
        lin_range(x, ldx, n, W, panel, j0, width, b, y, ldy, K);
        if (then_gelu)  // the thread that made the columns applies the activation: no barrier between
            for (int r = 0; r < n; r++) gelu(y + (size_t)r * ldy + j0, width);
    }
}
// ---------------------------------------------------------------- AMX

// 1 where this build has AMX and the kernel grants the process the tiles' state (engine.py then
// packs bfloat16 matrices for them, Mat.bf16 == 2), else 0
extern "C" int engine_amx() {
#if ENGINE_AMX
    static const int granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
    return granted;
#else
    return 0;
#endif
}

#if ENGINE_AMX
// With AMX, every bfloat16 matrix is multiplied on the tiles, in every call: tdpbf16ps multiplies
// a 16-row tile of bf16 inputs by 32 x 16 bf16 weights into float32 sums, and an output row reads
// only its own input row, so a row's result is the same in any tile, call or batch (exact mode
// and batch independence hold as with the multiply-adds), while a product over 1 to 16 rows costs
// what one row does: a verify call's extra tokens ride on the weight loads (at batch 1, where a
// call reads ~1.4 MB of weights and attention windows a core, a 1-token call took 9% longer on
// the tiles than with the multiply-adds: experiments/amx-tiles/). The inputs are
// rounded to bf16 first, as bf16 training (autocast) rounded them; the tiles' sums differ from
// the multiply-adds' in the last bits (experiments/amx-tiles/), so outputs differ between
// processors with and without AMX.

// A thread's bf16 copy of a product's inputs, 16-row tiles (rows past n are zeros or stale
// inputs: they only reach their own, discarded, output rows), and the tile rows it configured
struct AmxThread {
    uint16_t* p = nullptr;
    size_t cap = 0;
    int rows = 0;
    ~AmxThread() { std::free(p); }
};
static thread_local AmxThread amx_thread;

// The tiles' shapes are the thread's: A and C tiles as many rows as the product has (up to 16:
// fewer rows, less to load and store), B tiles 16 pairs of inputs x 16 columns. Set up again in
// every call (amx_call_start), as PyTorch's own AMX kernels (oneDNN) set theirs on the same
// threads between calls, within a call only when the rows change (a profile put about half of
// preparing a product's inputs in ldtilecfg), and released at the call's end (amx_call_end: no
// tile state for the kernel to save while the thread does other work).
static void configure_tiles(int rows) {
    if (amx_thread.rows == rows) return;
    struct { uint8_t palette, start; uint8_t reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } c;
    std::memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) { c.rows[t] = t < 4 ? rows : 16; c.colsb[t] = 64; }  // C 0-1, A 2-3, B 4-7
    // GCC (12) takes ldtilecfg for a reader of its first bytes only and, where this function is
    // not inlined, dropped the shapes' stores (a fault): the barrier says all of c is read
    __asm__ __volatile__("" : : "r"(&c) : "memory");
    _tile_loadconfig(&c);
    amx_thread.rows = rows;
}
#endif
// at the start and the end of a call, on each of its threads
static inline void amx_call_start() {
#if ENGINE_AMX
    amx_thread.rows = 0;
#endif
}
static inline void amx_call_end() {
#if ENGINE_AMX
    if (amx_thread.rows) _tile_release();
    amx_thread.rows = 0;
#endif
}
#if ENGINE_AMX

// x (n rows of K, stride ldx) rounded to bf16 (nearest, ties to even) in the thread's copy, rows
// ldb apart (K rounded up to 32, zeros after K; a multiple of 64 bytes, as tile loads want), and
// the tiles configured
static const uint16_t* rows_bf16(const float* x, int ldx, int n, int K, int* ldb) {
    configure_tiles(n < 1 ? 1 : n < 16 ? n : 16);  // 0 rows is no valid shape (a call with no image left)
    const int K32 = (K + 31) & ~31, ld = K32 * 2 % 4096 ? K32 : K32 + 32;  // rows not 4 KB apart (one cache set)
    const size_t need = (size_t)((n + 15) & ~15) * ld;
    AmxThread& a = amx_thread;
    if (a.cap < need) {
        std::free(a.p);
        a.p = (uint16_t*)std::aligned_alloc(64, need * 2);
        std::memset(a.p, 0, need * 2);
        a.cap = need;
    }
    for (int r = 0; r < n; r++) {
        uint16_t* out = a.p + (size_t)r * ld;
        for (int k = 0; k < K32; k += 16) {
            const __mmask16 in = k + 16 <= K ? 0xffff : k < K ? (__mmask16)((1u << (K - k)) - 1) : 0;
            _mm256_store_si256((__m256i*)(out + k), round_bf16(_mm512_castps_si512(_mm512_maskz_loadu_ps(in, x + (size_t)r * ldx + k))));
        }
    }
    *ldb = ld;
    return a.p;
}

// out (rows x 16 NP floats) = the bf16 rows at xr (ldb apart) times NP <= 2 panels of W from Wj,
// the sums over the inputs 32 at a time, in order. Tiles are not renamed (a load into a tile
// waits for the last product that read it), so two steps' A and B tiles alternate (A: 2, 3; B:
// 4-5, 6-7) and one step's loads go on while the other's products run: never slower than one set
// of tiles, 2-3% faster on weights that come from L3 (experiments/amx-tiles/amx_streaming.cpp).
template <int NP>
static void amx_block(const uint16_t* xr, int ldb, const uint16_t* Wj, size_t panel, int K32, float* out) {
    const uint16_t* W1 = Wj + panel;
    _tile_zero(0);
    if constexpr (NP > 1) _tile_zero(1);
    int k = 0;
    for (; k + 64 <= K32; k += 64) {
        _tile_loadd(2, xr + k, ldb * 2);
        _tile_loadd(4, Wj + (size_t)k * 16, 64);
        if constexpr (NP > 1) _tile_loadd(5, W1 + (size_t)k * 16, 64);
        _tile_loadd(3, xr + k + 32, ldb * 2);
        _tile_loadd(6, Wj + (size_t)(k + 32) * 16, 64);
        if constexpr (NP > 1) _tile_loadd(7, W1 + (size_t)(k + 32) * 16, 64);
        _tile_dpbf16ps(0, 2, 4);
        if constexpr (NP > 1) _tile_dpbf16ps(1, 2, 5);
        _tile_dpbf16ps(0, 3, 6);
        if constexpr (NP > 1) _tile_dpbf16ps(1, 3, 7);
    }
    if (k < K32) {  // an odd last step
        _tile_loadd(2, xr + k, ldb * 2);
        _tile_loadd(4, Wj + (size_t)k * 16, 64);
        _tile_dpbf16ps(0, 2, 4);
        if constexpr (NP > 1) { _tile_loadd(5, W1 + (size_t)k * 16, 64); _tile_dpbf16ps(1, 2, 5); }
    }
    _tile_stored(0, out, 16 * NP * 4);
    if constexpr (NP > 1) _tile_stored(1, out + 16, 16 * NP * 4);
}

// columns [c0, c0 + nc) of y = b + x W for n rows on the tiles, on the calling thread alone (x as
// rows_bf16 made it; W: bf16 panels of 16 columns whose inputs go in pairs, element (k, j) of a
// panel at k / 2 * 32 + 2 j + k % 2, K rounded up to 32 with zero rows), 32 columns a block
static void amx_range(const uint16_t* xb, int ldb, int n, const uint16_t* W, size_t panel, int c0, int nc,
                      const float* b, float* y, int ldy, int K) {
    alignas(64) float out[16 * 32];
    const int K32 = (K + 31) & ~31;
    for (int j0 = c0; j0 < c0 + nc; j0 += 32) {
        const int np = c0 + nc - j0 < 32 ? 1 : 2;
        const uint16_t* Wj = W + (size_t)(j0 / 16) * panel;
        for (int r0 = 0; r0 < n; r0 += 16) {
            const uint16_t* xr = xb + (size_t)r0 * ldb;
            if (np == 2) amx_block<2>(xr, ldb, Wj, panel, K32, out);
            else amx_block<1>(xr, ldb, Wj, panel, K32, out);
            const int rows = n - r0 < 16 ? n - r0 : 16;
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < np; c++) {
                    const v16 v = ld(out + r * 16 * np + 16 * c);
                    st(y + (size_t)(r0 + r) * ldy + j0 + 16 * c, b ? ld(b + j0 + 16 * c) + v : v);
                }
        }
    }
}

// linear_t on the tiles: the team shares out blocks of 64 columns
static void linear_amx(const float* x, int ldx, int n, const uint16_t* W, size_t panel, const float* b, float* y,
                       int ldy, int K, int N, bool then_gelu) {
    int ldb;
    const uint16_t* xb = rows_bf16(x, ldx, n, K, &ldb);  // every thread rounds every row for itself: no barrier
    const int nb = (N + 63) / 64;
    #pragma omp for schedule(static) nowait
    for (int blk = 0; blk < nb; blk++) {
        const int j0 = 64 * blk, width = N - j0 < 64 ? N - j0 : 64;
        amx_range(xb, ldb, n, W, panel, j0, width, b, y, ldy, K);
        if (then_gelu)
            for (int r = 0; r < n; r++) gelu(y + (size_t)r * ldy + j0, width);
    }
}
#endif

// the team's share of y's columns, without waiting for the rest of the team
// (then_gelu: y = GELU(b + x W))
static void linear_nowait(const float* x, int ldx, int n, Mat W, const float* b, float* y, int ldy, int K, int N,
                          bool then_gelu = false) {
    const size_t panel = (size_t)W.rows * 16;
#if ENGINE_AMX
    if (W.bf16 == 2) return linear_amx(x, ldx, n, (const uint16_t*)W.p, panel, b, y, ldy, K, N, then_gelu);
#endif
    if (W.bf16) linear_t(x, ldx, n, (const uint16_t*)W.p, panel, b, y, ldy, K, N, then_gelu);
    else linear_t(x, ldx, n, (const float*)W.p, panel, b, y, ldy, K, N, then_gelu);
}
static void linear(const float* x, int ldx, int n, Mat W, const float* b, float* y, int ldy, int K, int N,
                   bool then_gelu = false) {
    linear_nowait(x, ldx, n, W, b, y, ldy, K, N, then_gelu);
    #pragma omp barrier
}

// columns [c0, c0 + nc) of y = b + x W for n rows, on the calling thread alone: the same sums as linear's
// (parts ranges, `stride` columns apart: a head's query, key and value columns of the QKV product,
// from inputs rounded to bf16 once for all of them on the tiles)
static void lin_cols(const float* x, int ldx, int n, Mat W, int c0, int nc, const float* b, float* y, int ldy, int K,
                     int parts = 1, int stride = 0) {
    const size_t panel = (size_t)W.rows * 16;
#if ENGINE_AMX
    if (W.bf16 == 2) {
        int ldb;
        const uint16_t* xb = rows_bf16(x, ldx, n, K, &ldb);
        for (int p = 0; p < parts; p++)
            amx_range(xb, ldb, n, (const uint16_t*)W.p, panel, c0 + p * stride, nc, b, y, ldy, K);
        return;
    }
#endif
    for (int p = 0; p < parts; p++) {
        if (W.bf16) lin_range(x, ldx, n, (const uint16_t*)W.p, panel, c0 + p * stride, nc, b, y, ldy, K);
        else lin_range(x, ldx, n, (const float*)W.p, panel, c0 + p * stride, nc, b, y, ldy, K);
    }
}

// the sums over 16 lanes (i mod 16), then across the lanes in a fixed tree; d % 16 == 0
static void layer_norm(const float* x, const float* w, const float* b, float* y, int d) {
    v16 s = splat(0.f), q = splat(0.f);
    for (int i = 0; i < d; i += 16) s += ld(x + i);
    const v16 mean = splat(sum_of(s) / d);
    for (int i = 0; i < d; i += 16) { v16 t = ld(x + i) - mean; q += t * t; }
    const v16 inv = splat(1.f / std::sqrt(sum_of(q) / d + 1e-5f));
    for (int i = 0; i < d; i += 16) st(y + i, (ld(x + i) - mean) * inv * ld(w + i) + ld(b + i));
}

// the erf GELU of nn.GELU, with erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7); n % 16 == 0
static void gelu(float* x, int n) {
    for (int i = 0; i < n; i += 16) {
        v16 v = ld(x + i), z = v * 0.70710678118654752f;
        v16 a = select(z < 0.f, -z, z);
        v16 t = 1.f / (1.f + 0.3275911f * a);
        v16 poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
        v16 e = 1.f - poly * vexp(-a * a);
        e = select(z < 0.f, -e, e);
        st(x + i, 0.5f * v * (1.f + e));
    }
}

// Keys and values in bfloat16 go in pairs, as the tiles read them (and the multiply-adds widen a
// pair with one instruction a half, see ld_pairs): keys in groups of 16, each (hd / 2, 16, 2), the
// dimension pair (e, e + 1) of the group's 16 keys side by side; values (keys / 2, hd, 2), the key
// pair (j, j + 1)'s dimension e side by side. Float32 keys go in tiles of 32, (hd, 32), and values
// (keys, hd). Either way key j's group starts j * hd values into the head's keys and the key pair
// (j, j + 1) j * hd into its values, for j a multiple of 16 (keys) or 2 (values).
static inline size_t key_at(int j, int e, int hd, bool pairs) {
    return pairs ? (size_t)(j & ~15) * hd + (e / 2) * 32 + (j & 15) * 2 + (e & 1)
                 : (size_t)(j & ~31) * hd + e * 32 + (j & 31);
}
static inline size_t value_at(int j, int e, int hd, bool pairs) {
    return pairs ? (size_t)(j & ~1) * hd + e * 2 + (j & 1) : (size_t)j * hd + e;
}

// out[i, e:e + 16] = inv[i] * sum over keys j of scores[i, j] * V[j, e:e + 16] for min(n, NQ)
// queries (V: the values from the window's first key), as four partial sums over j mod 4, added
// pairwise at the end
template <int NQ, typename KV>
static void weighted_sum(int n, const float* scores, int span, const KV* V, int hd, int e, int jend,
                         const float* inv, float* out, int ldo) {
    if (n < NQ) {
        if constexpr (NQ > 1) weighted_sum<NQ - 1, KV>(n, scores, span, V, hd, e, jend, inv, out, ldo);
        return;
    }
    v16 acc[NQ][4];
    for (int i = 0; i < NQ; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = splat(0.f);
    for (int j = 0; j < jend; j += 4) {
        v16 v0, v1, v2, v3;
        if constexpr (sizeof(KV) == 2) {
            ld_pairs(V + (size_t)j * hd + 2 * e, v0, v1);
            ld_pairs(V + (size_t)(j + 2) * hd + 2 * e, v2, v3);
        } else {
            const KV* vr = V + (size_t)j * hd + e;
            v0 = ld(vr); v1 = ld(vr + hd); v2 = ld(vr + 2 * hd); v3 = ld(vr + 3 * hd);
        }
        for (int i = 0; i < NQ; i++) {
            const float* sc = scores + i * span + j;
            acc[i][0] += splat(sc[0]) * v0; acc[i][1] += splat(sc[1]) * v1;
            acc[i][2] += splat(sc[2]) * v2; acc[i][3] += splat(sc[3]) * v3;
        }
    }
    for (int i = 0; i < NQ; i++)
        st(out + (size_t)i * ldo, ((acc[i][0] + acc[i][1]) + (acc[i][2] + acc[i][3])) * inv[i]);
}

// A query's softmax over its window's cnt scores (row sc of span, whole vectors), times `scale`:
// sc becomes e^(scale score - max) for the window's keys and 0 for the rest; returns 1 / their
// sum, lane l taking key j = l mod 16, then the lanes in a fixed tree: the same operations for a
// query whatever span its group has (zeros add nothing)
static float softmax_row(float* sc, int cnt, int span, float scale) {
#if ENGINE_AVX512
    auto window = [cnt](int j) -> __mmask16 { return j + 16 <= cnt ? 0xffff : j < cnt ? (1u << (cnt - j)) - 1 : 0; };
    __m512 vm = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < span; j += 16) {
        const v16 x = ld(sc + j) * scale;
        st(sc + j, x);
        vm = _mm512_mask_max_ps(vm, window(j), vm, (__m512)x);
    }
    const float mx = _mm512_reduce_max_ps(vm);
    v16 sum = splat(0.f);
    for (int j = 0; j < span; j += 16) {
        const v16 e = (v16)_mm512_maskz_mov_ps(window(j), (__m512)vexp(ld(sc + j) - mx));
        st(sc + j, e);
        sum += e;
    }
    return 1.f / _mm512_reduce_add_ps((__m512)sum);
#else
    v16 vm = splat(-INFINITY);
    for (int j = 0; j < span; j += 16) {
        const v16 x = ld(sc + j) * scale;
        st(sc + j, x);
        vm = select(lanes_below(j, cnt), select(vm > x, vm, x), vm);
    }
    const float mx = max_lane(vm);
    v16 sum = splat(0.f);
    for (int j = 0; j < span; j += 16) {
        const v16 e = select(lanes_below(j, cnt), vexp(ld(sc + j) - mx), splat(0.f));
        st(sc + j, e);
        sum += e;
    }
    return 1.f / sum_of(sum);
#endif
}

#if !ENGINE_AVX512
// AVX2 (16 registers): attend_group's sums for three or more queries, in passes that keep them in
// registers. scores16: n <= NQ queries' scores against 16 keys, two 8-float sums a query (float32:
// `keys` is the 16 keys' columns in a tile of 32; bf16: their group), each sum in attend_group's
// order.
template <int NQ, typename KV>
static void scores16(int n, const float* q, int ldq, const KV* keys, int hd, float* sc, int span) {
    if (n < NQ) {
        if constexpr (NQ > 1) scores16<NQ - 1, KV>(n, q, ldq, keys, hd, sc, span);
        return;
    }
    v8 a[NQ][2];
    for (int i = 0; i < NQ; i++) a[i][0] = a[i][1] = v8{};
    if constexpr (sizeof(KV) == 2) {
        for (int e = 0; e < hd; e += 2) {
            v8 k0, k1, n0, n1;  // keys 0-7 and 8-15 at dimensions e (k) and e + 1 (n)
            ld_pairs8(keys + e * 16, k0, n0);
            ld_pairs8(keys + e * 16 + 16, k1, n1);
            for (int i = 0; i < NQ; i++) {
                const v8 qs = splat8(q[(size_t)i * ldq + e]), qns = splat8(q[(size_t)i * ldq + e + 1]);
                a[i][0] += qs * k0; a[i][1] += qs * k1;
                a[i][0] += qns * n0; a[i][1] += qns * n1;
            }
        }
    } else {
        for (int e = 0; e < hd; e++) {
            const v8 k0 = ld8(keys + e * 32), k1 = ld8(keys + e * 32 + 8);
            for (int i = 0; i < NQ; i++) {
                const v8 qs = splat8(q[(size_t)i * ldq + e]);
                a[i][0] += qs * k0; a[i][1] += qs * k1;
            }
        }
    }
    for (int i = 0; i < NQ; i++) { st8(sc + i * span, a[i][0]); st8(sc + i * span + 8, a[i][1]); }
}
// (AVX2) weighted_sum's sums for n <= NQ queries, 8 dimensions from e
template <int NQ, typename KV>
static void weighted_sum8(int n, const float* scores, int span, const KV* V, int hd, int e, int jend,
                          const float* inv, float* out, int ldo) {
    if (n < NQ) {
        if constexpr (NQ > 1) weighted_sum8<NQ - 1, KV>(n, scores, span, V, hd, e, jend, inv, out, ldo);
        return;
    }
    v8 acc[NQ][4];
    for (int i = 0; i < NQ; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = v8{};
    for (int j = 0; j < jend; j += 4) {
        v8 v0, v1, v2, v3;
        if constexpr (sizeof(KV) == 2) {  // keys j and j + 1 in a pair's halves, then j + 2 and j + 3
            ld_pairs8(V + (size_t)j * hd + 2 * e, v0, v1);
            ld_pairs8(V + (size_t)(j + 2) * hd + 2 * e, v2, v3);
        } else {
            const KV* vr = V + (size_t)j * hd + e;
            v0 = ld8(vr); v1 = ld8(vr + hd); v2 = ld8(vr + 2 * hd); v3 = ld8(vr + 3 * hd);
        }
        for (int i = 0; i < NQ; i++) {
            const float* sc = scores + i * span + j;
            acc[i][0] += splat8(sc[0]) * v0; acc[i][1] += splat8(sc[1]) * v1;
            acc[i][2] += splat8(sc[2]) * v2; acc[i][3] += splat8(sc[3]) * v3;
        }
    }
    for (int i = 0; i < NQ; i++)
        st8(out + (size_t)i * ldo, ((acc[i][0] + acc[i][1]) + (acc[i][2] + acc[i][3])) * inv[i]);
}
#endif

// Softmax attention of one head for NQ <= 8 queries (rows of q, stride ldq, at the head's
// dimensions) whose windows start at the same key lo (a multiple of 32) and end at hi[i], with
// float32 multiply-adds: the group reads the keys and values once. 16 keys' scores are one vector
// per dimension, and a window's keys one contiguous run of memory. A query's scores, softmax and
// weighted sum are the same operations in the same order whatever queries share the call: keys
// past its own end get weight exactly 0, the sums run over the key's offset from lo, and the
// weighted sum goes four queries at a time (registers; on AVX2, from 3 queries, scores 6 or 4
// queries and the weighted sums 2 queries at a time: see scores16).
template <int NQ, typename KV>
static void attend_group(const float* q, int ldq, const int* hi, const KV* KT, const KV* Vv, int lo, int hd,
                         float* out, int ldo, float* scores) {
    const float scale = 1.f / std::sqrt((float)hd);
    int cnt[NQ], cmax = 0;
    for (int i = 0; i < NQ; i++) { cnt[i] = hi[i] - lo + 1; cmax = cnt[i] > cmax ? cnt[i] : cmax; }
    const int span = (cmax + 31) & ~31;  // scores per query: whole tiles of 32 keys
#if !ENGINE_AVX512
    if constexpr (NQ >= 3) {  // 16 keys a pass, 6 queries (bf16: 4) at a time; the weighted sums 2 queries and 8 dimensions a pass
        constexpr int G = sizeof(KV) == 2 ? 4 : 6;
        for (int j = 0; j < span; j += 32)
            for (int g = 0; g < 2; g++) {
                const KV* keys = KT + (size_t)(lo + j) * hd + (sizeof(KV) == 2 ? (size_t)g * 16 * hd : 16 * g);
                for (int i0 = 0; i0 < NQ; i0 += G)
                    scores16<(NQ < G ? NQ : G), KV>(NQ - i0, q + (size_t)i0 * ldq, ldq, keys, hd,
                                                    scores + i0 * span + j + 16 * g, span);
            }
        float inv[NQ];
        for (int i = 0; i < NQ; i++) inv[i] = softmax_row(scores + i * span, cnt[i], span, scale);
        const int jend = (cmax + 3) & ~3;
        for (int e = 0; e < hd; e += 8)
            for (int i0 = 0; i0 < NQ; i0 += 2)
                weighted_sum8<(NQ < 2 ? NQ : 2), KV>(NQ - i0, scores + i0 * span, span, Vv + (size_t)lo * hd, hd, e,
                                                     jend, inv + i0, out + (size_t)i0 * ldo + e, ldo);
        return;
    }
#endif
    for (int j = 0; j < span; j += 32) {
        const KV* tile = KT + (size_t)(lo + j) * hd;  // keys lo + j.. (float32: 32 a tile; bf16: 16 a group)
        v16 a[NQ][2];
        for (int i = 0; i < NQ; i++) a[i][0] = a[i][1] = splat(0.f);
        if constexpr (sizeof(KV) == 2) {
            for (int e = 0; e < hd; e += 2) {
                v16 k0, k0n, k1, k1n;  // keys 0-15 and 16-31 at dimensions e and e + 1
                ld_pairs(tile + e * 16, k0, k0n);
                ld_pairs(tile + 16 * hd + e * 16, k1, k1n);
                for (int i = 0; i < NQ; i++) {
                    v16 qs = splat(q[(size_t)i * ldq + e]), qn = splat(q[(size_t)i * ldq + e + 1]);
                    a[i][0] += qs * k0; a[i][1] += qs * k1;
                    a[i][0] += qn * k0n; a[i][1] += qn * k1n;
                }
            }
        } else {
            for (int e = 0; e < hd; e++) {
                v16 k0 = ld(tile + e * 32), k1 = ld(tile + e * 32 + 16);
                for (int i = 0; i < NQ; i++) {
                    v16 qs = splat(q[(size_t)i * ldq + e]);
                    a[i][0] += qs * k0; a[i][1] += qs * k1;
                }
            }
        }
        for (int i = 0; i < NQ; i++) { st(scores + i * span + j, a[i][0]); st(scores + i * span + j + 16, a[i][1]); }
    }
    float inv[NQ];
    for (int i = 0; i < NQ; i++) inv[i] = softmax_row(scores + i * span, cnt[i], span, scale);
    const int jend = (cmax + 3) & ~3;
    for (int e = 0; e < hd; e += 16)
        for (int i0 = 0; i0 < NQ; i0 += 4)
            weighted_sum<(NQ < 4 ? NQ : 4), KV>(NQ - i0, scores + i0 * span, span, Vv + (size_t)lo * hd, hd, e, jend,
                                                 inv + i0, out + (size_t)i0 * ldo + e, ldo);
}

#if ENGINE_AMX
// attend_group on the tiles, for g <= 16 queries and bf16 keys and values (hd a multiple of 32),
// with autocast's numbers: queries rounded to bf16, scores q k (float32 sums) scaled, softmax in
// float32, the normalized weights rounded to bf16, and their products with the values summed in
// float32. A query's scores are its own tile row, and its weighted sum adds its own weights' row
// 32 keys a product, in key order: keys past its end (weight 0) add exact zeros, so its result is
// the same whatever queries share the group (exact mode, batch independence). probs: g rows of
// the span's bf16 weights.
static void attend_group_tiles(const float* q, int ldq, int g, const int* hi, const uint16_t* KT,
                               const uint16_t* Vv, int lo, int hd, float* out, int ldo, float* scores,
                               uint16_t* probs) {
    const float scale = 1.f / std::sqrt((float)hd);
    int cnt[MAXK], cmax = 0;
    for (int i = 0; i < g; i++) { cnt[i] = hi[i] - lo + 1; cmax = cnt[i] > cmax ? cnt[i] : cmax; }
    const int span = (cmax + 31) & ~31;
    int ldb;
    const uint16_t* qb = rows_bf16(q, ldq, g, hd, &ldb);  // and the tiles configured for g rows
    if (hd == 32) _tile_loadd(2, qb, ldb * 2);
    for (int j = 0; j < span; j += 32) {  // scores: 16 keys (a group) a product, 32 dimensions a step
        const uint16_t* keys = KT + (size_t)(lo + j) * hd;
        _tile_zero(0);
        _tile_zero(1);
        for (int e = 0; e < hd; e += 32) {
            if (hd > 32) _tile_loadd(2, qb + e, ldb * 2);
            _tile_loadd(4, keys + e * 16, 64);
            _tile_loadd(5, keys + 16 * hd + e * 16, 64);
            _tile_dpbf16ps(0, 2, 4);
            _tile_dpbf16ps(1, 2, 5);
        }
        _tile_stored(0, scores + j, span * 4);
        _tile_stored(1, scores + j + 16, span * 4);
    }
    for (int i = 0; i < g; i++) {
        float* sc = scores + (size_t)i * span;
        const v16 inv = splat(softmax_row(sc, cnt[i], span, scale));
        for (int j = 0; j < span; j += 32)  // rounded to nearest, ties to even (denormals to 0, as the tiles read them)
            _mm512_store_si512(probs + (size_t)i * span + j,
                               (__m512i)_mm512_cvtne2ps_pbh((__m512)(ld(sc + j + 16) * inv), (__m512)(ld(sc + j) * inv)));
    }
    for (int e = 0; e < hd; e += 32) {  // dimensions e..e + 15 in tile 0, e + 16..e + 31 in tile 1
        _tile_zero(0); _tile_zero(1);
        for (int j = 0; j < span; j += 64) {  // 32 keys a step, two steps' tiles alternating
            const uint16_t* vals = Vv + (size_t)(lo + j) * hd + 2 * e;
            _tile_loadd(2, probs + j, span * 2);
            _tile_loadd(4, vals, hd * 4);
            _tile_loadd(5, vals + 32, hd * 4);
            _tile_dpbf16ps(0, 2, 4);
            _tile_dpbf16ps(1, 2, 5);
            if (j + 32 == span) break;
            _tile_loadd(3, probs + j + 32, span * 2);
            _tile_loadd(6, vals + 32 * hd, hd * 4);
            _tile_loadd(7, vals + 32 * hd + 32, hd * 4);
            _tile_dpbf16ps(0, 3, 6);
            _tile_dpbf16ps(1, 3, 7);
        }
        _tile_stored(0, out + e, ldo * 4);
        _tile_stored(1, out + e + 16, ldo * 4);
    }
}
#endif

// one head's attention for n queries whose windows start at lo[i] and end at hi[i]: runs of
// queries with the same start go through attend_group eight at a time, or (tiles) all at once
template <typename KV>
static void attend(const float* q, int ldq, int n, const int* lo, const int* hi, const KV* KT, const KV* Vv,
                   int hd, float* out, int ldo, float* scores, uint16_t* probs, bool tiles) {
    int i = 0;
    while (i < n) {
        int m = 1;
        while (i + m < n && (tiles || m < 8) && lo[i + m] == lo[i]) m++;
        const float* qi = q + (size_t)i * ldq;
        float* oi = out + (size_t)i * ldo;
#if ENGINE_AMX
        if constexpr (sizeof(KV) == 2)
            if (tiles) {
                attend_group_tiles(qi, ldq, m, hi + i, KT, Vv, lo[i], hd, oi, ldo, scores, probs);
                i += m;
                continue;
            }
#endif
        switch (m) {
            case 8: attend_group<8, KV>(qi, ldq, hi + i, KT, Vv, lo[i], hd, oi, ldo, scores); break;
            case 7: attend_group<7, KV>(qi, ldq, hi + i, KT, Vv, lo[i], hd, oi, ldo, scores); break;
            case 6: attend_group<6, KV>(qi, ldq, hi + i, KT, Vv, lo[i], hd, oi, ldo, scores); break;
            case 5: attend_group<5, KV>(qi, ldq, hi + i, KT, Vv, lo[i], hd, oi, ldo, scores); break;
            case 4: attend_group<4, KV>(qi, ldq, hi + i, KT, Vv, lo[i], hd, oi, ldo, scores); break;
            case 3: attend_group<3, KV>(qi, ldq, hi + i, KT, Vv, lo[i], hd, oi, ldo, scores); break;
            case 2: attend_group<2, KV>(qi, ldq, hi + i, KT, Vv, lo[i], hd, oi, ldo, scores); break;
            default: attend_group<1, KV>(qi, ldq, hi + i, KT, Vv, lo[i], hd, oi, ldo, scores);
        }
        i += m;
    }
}

// ---------------------------------------------------------------- the decoder step

// The workspace: rows of every image of the batch, image-major (row = image index * n + token).
// dl: what a layer adds to the residual stream x.
struct Work { float *x, *xn, *qkv, *att, *hid, *h, *z, *dl, *pre; };
static Work work_of(const Engine* E) {
    const size_t R = (size_t)E->B * MAXK, d = E->d;
    float* p = E->work;
    Work w;
    w.x = p; p += R * d; w.xn = p; p += R * d; w.qkv = p; p += R * 3 * d; w.att = p; p += R * d;
    w.hid = p; p += R * E->ff; w.h = p; p += R * d; w.z = p; p += R * V; w.dl = p; p += R * d;
    w.pre = p;
    return w;
}
extern "C" size_t engine_work_floats(int B, int d, int ff, int f) {
    return (size_t)B * MAXK * (8 * d + ff + V + f);
}

// The residual stream's rows a thread works on: x, its normalized copy xn, and the decoder's final
// states h. A call with up to OWN_ROWS rows gives every thread a copy of its own and every thread
// computes every row's norms: the same operations, but no barrier and no rows fetched from the
// other core's cache after each norm (experiments/engine-synchronization/). Thread 0's copy is the
// team's buffers, so a call leaves the whole of h in w.h.
static const int OWN_ROWS = 8;
struct Stream { float *x, *xn, *h; bool own; };

// a thread's buffers for a call: a call's queries' attention scores (and, on the tiles, weights),
// and its own copy of the stream
struct ThreadBuf {
    float *scores, *own;
    uint16_t* probs;  // the attention weights in bf16 on the tiles: as many as scores
    int d;
    explicit ThreadBuf(const Engine* E) : d(E->d) {
        amx_call_start();
        const size_t n_scores = (MAXK * (2 * (size_t)E->L + E->n_src + 64) + 31) & ~(size_t)31;
        scores = (float*)std::aligned_alloc(64, (n_scores + 3 * OWN_ROWS * (size_t)d) * sizeof(float) + n_scores * 2);
        own = scores + n_scores;
        probs = (uint16_t*)(own + 3 * OWN_ROWS * (size_t)d);
    }
    ~ThreadBuf() {
        amx_call_end();
        std::free(scores);
    }
    ThreadBuf(const ThreadBuf&) = delete;
    Stream stream(const Work& w, int R) const {
        if (R > OWN_ROWS) return {w.x, w.xn, w.h, false};
        if (omp_get_thread_num() == 0) return {w.x, w.xn, w.h, true};
        const size_t rows = (size_t)OWN_ROWS * d;
        return {own, own + rows, own + 2 * rows, true};
    }
};

// Head h's attention for the n queries (rows of q, stride ldq) of an image b over its keys and
// values: n_keys * hd of each an image and head, laid out as key_at and value_at say. local:
// the decoder's self-attention, where query p reads keys from the start of the previous attention
// block to p, from the KV ring (see Engine); otherwise every key (cross-attention to the encoder).
template <typename KV>
static void attend_head(const Engine* E, int b, int h, int n, int pos0, const float* q, int ldq, const void* keys,
                        const void* values, int n_keys, bool local, float* out, const ThreadBuf& tb) {
    const int d = E->d, H = E->H, L = E->L, hd = d / H;
    int lo[MAXK], hi[MAXK];
    for (int j = 0; j < n; j++) {  // a window in the ring: its start's slot, then in order
        int p = pos0 + j, l = (p / L - 1) * L;
        l = l < 0 ? 0 : l;
        lo[j] = local ? l % (3 * L) : 0;
        hi[j] = local ? lo[j] + (p - l) : n_keys - 1;
    }
    const size_t head = ((size_t)b * H + h) * n_keys * hd;
    attend(q + h * hd, ldq, n, lo, hi, (const KV*)keys + head, (const KV*)values + head, hd, out + h * hd, d,
           tb.scores, tb.probs, E->kv_bf16 == 2);
}

// head h's keys and values of n tokens of image b (rows of qkv, 3d apart) into their ring slots of
// layer li's caches (key_at, value_at), 16 dimensions a store (bf16 keys: a scatter of 8 pairs;
// values: every other 16 bits of 64 bytes)
template <typename KV>
static void write_kv(const Engine* E, int li, int b, int h, int n, int pos0, const float* qkv) {
    const int d = E->d, CL = E->cache_len, H = E->H, hd = d / H;
    const size_t head = ((size_t)b * H + h) * CL * hd;
    KV *Kh = (KV*)E->k_cache[li] + head, *Vh = (KV*)E->v_cache[li] + head;
#if ENGINE_AVX512
    const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
#endif
    for (int j = 0; j < n; j++) {
        const int slot = (pos0 + j) % (3 * E->L);
        const float *k = qkv + (size_t)j * 3 * d + d + h * hd, *v = k + d;
        for (int e = 0; e < hd; e += 16) {
#if !ENGINE_AVX512
            uint16_t kb[16], vb[16];
            round_bf16(ld(k + e), kb);
            round_bf16(ld(v + e), vb);
            for (int copy = slot; copy < 4 * E->L; copy += 3 * E->L) {  // the same layout as the scatters below
                if constexpr (sizeof(KV) == 2) {
                    for (int i = 0; i < 8; i++) std::memcpy(Kh + key_at(copy, e, hd, true) + 32 * i, kb + 2 * i, 4);
                    for (int i = 0; i < 16; i++) ((uint16_t*)Vh + value_at(copy & ~1, e, hd, true))[2 * i + (copy & 1)] = vb[i];
                } else {
                    for (int i = 0; i < 16; i++) ((float*)Kh + key_at(copy, e, hd, false))[32 * i] = k[e + i];
                    std::memcpy(Vh + value_at(copy, e, hd, false), v + e, 64);
                }
            }
#else
            const __m512 kf = _mm512_loadu_ps(k + e), vf = _mm512_loadu_ps(v + e);
            const __m256i kb = round_bf16(_mm512_castps_si512(kf)), vb = round_bf16(_mm512_castps_si512(vf));
            for (int copy = slot; copy < 4 * E->L; copy += 3 * E->L) {  // slots < L also at +3L
                if constexpr (sizeof(KV) == 2) {  // 8 pairs of dimensions, 64 bytes apart; values in the key's half
                    _mm256_i32scatter_epi32(Kh + key_at(copy, e, hd, true), _mm512_castsi512_si256(_mm512_slli_epi32(lane, 4)),
                                            kb, 4);
                    const __m512i wide = _mm512_cvtepu16_epi32(vb);
                    _mm512_mask_storeu_epi16(Vh + value_at(copy & ~1, e, hd, true), copy & 1 ? 0xaaaaaaaau : 0x55555555u,
                                             copy & 1 ? _mm512_slli_epi32(wide, 16) : wide);
                } else {  // 16 dimensions, 32 floats apart
                    _mm512_i32scatter_ps(Kh + key_at(copy, e, hd, false), _mm512_slli_epi32(lane, 5), kf, 4);
                    _mm512_storeu_ps(Vh + value_at(copy, e, hd, false), vf);
                }
            }
#endif
        }
    }
}

// A layer's self-attention for n tokens of each of m images (rows of s.xn), into w.att: the QKV
// product, each head's keys and values into the cache, and each head's attention, one (image,
// head) a work item of the team. A keys group holds 16 positions side by side, so the writes go by
// head, not by token (two threads writing two tokens of one head would write into the same cache
// lines). Where every thread holds the whole stream (s.own), a work item makes its own head's
// queries, keys and values too (its columns of the QKV product, the same sums): no barrier, and
// no QKV rows from the other core. Team call.
template <typename KV>
static void self_attention(const Engine* E, int li, int m, const int* imgs, int n, const int* pos0, const Stream& s,
                           const Work& w, const ThreadBuf& tb) {
    const Layer& Ly = E->layers[li];
    const int d = E->d, H = E->H, hd = d / H;
    if (!s.own) {
        linear(s.xn, d, m * n, Ly.qkv_w, Ly.qkv_b, w.qkv, 3 * d, d, 3 * d);
        mark(E, ST_QKV);
    }
    #pragma omp for schedule(static)
    for (int ih = 0; ih < m * H; ih++) {
        const int i = ih / H, h = ih % H, b = imgs[i];
        float* qkv = w.qkv + (size_t)i * n * 3 * d;
        if (s.own) {
            // the head's queries, keys and values
            lin_cols(s.xn + (size_t)i * n * d, d, n, Ly.qkv_w, h * hd, hd, Ly.qkv_b, qkv, 3 * d, d, 3, d);
            mark(E, ST_QKV);
        }
        write_kv<KV>(E, li, b, h, n, pos0[i], qkv);
        mark(E, ST_KV_WRITE);
        attend_head<KV>(E, b, h, n, pos0[i], qkv, 3 * d, E->k_cache[li], E->v_cache[li], E->cache_len, true,
                        w.att + (size_t)i * n * d, tb);
        mark(E, ST_SELF_ATT);
    }
    mark(E, ST_SELF_ATT);
}

// A layer's cross-attention to the encoder for n tokens of each of m images (rows of s.xn), into
// w.att: the query product, then each (image, head)'s attention; as self_attention, a work item
// makes its own head's queries where every thread holds the whole stream. Team call.
template <typename KV>
static void cross_attention(const Engine* E, int li, int m, const int* imgs, int n, const int* pos0, const Stream& s,
                            const Work& w, const ThreadBuf& tb) {
    const Layer& Ly = E->layers[li];
    const int d = E->d, H = E->H, hd = d / H;
    if (!s.own) {
        linear(s.xn, d, m * n, Ly.cq_w, Ly.cq_b, w.qkv, d, d, d);
        mark(E, ST_LINEAR);
    }
    #pragma omp for schedule(static)
    for (int ih = 0; ih < m * H; ih++) {
        const int i = ih / H, h = ih % H, b = imgs[i];
        float* q = w.qkv + (size_t)i * n * d;
        if (s.own) {
            lin_cols(s.xn + (size_t)i * n * d, d, n, Ly.cq_w, h * hd, hd, Ly.cq_b, q, d, d);
            mark(E, ST_LINEAR);
        }
        attend_head<KV>(E, b, h, n, pos0[i], q, d, E->enc_k[li], E->enc_v[li], E->n_src, false,
                        w.att + (size_t)i * n * d, tb);
        mark(E, ST_CROSS_ATT);
    }
    mark(E, ST_CROSS_ATT);
}

// x += delta, then out = LayerNorm(x), for R rows of d: the team shares the rows out, or (s.own)
// every thread does them all into its own stream. Team call.
static void residual_norm(const Stream& s, int R, int d, float* x, const float* delta, const float* ln_w,
                          const float* ln_b, float* out) {
    auto row = [&](int r) {
        for (int c = 0; c < d; c++) x[(size_t)r * d + c] += delta[(size_t)r * d + c];
        layer_norm(x + (size_t)r * d, ln_w, ln_b, out + (size_t)r * d, d);
    };
    if (s.own) {
        for (int r = 0; r < R; r++) row(r);
        return;
    }
    #pragma omp for schedule(static)
    for (int r = 0; r < R; r++) row(r);
}

// n tokens of each of m images imgs[i]: prev[i * ldp + j] is the token before position
// pos0[i] + j (-1: the start). Writes their K/V into the caches and returns the final decoder
// states (row i * n + j) as this thread's stream holds them (thread 0's: w.h). Called by a whole
// team (or one thread).
static const float* step(const Engine* E, int m, const int* imgs, int n, const int64_t* prev, int ldp,
                         const int* pos0, const Work& w, const ThreadBuf& tb) {
    const int d = E->d, ff = E->ff, R = m * n;
    const Stream s = tb.stream(w, R);
    mark(E, -1);
    auto embed = [&](int r) {
        int i = r / n, j = r % n, b = imgs[i];
        int p = pos0[i] + j, pc = p < S ? p : S - 1;
        int ch = (p + 2) % 3;  // the previous token's channel
        int64_t pv = prev[(size_t)i * ldp + j];
        int idx = pv < 0 ? 3 * V : (int)pv + V * ch;
        const float *e = E->tgt_emb + (size_t)idx * d, *pe = E->pos_emb + ((size_t)b * S + pc) * d;
        for (int c = 0; c < d; c++) s.x[(size_t)r * d + c] = e[c] + pe[c];
        layer_norm(s.x + (size_t)r * d, E->layers[0].ln1_w, E->layers[0].ln1_b, s.xn + (size_t)r * d, d);
    };
    if (s.own) {
        for (int r = 0; r < R; r++) embed(r);
    } else {
        #pragma omp for schedule(static)
        for (int r = 0; r < R; r++) embed(r);
    }
    mark(E, ST_EMBED);
    for (int li = 0; li < E->n_layers; li++) {
        const Layer& Ly = E->layers[li];
        if (E->kv_bf16) self_attention<uint16_t>(E, li, m, imgs, n, pos0, s, w, tb);
        else self_attention<float>(E, li, m, imgs, n, pos0, s, w, tb);
        linear(w.att, d, R, Ly.out_w, Ly.out_b, w.dl, d, d, d);
        mark(E, ST_LINEAR);
        residual_norm(s, R, d, s.x, w.dl, Ly.ln2_w, Ly.ln2_b, s.xn);
        mark(E, ST_NORM_GELU);
        if (E->kv_bf16) cross_attention<uint16_t>(E, li, m, imgs, n, pos0, s, w, tb);
        else cross_attention<float>(E, li, m, imgs, n, pos0, s, w, tb);
        linear(w.att, d, R, Ly.cout_w, Ly.cout_b, w.dl, d, d, d);
        mark(E, ST_LINEAR);
        residual_norm(s, R, d, s.x, w.dl, Ly.ln3_w, Ly.ln3_b, s.xn);
        mark(E, ST_NORM_GELU);
        linear(s.xn, d, R, Ly.up_w, Ly.up_b, w.hid, ff, d, ff, true);
        mark(E, ST_LINEAR);
        linear(w.hid, ff, R, Ly.down_w, Ly.down_b, w.dl, d, ff, d);
        mark(E, ST_LINEAR);
        if (li + 1 < E->n_layers)  // the next layer's first norm, or the decoder's final one
            residual_norm(s, R, d, s.x, w.dl, E->layers[li + 1].ln1_w, E->layers[li + 1].ln1_b, s.xn);
        else
            residual_norm(s, R, d, s.x, w.dl, E->dec_ln_w, E->dec_ln_b, s.h);
        mark(E, ST_NORM_GELU);
    }
    return s.h;
}

// ---------------------------------------------------------------- logits and the heads

// How a call accepts proposals. SAMPLE: sampling at `temperature`, k = 1 plain (p1's Gumbel-max
// sample, one token a call), k > 1 speculative (heads' sampled drafts kept with probability
// min(1, p/q), a rejected one's position drawn from max(0, p - q)): decoding.py's rule, on its
// noise tables (Engine.noise_*), so an image's sample depends on its seed only.
enum Rule { EXACT = 0, EPS = 1, TOPK = 2, ORACLE = 3, SAMPLE = 4 };

struct Options {
    int k, rule, eps, top_k, min_block, window;
    float temperature;
    int recycle;  // the exact rule: proposals past a rejected one come from the call's own logits (call_images)
};


static inline const float* offset_row(const float* table, int row, int ref) {
    // a learned log-prior over (intensity - ref): intensity v's entry is v - ref + 255
    return table + (size_t)row * (2 * V - 1) + (V - 1 - ref);
}

// logits z (R, 256) of p1 (lm_head + the input prior) at states h (R, d) predicting positions
// pos0[i] + shift + j of images imgs[i] (row i * n + j). Team call.
static void p1_logits(const Engine* E, int m, const int* imgs, int n, const int* pos0, const float* h, float* z,
                      int shift = 0) {
    const int R = m * n;
    linear(h, E->d, R, E->lm_w, nullptr, z, V, E->d, V);
    if (!E->has_lr_prior) return;
    #pragma omp for schedule(static)
    for (int r = 0; r < R; r++) {
        int i = r / n, b = imgs[i], p = pos0[i] + shift + r % n;
        p = p < S ? p : S - 1;
        const float* pr = offset_row(E->lr_prior, p % 3, E->cell[(size_t)b * S + p]);
        for (int v = 0; v < V; v++) z[(size_t)r * V + v] += E->prior_weight * pr[v];
    }
}

// The cell guard (decoding.cell_guard): p1's logits z (256) at position p of image b lose
// guard_slope * max(0, |D + v - x| / 16 - guard) at each intensity v, where x is the 8x8 input's
// intensity under p and D the sum of (token - x) over the positions of p's 4x4 cell and channel
// before p. The tokens before position t are toks', from t on the call's own inputs blk (blk[0]
// at t).
static void add_cell_guard(const Engine* E, int b, int p, const int64_t* toks, int t, const int64_t* blk, float* z) {
    const int x = E->cell[(size_t)b * S + p], ch = p % 3, row = p / 96, col = (p / 3) % 32;
    int D = 0;
    for (int r = row / 4 * 4; r <= row; r++)
        for (int c = col / 4 * 4; c < col / 4 * 4 + 4; c++) {
            const int q = r * 96 + c * 3 + ch;
            if (q < p) D += (int)(q < t ? toks[q] : blk[q - t]) - x;
        }
    for (int v = 0; v < V; v++) {
        const float over = (float)std::abs(D + v - x) / 16.0f - E->guard;
        if (over > 0) z[v] -= E->guard_slope * over;
    }
}

static inline int argmax(const float* z) {
    int best = 0;
    for (int v = 1; v < V; v++) if (z[v] > z[best]) best = v;
    return best;
}

static inline float max_of(const float* z) {  // z[argmax(z)], 16 values a step
    v16 m = ld(z);
#if ENGINE_AVX512
    for (int v = 16; v < V; v += 16) m = (v16)_mm512_max_ps((__m512)m, (__m512)ld(z + v));
#else
    for (int v = 16; v < V; v += 16) { const v16 x = ld(z + v); m = select(m > x, m, x); }
#endif
    return max_lane(m);
}

static inline int64_t token_at(const int64_t* toks, int p) { return toks[p < 0 ? 0 : p]; }

// head a + 2's prior over the intensities of its target u from decoded or proposed neighbours
// (nbr_prior; with nbr_draft the block's own proposals props[0..a] are read too)
static void add_nbr_prior(const Engine* E, int a, int u, const int64_t* toks, const int64_t* props, float* lg) {
    int t = u < S ? u : S - 1, ch = t % 3, col = (t / 3) % 32;
    if (u >= S) return;
    auto add = [&](int row, int64_t ref) {
        const float* r = offset_row(E->nbr_prior, row, (int)ref);
        for (int v = 0; v < V; v++) lg[v] += r[v];
    };
    if (E->nbr_draft) {
        int rows0 = (a * 3) * 3 + ch;
        int64_t prev = props[a];
        int64_t left = a >= 2 ? props[a - 2] : token_at(toks, u - 3);
        int64_t back4 = a >= 3 ? props[a - 3] : token_at(toks, u - 4);
        int64_t grad = prev + left - back4;
        grad = grad < 0 ? 0 : (grad > V - 1 ? V - 1 : grad);
        if (col >= 1) add(rows0, left);                 // the pixel just left
        if (t >= 96) add(rows0 + 3, token_at(toks, t - 96));  // the pixel above
        if (ch > 0 && col >= 1) add(rows0 + 6, grad);  // previous channel + the left pixel's step
    } else {
        int j = a + 2, back = (j + 2) / 3;  // the nearest decoded pixel of the same channel
        int rows0 = (a * 2) * 3 + ch;
        if (col >= back) add(rows0, token_at(toks, t - 3 * back));
        if (t >= 96) add(rows0 + 3, token_at(toks, t - 96));
    }
}

// argmax over v of P(|x - v| <= window) (the first v where tied): e^(lg - max) with zeros
// window values either side, each v's window summed in order, 16 values of v a step
static int window_centre(const float* lg, int window) {
    const float mx = max_of(lg);
    const int pad = (window + 15) & ~15;  // window <= 255 (eps's range)
    float p[V + 2 * V];
    std::memset(p, 0, pad * sizeof(float));
    std::memset(p + pad + V, 0, pad * sizeof(float));
    for (int v = 0; v < V; v += 16) st(p + pad + v, vexp(ld(lg + v) - mx));
    float best = -1.f;
    int bv = 0;
    for (int v = 0; v < V; v += 16) {
        v16 mass = splat(0.f);
        for (int u = -window; u <= window; u++) mass += ld(p + pad + v + u);
        const float top = max_lane(mass);
        if (top > best) {
            best = top;
#if ENGINE_AVX512
            bv = v + __builtin_ctz(_mm512_cmp_ps_mask((__m512)mass, _mm512_set1_ps(top), _CMP_EQ_OQ));
#else
            int l = 0;
            while (mass[l] != top) l++;
            bv = v + l;
#endif
        }
    }
    return bv;
}

// ---------------------------------------------------------------- sampling

static inline int clamp_pos(int p) { return p < S ? p : S - 1; }

// softmax(z / T) (V,) in double
static void softmax_t(const float* z, float T, double* p) {
    float mx = max_of(z) / T;
    double sum = 0.0;
    for (int v = 0; v < V; v++) sum += p[v] = std::exp((double)(z[v] / T - mx));
    for (int v = 0; v < V; v++) p[v] /= sum;
}

// the sure token at position pos of image b: argmax(z / T + g) for its Gumbel noise g (a sample
// of softmax(z / T)); where the draft there, drawn from logits q, was rejected, from max(0, p - q)
// instead, which makes the token's distribution exactly p (unless p == q leaves nothing)
static int sample_first(const Engine* E, const Options* o, int b, int pos, const float* z, const float* q) {
    const float T = o->temperature, *g = E->noise_first + ((size_t)b * S + clamp_pos(pos)) * V;
    if (q) {
        double p[V], pq[V], best = -INFINITY;
        int bv = -1;
        softmax_t(z, T, p);
        softmax_t(q, T, pq);
        for (int v = 0; v < V; v++) {
            double r = p[v] - pq[v];
            if (r > 0 && std::log(r) + g[v] > best) { best = std::log(r) + g[v]; bv = v; }
        }
        if (bv >= 0) return bv;
    }
    int best = 0;
    float bs = z[0] / T + g[0];  // as decoding.py: (z / T) + g, the first maximum
    for (int v = 1; v < V; v++) { float s_ = z[v] / T + g[v]; if (s_ > bs) { bs = s_; best = v; } }
    return best;
}

// head a + 2's draft at position pos of image b from its logits lg (prior included): argmax(lg +
// T g) for the drafts' Gumbel noise g, as decoding.py draws it (T g rounded before the sum: no
// fused multiply-add here); lg kept for the verification
__attribute__((optimize("fp-contract=off")))
static int draft_sample(const Engine* E, const Options* o, int b, int pos, int a, const float* lg) {
    const float T = o->temperature, *g = E->noise_draft + ((size_t)b * S + clamp_pos(pos)) * V;
    std::memcpy(E->qlog + ((size_t)b * (MAXK - 1) + a) * V, lg, V * sizeof(float));
    int best = 0;
    float bs = lg[0] + g[0] * T;
    for (int v = 1; v < V; v++) { float s_ = lg[v] + g[v] * T; if (s_ > bs) { bs = s_; best = v; } }
    return best;
}

// Speculative sampling's acceptance of image b's block pr at positions t.. : draft j (position
// t + j) is kept while u < p(x) / q(x), p = softmax(z[j - 1] / T), q its draft's distribution
static int sample_accepted(const Engine* E, const Options* o, int b, int t, const int64_t* pr, const float* z) {
    int acc = 1;
    for (int j = 1; j < o->k; j++) {
        double p[V], q[V];
        softmax_t(z + (size_t)(j - 1) * V, o->temperature, p);
        softmax_t(E->qlog + ((size_t)b * (MAXK - 1) + j - 1) * V, o->temperature, q);
        const double u = E->noise_accept[(size_t)b * S + clamp_pos(t + j)];
        if (!(u * q[pr[j]] < p[pr[j]])) break;
        acc++;
    }
    return acc;
}

// Blocks of k proposals for m entries: entry i's state hs (i, d) of image imgs[i] predicts
// position pos[i], its sure token props[i][0] is set already, and so are its next given[i]
// proposals where given (recycled: see call_images); heads 2..k's logits come for every entry at
// once, then each entry's other proposals in head order (with nbr_draft a head's prior reads the
// proposals before it, given ones too). toks[i]: the image's decoded tokens, read before pos[i]
// only. Uses w.pre, w.x, w.xn and w.z. Team call.
static void draft(const Engine* E, const Options* o, int m, const int* imgs, const float* hs, const int* pos,
                  int64_t* const* toks, int64_t* const* props, const Work& w, const int* given = nullptr) {
    const int d = E->d, f = E->f, G = E->G, k = o->k, window = o->window;
    const int kh = k < G + 1 ? k : G + 1;  // a block longer than the model's heads keeps the rest as is
    if (kh == 1) return;
    const int nh = kh - 1, P = nh * f;
    linear(hs, d, m, E->heads_up_w, E->heads_up_b, w.pre, P, d, P, true);
    // every head's state at once (row i * nh + g: entry i, head g), in w.x and then w.xn: head g
    // reads hidden chunks 0..g (the nested matrix), plus the residual; the heads' products share
    // out the team with one barrier after the last, and p1's logits are one product for them all
    for (int g = 0; g < nh; g++)
        linear_nowait(w.pre, P, m, E->heads_down_w.at(g * d), E->heads_down_b + g * d, w.x + (size_t)g * d, nh * d,
                      (g + 1) * f, d);
    #pragma omp barrier
    #pragma omp for schedule(static)
    for (int r = 0; r < m * nh; r++) {
        const int i = r / nh, g = r % nh;
        for (int c = 0; c < d; c++) w.x[(size_t)r * d + c] += hs[(size_t)i * d + c];
        layer_norm(w.x + (size_t)r * d, E->heads_ln_w + g * d, E->heads_ln_b + g * d, w.xn + (size_t)r * d, d);
    }
    p1_logits(E, m, imgs, nh, pos, w.xn, w.z, 1);  // head g's target: pos + g + 1
    #pragma omp for schedule(static)
    for (int i = 0; i < m; i++) {
        int64_t* pr = props[i];
        for (int g = given ? given[i] : 0; g < nh; g++) {  // in order: with nbr_draft a head's prior reads the proposals before it
            float* lg = w.z + ((size_t)i * nh + g) * V;
            if (E->has_nbr_prior) add_nbr_prior(E, g, pos[i] + g + 1, toks[i], pr, lg);
            if (o->rule == SAMPLE) pr[g + 1] = draft_sample(E, o, imgs[i], pos[i] + g + 1, g, lg);
            else pr[g + 1] = window > 0 ? window_centre(lg, window) : argmax(lg);
        }
    }
}

// ---------------------------------------------------------------- the exported calls

// How many tokens of a block are kept: the sure one plus the longest run of proposals the rule
// accepts against p1's logits z (k, 256) at the positions before them.
static int accepted(const Options* o, const int64_t* pr, const float* z, int remaining) {
    int acc = 1;
    for (int j = 1; j < o->k; j++) {
        const float* zj = z + (size_t)(j - 1) * V;
        int best = argmax(zj);
        bool ok;
        if (o->rule == EXACT) ok = pr[j] == best;
        else if (o->rule == EPS) ok = std::abs((int)pr[j] - best) <= o->eps;
        else if (o->rule == TOPK) {
            int above = 0;  // values ranked before pr[j] (ties: the lower value first, as topk)
            float zp = zj[pr[j]];
            for (int v = 0; v < V; v++) above += zj[v] > zp || (zj[v] == zp && v < pr[j]);
            ok = above < o->top_k;
        } else ok = true;
        if (!ok) break;
        acc++;
    }
    if (acc < o->min_block) acc = o->min_block;
    return acc < remaining ? acc : remaining;
}

// The first call of images rows[0..n): the start token at position 0, then the first block's
// proposals into props (B, k).
extern "C" void engine_start(const Engine* E, const Options* o, int n, const int64_t* rows,
                             int64_t* toks, int toks_len, int64_t* props) {
    const Work w = work_of(E);
    int* imgs = (int*)std::malloc(2 * n * sizeof(int));
    int* zero = imgs + n;
    int64_t* start = (int64_t*)std::malloc(n * sizeof(int64_t));
    int64_t** ptrs = (int64_t**)std::malloc(2 * n * sizeof(int64_t*));
    for (int i = 0; i < n; i++) {
        imgs[i] = (int)rows[i]; zero[i] = 0; start[i] = -1;
        ptrs[i] = toks + (size_t)imgs[i] * toks_len; ptrs[n + i] = props + (size_t)imgs[i] * o->k;
    }
    #pragma omp parallel num_threads(E->threads)
    {
        const ThreadBuf tb(E);
        const float* h = step(E, n, imgs, 1, start, 1, zero, w, tb);
        p1_logits(E, n, imgs, 1, zero, h, w.z);
        if (E->guard_slope > 0) {  // position 0: no token before it in its cell
            #pragma omp for schedule(static)
            for (int i = 0; i < n; i++) add_cell_guard(E, imgs[i], 0, nullptr, 0, nullptr, w.z + (size_t)i * V);
        }
        #pragma omp for schedule(static)
        for (int i = 0; i < n; i++)
            ptrs[n + i][0] = o->rule == SAMPLE ? sample_first(E, o, imgs[i], 0, w.z + (size_t)i * V, nullptr)
                                               : argmax(w.z + (size_t)i * V);
        draft(E, o, n, imgs, h, zero, ptrs, ptrs + n, w);
    }
    std::free(imgs); std::free(start); std::free(ptrs);
}

// A call for m images (all of a batch's, or a thread's share of them), by a team: the decoder
// step for their k tokens, p1's logits, the acceptance rule and the commit (acc[i]: the tokens
// image i keeps), then the next blocks' drafts for the images that go on (*m2 of them: nimg,
// npos, and their tokens' and proposals' rows in ptoks and pprops; given: scratch for draft).
// With o->recycle, where the rule rejected proposal a, the next block's proposals at the positions
// this call went on to verify are p1's argmax there (logits the call computed anyway) instead of
// the heads': those logits read the rejected token, but p1 one position ahead still guesses the
// exact rule's next token far more often than a head two or more ahead (exact mode's blocks 1.5
// -> 2.1 at k=6: experiments/recycled-proposals/). See engine_iterate.
static void call_images(const Engine* E, const Options* o, int m, const int* imgs, const int* pos, const int64_t* pk,
                        const Work& w, int* acc, int* nimg, int* npos, int64_t** ptoks, int64_t** pprops, int* m2,
                        int64_t* t_arr, int64_t* props, int64_t* toks, int toks_len, uint8_t* block_map,
                        int64_t* hist, int64_t* calls, int propose, int* given) {
    const int k = o->k, d = E->d;
    const ThreadBuf tb(E);
    const float* h = step(E, m, imgs, k, pk, k, pos, w, tb);
    p1_logits(E, m, imgs, k, pos, h, w.z);
    if (E->guard_slope > 0) {  // row j of image i predicts position pos[i] + j, after pk[i][0..j]
        #pragma omp for schedule(static)
        for (int r = 0; r < m * k; r++) {
            const int i = r / k, b = imgs[i], p = pos[i] + r % k;
            if (p < S) add_cell_guard(E, b, p, toks + (size_t)b * toks_len, pos[i] - 1, pk + (size_t)i * k, w.z + (size_t)r * V);
        }
    }
    mark(E, ST_LOGITS);
    #pragma omp for schedule(static)
    for (int i = 0; i < m; i++) {
        int b = imgs[i], t = pos[i] - 1;
        const int64_t* pr = pk + (size_t)i * k;
        const float* z = w.z + (size_t)i * k * V;
        const int drawn = o->rule == SAMPLE ? sample_accepted(E, o, b, t, pr, z) : 0;
        int a = o->rule == SAMPLE ? (drawn < S - t ? drawn : S - t) : accepted(o, pr, z, S - t);
        acc[i] = a;
        for (int j = 0; j < a; j++) {
            toks[(size_t)b * toks_len + t + j] = pr[j];
            block_map[(size_t)b * S + t + j] = (uint8_t)a;
        }
        hist[(size_t)b * k + a - 1] += 1;
        calls[b] += 1;
        t_arr[b] = t + a;
        if (t + a < S && o->rule == SAMPLE)  // a rejected draft's position: drawn from max(0, p - q)
            props[(size_t)b * k] = sample_first(E, o, b, t + a, z + (size_t)(a - 1) * V,
                                                drawn < k ? E->qlog + ((size_t)b * (MAXK - 1) + a - 1) * V : nullptr);
        else if (t + a < S) props[(size_t)b * k] = argmax(z + (size_t)(a - 1) * V);
        if (o->recycle && t + a < S)  // positions t + a + 1 .. t + k (none where all k were kept)
            for (int j = a; j < k; j++) props[(size_t)b * k + 1 + j - a] = argmax(z + (size_t)j * V);
    }
    #pragma omp single
    {
        int c = 0;
        for (int i = 0; i < m; i++) {
            int b = imgs[i];
            if (t_arr[b] >= S) continue;
            nimg[c] = b; npos[c] = (int)t_arr[b]; given[c] = o->recycle ? k - acc[i] : 0;
            std::memcpy(w.att + (size_t)c * d, h + ((size_t)i * k + acc[i] - 1) * d, d * sizeof(float));
            ptoks[c] = toks + (size_t)b * toks_len; pprops[c] = props + (size_t)b * k;
            c++;
        }
        *m2 = c;
    }
    mark(E, ST_ACCEPT);
    if (propose) draft(E, o, *m2, nimg, w.att, npos, ptoks, pprops, w, given);  // ends at a barrier
    mark(E, ST_DRAFT);
}

// The workspace rows of a call's images from the i0-th on (each image has room for MAXK rows in
// every buffer: k tokens in the step, up to MAXK - 1 heads in the draft)
static Work rows_from(const Engine* E, const Work& w, int i0) {
    const size_t r = (size_t)i0 * MAXK, d = E->d;
    return {w.x + r * d, w.xn + r * d, w.qkv + r * 3 * d, w.att + r * d, w.hid + r * E->ff, w.h + r * d,
            w.z + r * V, w.dl + r * d, w.pre + r * E->f};
}

// A call that verifies k > 1 tokens of at least this many images a thread goes by image: each
// thread runs the whole call for its own share of the images (a team of one), with no barrier and
// no rows passed between cores; the same arithmetic as a team's. A greedy call stays shared: its
// few rows a thread would each stream the whole model's weights instead of half of them
// (experiments/engine-synchronization/).
static const int IMAGES_PER_THREAD = 2;

// One blockwise step of every live image rows[0..n): feed its k proposals at the positions after
// its decoded prefix, verify them against p1's logits under the rule, commit the accepted prefix
// to toks (B, toks_len) and block_map (B, 3072), count the call and the block, and draft the next
// block from the state at the last accepted token (its sure token is p1's argmax there, or p1's
// sample under the sample rule). An image
// with one token left takes its sure token without a call. With propose 0 only the sure token of
// the next block is set (the caller proposes the rest). Finished images leave rows (order kept);
// returns how many are left.
static int one_call(const Engine* E, const Options* o, int n, int64_t* rows, int64_t* t_arr, int64_t* props,
                    int64_t* toks, int toks_len, uint8_t* block_map, int64_t* hist, int64_t* calls, int propose) {
    const int k = o->k, T = E->threads;
    const Work w = work_of(E);
    int* ibuf = (int*)std::malloc((6 * (size_t)n + T) * sizeof(int));
    int *imgs = ibuf, *pos = imgs + n, *acc = pos + n, *nimg = acc + n, *npos = nimg + n, *m2 = npos + n;
    int* given = m2 + T;
    int64_t* pk = (int64_t*)std::malloc((size_t)n * k * sizeof(int64_t));
    int64_t** ptrs = (int64_t**)std::malloc(2 * (size_t)n * sizeof(int64_t*));
    int m = 0;
    for (int i = 0; i < n; i++) {  // images that need a call; the one-token-left ones finish here
        int b = (int)rows[i], t = (int)t_arr[b];
        if (S - t > 1) {
            imgs[m] = b; pos[m] = t + 1;
            std::memcpy(pk + (size_t)m * k, props + (size_t)b * k, k * sizeof(int64_t));
            m++;
        } else if (S - t == 1) {
            toks[(size_t)b * toks_len + t] = props[(size_t)b * k];
            block_map[(size_t)b * S + t] = 1;
            hist[(size_t)b * k] += 1;
            t_arr[b] = S;
        }
    }
    if (m) {
        const bool by_image = T > 1 && k > 1 && m >= IMAGES_PER_THREAD * T;
        #pragma omp parallel num_threads(T)
        {
            if (by_image) {
                const int t = omp_get_thread_num(), nt = omp_get_num_threads();
                const int i0 = (int)((long long)m * t / nt), i1 = (int)((long long)m * (t + 1) / nt);
                const Work ws = rows_from(E, w, i0);
                #pragma omp parallel num_threads(1)
                call_images(E, o, i1 - i0, imgs + i0, pos + i0, pk + (size_t)i0 * k, ws, acc + i0, nimg + i0,
                            npos + i0, ptrs + i0, ptrs + n + i0, m2 + t, t_arr, props, toks, toks_len, block_map,
                            hist, calls, propose, given + i0);
            } else {
                call_images(E, o, m, imgs, pos, pk, w, acc, nimg, npos, ptrs, ptrs + n, m2, t_arr, props, toks,
                            toks_len, block_map, hist, calls, propose, given);
            }
        }
    }
    std::free(ibuf); std::free(pk); std::free(ptrs);
    int live = 0;
    for (int i = 0; i < n; i++) if (t_arr[rows[i]] < S) rows[live++] = rows[i];
    return live;
}

// Up to max_calls calls of the n images rows[0:n] (one_call: each a blockwise step of every image
// still decoding), stopping early after a call in which an image finished (the caller notes when);
// rows keeps the live ones first. Returns how many are live, and the calls made in *made (at
// least one while any image is live). Several calls a crossing save the caller's per-call cost
// (the crossing from Python alone, ~0.005 ms, is a tenth of a 1-token call at batch 1).
extern "C" int engine_iterate(const Engine* E, const Options* o, int n, int64_t* rows, int64_t* t_arr,
                              int64_t* props, int64_t* toks, int toks_len, uint8_t* block_map,
                              int64_t* hist, int64_t* calls, int propose, int max_calls, int* made) {
    int live = n, c = 0;
    while ((c < max_calls || c == 0) && live > 0) {
        const int before = live;
        live = one_call(E, o, live, rows, t_arr, props, toks, toks_len, block_map, hist, calls, propose);
        c++;
        if (live < before) break;
    }
    *made = c;
    return live;
}

// The decoder states h (n, d) and p1's logits z (n, 256) for n tokens of image b at positions
// pos0.. (prev: the tokens before them), K/V written as a decoding call writes them.
extern "C" void engine_step(const Engine* E, int b, int n, const int64_t* prev, int pos0, float* h, float* z) {
    const Work w = work_of(E);
    #pragma omp parallel num_threads(E->threads)
    {
        const ThreadBuf tb(E);
        const float* hs = step(E, 1, &b, n, prev, n, &pos0, w, tb);
        p1_logits(E, 1, &b, n, &pos0, hs, w.z);
    }
    std::memcpy(h, w.h, (size_t)n * E->d * sizeof(float));
    std::memcpy(z, w.z, (size_t)n * V * sizeof(float));
}

// Proposals props (m, k) of image b from states hs (m, d) predicting positions pos[i], with sure
// tokens props[i][0] given, heads reading the decoded tokens toks (for the exact-mode replay:
// every position's block at once).
extern "C" void engine_draft(const Engine* E, const Options* o, int b, int m, const float* hs, const int* pos,
                             int64_t* toks, int64_t* props) {
    const Work w = work_of(E);
    int* imgs = (int*)std::malloc(m * sizeof(int));
    int64_t** ptrs = (int64_t**)std::malloc(2 * (size_t)m * sizeof(int64_t*));
    for (int i = 0; i < m; i++) { imgs[i] = b; ptrs[i] = toks; ptrs[m + i] = props + (size_t)i * o->k; }
    #pragma omp parallel num_threads(E->threads)
    {
        amx_call_start();
        draft(E, o, m, imgs, hs, pos, ptrs, ptrs + m, w);
        amx_call_end();
    }
    std::free(imgs); std::free(ptrs);
}
