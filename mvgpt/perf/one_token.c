/* The one-token step of GPT.forward with a KV cache, written out in C. mvgpt/model.py is what it
   computes; mvgpt/perf/fast_decode.py builds this file with the machine's C compiler and calls it.

   Why by hand: at batch 1 a token multiplies a vector by every weight matrix, reading each weight
   once for two flops, so the step is bounded by the memory's speed. PyTorch runs it as about a
   hundred operations, each dispatched from Python. Here the step is one call and one parallel
   region: the threads split each matrix's rows, then the heads, and wait for each other only where
   the next stage reads what all of them wrote. The threads are OpenMP's, as torch's are: the library
   links the libgomp torch has loaded, so the two share one pool instead of fighting for the cores.

   Numbers are added in float32. With bf16 weights each value is rounded to bf16 where the eager
   bf16 model stores one (the norms' and products' outputs, GELU's, the residual stream, the queries
   and keys turned, the attention's output; its weights too, after the division where PyTorch
   rounds before it), so the two agree to bf16's rounding.

   Reading order: the types (the model's weights, one call's arguments, the numbers), the step,
   then the kernels in the order the step calls them. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
#endif

/* ---------------------------------------------------------------------------------------------
   The types: fast_decode.py builds the same structs with ctypes (BlockWeights, ModelWeights, StepArgs) */

enum { F32 = 0, BF16 = 1 }; /* the weights' dtype, and the cache's; the angles' too */

/* One block's weights, C channels: all of the model's dtype, each contiguous. A bias may be NULL
   (a norm without one adds 0; a norm without a weight multiplies by 1). */
typedef struct {
    const void *ln_1_weight, *ln_1_bias;         /* (C), (C) */
    const void *qkv_weight, *qkv_bias;           /* (3C, C), (3C): queries, keys, values at once */
    const void *proj_weight, *proj_bias;         /* (C, C), (C): attention's output */
    const void *ln_2_weight, *ln_2_bias;         /* (C), (C) */
    const void *fc_weight, *fc_bias;             /* (4C, C), (4C) */
    const void *mlp_proj_weight, *mlp_proj_bias; /* (C, 4C), (C) */
} BlockWeights;

/* The model: its shape, its dtype, its weights. */
typedef struct {
    int64_t n_layer, n_embd, n_head, vocab_size; /* L, C, H, V; a head is C / H wide */
    int dtype;                                   /* F32 or BF16 */
    const void *wte;                             /* (V, C): the token embedding */
    const void *wpe;                             /* (block_size, C): learned positions; NULL for rope */
    const BlockWeights *blocks;                  /* (L) */
    const void *ln_f_weight, *ln_f_bias;         /* (C), (C) */
    const void *lm_head;                         /* (V, C): the output layer (no bias) */
} ModelWeights;

/* One call: one new token for each of B sequences. */
typedef struct {
    const int64_t *tokens;  /* (B) */
    int64_t batch;          /* B */
    const void *cos, *sin;  /* rope: the position's angles, head/2 each, in angles_dtype; NULL: learned */
    int angles_dtype;
    int64_t position;       /* learned positions: the row of wpe to add */
    void *cache_k, *cache_v; /* the first row held of (layer 0, sequence 0, head 0), in the model's dtype */
    int64_t stride_layer, stride_batch, stride_head; /* in elements: where each (layer, sequence, head)'s
                               rows start; its rows, a head wide each, follow one another */
    int64_t held;           /* rows held; the new token's key and value go to the row after them */
    void *logits;           /* (B, V) out, in the model's dtype */
    float *scratch;         /* x, h, att (B, C), qkv (B, 3C), f (B, 4C), the attention's weights
                               (B, H, held + 1), then each thread's own (B, 4C): in floats */
    int threads;
} StepArgs;

/* The numbers: 16 floats to a vector. GCC's and clang's vector extensions: with -march=native the
   compiler maps them onto the CPU's own (AVX-512, AVX2, NEON). */
#define W 16
typedef float vf __attribute__((vector_size(W * 4), aligned(4)));
typedef uint32_t vu __attribute__((vector_size(W * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(W * 4), aligned(4)));

static inline vf loadf(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline vu loadu(const void *p) { vu v; memcpy(&v, p, sizeof v); return v; }
static inline void storef(float *p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf asf(vu u) { vf v; memcpy(&v, &u, sizeof v); return v; }
static inline float hsum(vf v) { float s = 0; for (int i = 0; i < W; i++) s += v[i]; return s; }
static inline float from_bf16(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t to_bf16(float f) { /* to the nearest, ties to even, as torch rounds */
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* a NaN stays one */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
/* element i of p, in dtype dt, as a float; and back */
static inline float get(const void *p, int64_t i, int dt) {
    return dt == F32 ? ((const float *)p)[i] : from_bf16(((const uint16_t *)p)[i]);
}
static inline void put(void *p, int64_t i, float v, int dt) {
    if (dt == F32) ((float *)p)[i] = v; else ((uint16_t *)p)[i] = to_bf16(v);
}
/* v as the eager model stores it: bf16's rounding with bf16 weights */
static inline float rnd(float v, int dt) { return dt == F32 ? v : from_bf16(to_bf16(v)); }

/* ---------------------------------------------------------------------------------------------
   The kernels, in the order the step calls them (defined after it) */

enum { STORE, ADD, GELU, LOGITS }; /* what a product does with its sum: store it, add it to the
                                      residual stream, store its GELU, store it in the weights' dtype */

static void embed(const ModelWeights *m, const StepArgs *a, float *x);
static void norm(const float *x, int64_t B, int64_t C, const void *w, const void *b, int dt, float *h);
static void product(const float *x, int64_t B, const void *w, const void *b, int64_t out, int64_t n, int dt,
                    void *y, int mode, float *mine);
static inline int64_t vector_part(int64_t n, int dt);
static void split(const float *x, int64_t m, float *xe, float *xo);
static inline void four_rows(const void *w, int64_t o, int64_t n, const float *x, const float *xe, const float *xo,
                             int dt, float *acc);
static inline void ahead(const char *r0, const char *r1, const char *r2, const char *r3, int64_t at);
static inline float dot(const void *row, int64_t n, const float *x, const float *xe, const float *xo, int dt);
static float dot_tail(const void *row, int64_t n, const float *x, int dt);
static void attention(const ModelWeights *m, const StepArgs *a, int64_t layer, float *qkv, float *p_all,
                      float *mine, float *att);
static void turn(float *q, float *k, int64_t half, const void *cos, const void *sin, int angles_dt, int dt);
static float exps(float *p, int64_t n, float top);
static void weighted(const void *V, int64_t n, int64_t hs, const float *p, float *y, int dt);

/* ---------------------------------------------------------------------------------------------
   The step */

/* GPT.forward for one token of each sequence, with the cache: the logits (B, V) into a->logits, and
   each block's new key and value written into the cache. Returns 0, or 1 + the first sequence whose
   token is not in the vocabulary (then nothing is written). */
int one_token(const ModelWeights *m, const StepArgs *a) {
    const int64_t B = a->batch, C = m->n_embd, H = m->n_head;
    const int dt = m->dtype;
    for (int64_t s = 0; s < B; s++)
        if (a->tokens[s] < 0 || a->tokens[s] >= m->vocab_size) return (int)s + 1;
    float *x = a->scratch, *h = x + B * C, *att = h + B * C, *qkv = att + B * C, *f = qkv + 3 * B * C;
    float *p_all = f + 4 * B * C, *mine_all = p_all + B * H * (a->held + 1);
    #pragma omp parallel num_threads(a->threads)
    {
        float *mine = mine_all + (int64_t)omp_get_thread_num() * B * 4 * C;  /* this thread's scratch */

        /* x = wte[token] (+ wpe[position]): the residual stream, (B, C) */
        embed(m, a, x);
        for (int64_t l = 0; l < m->n_layer; l++) {
            const BlockWeights *w = &m->blocks[l];
            /* x = x + attn(ln_1(x)): the queries, keys and values, attention over the cache, its projection */
            norm(x, B, C, w->ln_1_weight, w->ln_1_bias, dt, h);
            product(h, B, w->qkv_weight, w->qkv_bias, 3 * C, C, dt, qkv, STORE, mine);
            attention(m, a, l, qkv, p_all, mine, att);
            product(att, B, w->proj_weight, w->proj_bias, C, C, dt, x, ADD, mine);
            /* x = x + mlp(ln_2(x)): fc, GELU, proj */
            norm(x, B, C, w->ln_2_weight, w->ln_2_bias, dt, h);
            product(h, B, w->fc_weight, w->fc_bias, 4 * C, C, dt, f, GELU, mine);
            product(f, B, w->mlp_proj_weight, w->mlp_proj_bias, C, 4 * C, dt, x, ADD, mine);
        }
        /* logits = lm_head(ln_f(x)), in the weights' dtype */
        norm(x, B, C, m->ln_f_weight, m->ln_f_bias, dt, h);
        product(h, B, m->lm_head, NULL, m->vocab_size, C, dt, a->logits, LOGITS, mine);
    }
    return 0;
}

/* One product alone, in a parallel region of its own (dev/decode_parts.py times the step's parts):
   y (B, out) in the weights' dtype; scratch: threads * B * n floats. */
void matvec(const float *x, int64_t B, const void *w, const void *b, int64_t out, int64_t n, int dt, void *y,
            float *scratch, int threads) {
    #pragma omp parallel num_threads(threads)
    product(x, B, w, b, out, n, dt, y, LOGITS, scratch + (int64_t)omp_get_thread_num() * B * n);
}

/* ---------------------------------------------------------------------------------------------
   The embedding and the norm */

/* x (B, C) = each token's row of wte, plus the position's row of wpe for learned positions */
static void embed(const ModelWeights *m, const StepArgs *a, float *x) {
    const int64_t C = m->n_embd;
    const int dt = m->dtype;
    #pragma omp for schedule(static)
    for (int64_t s = 0; s < a->batch; s++)
        for (int64_t i = 0; i < C; i++) {
            float e = get(m->wte, a->tokens[s] * C + i, dt);
            x[s * C + i] = m->wpe ? rnd(e + get(m->wpe, a->position * C + i, dt), dt) : e;
        }
}

/* LayerNorm of each sequence's x (C) into h, with nn.LayerNorm's eps: in float32, rounded as the weights */
static void norm(const float *x, int64_t B, int64_t C, const void *w, const void *b, int dt, float *h) {
    #pragma omp for schedule(static)
    for (int64_t s = 0; s < B; s++) {
        const float *xs = x + s * C;
        float mean = 0, var = 0;
        for (int64_t i = 0; i < C; i++) mean += xs[i];
        mean /= C;
        for (int64_t i = 0; i < C; i++) var += (xs[i] - mean) * (xs[i] - mean);
        float inv = 1.0f / sqrtf(var / C + 1e-5f);
        for (int64_t i = 0; i < C; i++)  /* a norm without weight or bias (NULL) has 1 and 0 there */
            h[s * C + i] = rnd((xs[i] - mean) * inv * (w ? get(w, i, dt) : 1.0f) + (b ? get(b, i, dt) : 0.0f), dt);
    }
}

/* ---------------------------------------------------------------------------------------------
   The products: rows against a vector.

   A product reads 4 rows at a time, each into a 16-wide accumulator of its own (four independent
   sums keep the multiply-add units busy), sharing the loads of the input. bf16 weights are widened
   in registers: a 32-bit lane holding two of them gives the even one shifted up 16 bits and the odd
   one with its low half cleared, so the input is split into its even and odd elements first. */

/* y (B, out) from x (B, n) @ w (out, n)^T + b (b may be NULL): each sum rounded to the weights'
   dtype, then as `mode` says. Every thread of the region calls it; `mine` is this thread's scratch
   (B * n floats), where it splits x for itself, so no thread waits for another before the rows. */
static void product(const float *x, int64_t B, const void *w, const void *b, int64_t out, int64_t n, int dt,
                    void *y, int mode, float *mine) {
    int64_t half = n / 2;
    if (dt == BF16)
        for (int64_t s = 0; s < B; s++) split(x + s * n, vector_part(n, dt), mine + s * n, mine + s * n + half);
    #pragma omp for schedule(static)
    for (int64_t o = 0; o < out; o += 4) {
        int R = out - o < 4 ? (int)(out - o) : 4;
        for (int64_t s = 0; s < B; s++) {
            const float *xs = x + s * n, *xe = mine + s * n, *xo = mine + s * n + half;
            float acc[4];
            if (R == 4) four_rows(w, o, n, xs, xe, xo, dt, acc);
            else for (int r = 0; r < R; r++) acc[r] = dot((const char *)w + (o + r) * n * (dt == F32 ? 4 : 2), n, xs, xe, xo, dt);
            for (int r = 0; r < R; r++) {
                float v = rnd(acc[r] + (b ? get(b, o + r, dt) : 0.0f), dt);
                int64_t at = s * out + o + r;
                float *f = (float *)y;
                if (mode == STORE) f[at] = v;
                else if (mode == ADD) f[at] = rnd(f[at] + v, dt);
                else if (mode == GELU) f[at] = rnd(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)), dt); /* exact */
                else put(y, at, v, dt);
            }
        }
    }
}

/* how many of a row's n elements the vector loops take; the scalar tail does the rest */
static inline int64_t vector_part(int64_t n, int dt) { return dt == F32 ? n / W * W : n / (2 * W) * (2 * W); }

/* x's even elements into xe and odd ones into xo, for the first m of n (bf16 rows are read as pairs) */
static void split(const float *x, int64_t m, float *xe, float *xo) {
    for (int64_t j = 0; j < m / 2; j++) { xe[j] = x[2 * j]; xo[j] = x[2 * j + 1]; }
}

/* acc[r] = x . w[o + r], for the 4 rows from o of w (n wide): dot() four times over, each row with its
   own accumulator (written out, so that they stay in registers), the input's loads shared. Unrolled
   twice, and asking for the same places of the rows 8 further on: more cache lines asked for at once,
   which the memory serves faster than the prefetcher's guesses along rows this short. */
static inline void four_rows(const void *w, int64_t o, int64_t n, const float *x, const float *xe, const float *xo,
                             int dt, float *acc) {
    vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
    int64_t nv = vector_part(n, dt), size = dt == F32 ? 4 : 2;
    const char *r0 = (const char *)w + o * n * size, *r1 = r0 + n * size, *r2 = r1 + n * size, *r3 = r2 + n * size;
    if (dt == F32)
        _Pragma("GCC unroll 2") for (int64_t i = 0; i < nv; i += W) {
            vf xv = loadf(x + i);
            ahead(r0, r1, r2, r3, 8 * n * size + i * size);
            a0 += xv * loadf((const float *)r0 + i), a1 += xv * loadf((const float *)r1 + i);
            a2 += xv * loadf((const float *)r2 + i), a3 += xv * loadf((const float *)r3 + i);
        }
    else
        _Pragma("GCC unroll 2") for (int64_t i = 0; i < nv; i += 2 * W) {
            vf e = loadf(xe + i / 2), od = loadf(xo + i / 2);
            ahead(r0, r1, r2, r3, 8 * n * size + i * size);
            vu u0 = loadu((const uint16_t *)r0 + i), u1 = loadu((const uint16_t *)r1 + i);
            vu u2 = loadu((const uint16_t *)r2 + i), u3 = loadu((const uint16_t *)r3 + i);
            a0 += e * asf(u0 << 16), a1 += e * asf(u1 << 16), a2 += e * asf(u2 << 16), a3 += e * asf(u3 << 16);
            a0 += od * asf(u0 & 0xffff0000u), a1 += od * asf(u1 & 0xffff0000u);  /* each a multiply-add */
            a2 += od * asf(u2 & 0xffff0000u), a3 += od * asf(u3 & 0xffff0000u);
        }
    acc[0] = hsum(a0) + dot_tail(r0 + nv * size, n - nv, x + nv, dt);
    acc[1] = hsum(a1) + dot_tail(r1 + nv * size, n - nv, x + nv, dt);
    acc[2] = hsum(a2) + dot_tail(r2 + nv * size, n - nv, x + nv, dt);
    acc[3] = hsum(a3) + dot_tail(r3 + nv * size, n - nv, x + nv, dt);
}

/* ask the memory for the bytes `at` past each of four rows (a hint: it never faults, even past the end) */
static inline void ahead(const char *r0, const char *r1, const char *r2, const char *r3, int64_t at) {
    __builtin_prefetch(r0 + at), __builtin_prefetch(r1 + at), __builtin_prefetch(r2 + at), __builtin_prefetch(r3 + at);
}

/* x . row, for one row of n (a product's last rows, or a head's key); xe, xo: split(x) */
static inline float dot(const void *row, int64_t n, const float *x, const float *xe, const float *xo, int dt) {
    int64_t nv = vector_part(n, dt);
    vf a = {0};
    if (dt == F32)
        for (int64_t i = 0; i < nv; i += W) a += loadf(x + i) * loadf((const float *)row + i);
    else
        for (int64_t i = 0; i < nv; i += 2 * W) {
            vu u = loadu((const uint16_t *)row + i);
            a += loadf(xe + i / 2) * asf(u << 16) + loadf(xo + i / 2) * asf(u & 0xffff0000u);
        }
    return hsum(a) + dot_tail((const char *)row + nv * (dt == F32 ? 4 : 2), n - nv, x + nv, dt);
}

/* x . row in scalars, for the n elements the vector loops leave */
static float dot_tail(const void *row, int64_t n, const float *x, int dt) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i] * get(row, i, dt);
    return s;
}

/* ---------------------------------------------------------------------------------------------
   Attention over the cache */

/* Block `layer`'s attention for every head of every sequence, from qkv (B, 3C) into att (B, C): the
   query and key turned (rope), the new key and value written into the cache, then the new query's
   scores against the held keys and its own, one softmax, and the values weighted. p_all: the
   weights' scratch, (B, H, held + 1); mine: this thread's own. */
static void attention(const ModelWeights *m, const StepArgs *a, int64_t layer, float *qkv, float *p_all,
                      float *mine, float *att) {
    const int64_t C = m->n_embd, H = m->n_head, hs = C / H, half = hs / 2, held = a->held;
    const int dt = m->dtype;
    const int64_t size = dt == F32 ? 4 : 2;
    const float scale = 1.0f / sqrtf((float)hs);
    #pragma omp for schedule(static)
    for (int64_t sh = 0; sh < a->batch * H; sh++) {  /* one head of one sequence */
        int64_t s = sh / H, hd = sh % H;
        float *q = qkv + s * 3 * C + hd * hs, *k = q + C, *v = q + 2 * C;
        if (a->cos)  /* rope: turn the query and the key by the position's angles */
            turn(q, k, half, a->cos, a->sin, a->angles_dtype, dt);
        int64_t at = layer * a->stride_layer + s * a->stride_batch + hd * a->stride_head;  /* its first row held */
        const char *K = (const char *)a->cache_k + at * size, *V = (const char *)a->cache_v + at * size;
        for (int64_t i = 0; i < hs; i++) {  /* the new key and value: the row after those held */
            put(a->cache_k, at + held * hs + i, k[i], dt);
            put(a->cache_v, at + held * hs + i, v[i], dt);
        }
        /* the scores of the held keys and the new one, then one softmax over them, in float32 */
        float *p = p_all + sh * (held + 1), *y = att + s * C + hd * hs, top = -INFINITY;
        float *qe = mine, *qo = mine + half;
        split(q, vector_part(hs, dt), qe, qo);
        for (int64_t j = 0; j <= held; j++) {
            p[j] = dot(K + j * hs * size, hs, q, qe, qo, dt) * scale;
            top = p[j] > top ? p[j] : top;
        }
        float sum = exps(p, held + 1, top);
        for (int64_t j = 0; j <= held; j++) p[j] = rnd(p[j] / sum, dt);
        /* the values, weighted: the new one's too, as it is in the cache now */
        weighted(V, held + 1, hs, p, y, dt);
        for (int64_t i = 0; i < hs; i++) y[i] = rnd(y[i], dt);
    }
}

/* rope: turn the pairs (i, i + head/2) of a head's query q and key k by the angles cos, sin (head/2 each) */
static void turn(float *q, float *k, int64_t half, const void *cos, const void *sin, int angles_dt, int dt) {
    for (int64_t i = 0; i < half; i++) {
        float c = get(cos, i, angles_dt), sn = get(sin, i, angles_dt);
        float q1 = q[i], q2 = q[half + i], k1 = k[i], k2 = k[half + i];
        q[i] = rnd(q1 * c - q2 * sn, dt), q[half + i] = rnd(q1 * sn + q2 * c, dt);
        k[i] = rnd(k1 * c - k2 * sn, dt), k[half + i] = rnd(k1 * sn + k2 * c, dt);
    }
}

/* p[j] = e^(p[j] - top) for j < n, returning their sum: softmax's exponentials, 16 at a time. e^x for
   x <= 0 as the float32 libraries make it (Cephes' expf): x = k ln 2 + r, |r| <= ln 2 / 2, e^r by a
   polynomial, times 2^k put straight into the exponent's bits. Within 1 unit of float32's last place
   of expf over [-87, 0] (a million points checked); below e^-87 (a weight of 10^-38) it stays there. */
static float exps(float *p, int64_t n, float top) {
    vf sum = {0};
    int64_t nv = n / W * W;
    for (int64_t j = 0; j < nv; j += W) {
        vf x = loadf(p + j) - top;
        vi low = x < -87.0f;
        x = (vf)(((vu)low & (vu)((vf){0} - 87.0f)) | (~(vu)low & (vu)x));
        vi k = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi); /* x / ln 2, to the nearest */
        vf kf = __builtin_convertvector(k, vf);
        vf r = x - kf * 0.693359375f + kf * 2.12194440e-4f; /* x - k ln 2, ln 2 in two parts */
        vf e = 1.9875691500e-4f * r + 1.3981999507e-3f;
        e = e * r + 8.3334519073e-3f, e = e * r + 4.1665795894e-2f, e = e * r + 1.6666665459e-1f;
        e = e * r + 5.0000001201e-1f, e = e * r * r + r + 1.0f;
        e *= (vf)((vu)(k + 127) << 23); /* 2^k */
        storef(p + j, e);
        sum += e;
    }
    float s = hsum(sum);
    for (int64_t j = nv; j < n; j++) s += p[j] = expf(p[j] - top);
    return s;
}

/* y (hs) = sum of p[j] * row j of V, for n rows of a head's values, in float32. A 16-wide piece of y at
   a time (32 with bf16: even and odd elements), summed in registers in four independent chains of
   multiply-adds, not one waiting on the last (4 rows at once; with bf16, 2 rows' even and odd halves). */
static void weighted(const void *V, int64_t n, int64_t hs, const float *p, float *y, int dt) {
    int64_t nv = vector_part(hs, dt), n4 = n / 4 * 4;
    if (dt == F32)
        for (int64_t c = 0; c < nv; c += W) {
            const float *v = (const float *)V + c;
            vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int64_t j = 0; j < n4; j += 4) {
                a0 += p[j] * loadf(v + j * hs), a1 += p[j + 1] * loadf(v + (j + 1) * hs);
                a2 += p[j + 2] * loadf(v + (j + 2) * hs), a3 += p[j + 3] * loadf(v + (j + 3) * hs);
            }
            for (int64_t j = n4; j < n; j++) a0 += p[j] * loadf(v + j * hs);
            storef(y + c, (a0 + a1) + (a2 + a3));
        }
    else
        for (int64_t c = 0; c < nv; c += 2 * W) {
            const uint16_t *v = (const uint16_t *)V + c;
            vf e0 = {0}, e1 = {0}, o0 = {0}, o1 = {0};
            for (int64_t j = 0; j < n4; j += 2) {
                vu u0 = loadu(v + j * hs), u1 = loadu(v + (j + 1) * hs);
                e0 += p[j] * asf(u0 << 16), o0 += p[j] * asf(u0 & 0xffff0000u);
                e1 += p[j + 1] * asf(u1 << 16), o1 += p[j + 1] * asf(u1 & 0xffff0000u);
            }
            for (int64_t j = n4; j < n; j++) {
                vu u = loadu(v + j * hs);
                e0 += p[j] * asf(u << 16), o0 += p[j] * asf(u & 0xffff0000u);
            }
            vf e = e0 + e1, o = o0 + o1;
            for (int i = 0; i < W; i++) y[c + 2 * i] = e[i], y[c + 2 * i + 1] = o[i];
        }
    for (int64_t i = nv; i < hs; i++) {
        y[i] = 0;
        for (int64_t j = 0; j < n; j++) y[i] += p[j] * get(V, j * hs + i, dt);
    }
}
