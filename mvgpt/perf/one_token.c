/* The one-token step of GPT.forward with a KV cache, written out in C (mvgpt/perf/fast_decode.py builds
   it and calls it; mvgpt/model.py is what it computes).

   Why by hand: at batch 1 a token multiplies a vector by every weight matrix, reading each weight
   once for two flops, so the step is bounded by the memory's speed. PyTorch runs it as about a
   hundred operations, each dispatched from Python; torch.compile cut that to one graph, but left
   a Python wrapper, guards and 26 parallel regions around it. Here the step is one call and one
   parallel region: the threads split each matrix's rows, then the heads, and wait for each other
   only where the next stage reads what all of them wrote.

   Numbers are added in float32. With bf16 weights each value is rounded to bf16 where the eager
   bf16 model stores one (the norms' and products' outputs, GELU's, the residual stream, the queries
   and keys turned, the attention's output; its weights too, after the division where PyTorch
   rounds before it), so the two agree to bf16's rounding.

   A product reads 4 rows at a time, each into a 16-wide accumulator of its own (four independent
   sums keep the multiply-add units busy), sharing the loads of the input. bf16 weights are widened
   in registers: a 32-bit lane holding two of them gives the even one shifted up 16 bits and the odd
   one with its low half cleared, so the input is split into its even and odd elements first. The
   vectors are GCC's and clang's vector extensions: the compiler maps them onto the CPU's own
   (AVX-512, AVX2, NEON) with -march=native. */

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; }
#endif

#define W 16 /* floats per vector */
typedef float vf __attribute__((vector_size(W * 4), aligned(4)));
typedef uint32_t vu __attribute__((vector_size(W * 4), aligned(4)));
typedef int32_t vi __attribute__((vector_size(W * 4), aligned(4)));

enum { F32 = 0, BF16 = 1 }; /* the weights' dtype, and the cache's */

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
static inline float get(const void *p, int64_t i, int dt) {
    return dt == F32 ? ((const float *)p)[i] : from_bf16(((const uint16_t *)p)[i]);
}
static inline void put(void *p, int64_t i, float v, int dt) {
    if (dt == F32) ((float *)p)[i] = v; else ((uint16_t *)p)[i] = to_bf16(v);
}
static inline float rnd(float v, int dt) { return dt == F32 ? v : from_bf16(to_bf16(v)); }

/* ---------------------------------------------------------------------------------------------
   Rows against a vector: the products, and attention's scores and weighted values */

/* how many of a row's n elements the vector loops take; the scalar tail does the rest */
static inline int64_t vector_part(int64_t n, int dt) { return dt == F32 ? n / W * W : n / (2 * W) * (2 * W); }

/* x's even elements into xe and odd ones into xo, for the first m of n (bf16 rows are read as pairs) */
static void split(const float *x, int64_t m, float *xe, float *xo) {
    for (int64_t j = 0; j < m / 2; j++) { xe[j] = x[2 * j]; xo[j] = x[2 * j + 1]; }
}

/* x . row in scalars, for the n elements the vector loops leave */
static float dot_tail(const void *row, int64_t n, const float *x, int dt) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += x[i] * get(row, i, dt);
    return s;
}

/* x . row, for one row of n (a head's key, or a product's last rows); xe, xo: split(x) */
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

/* ask the memory for the bytes `at` past each of four rows (a hint: it never faults, even past the end) */
static inline void ahead(const char *r0, const char *r1, const char *r2, const char *r3, int64_t at) {
    __builtin_prefetch(r0 + at), __builtin_prefetch(r1 + at), __builtin_prefetch(r2 + at), __builtin_prefetch(r3 + at);
}

/* acc[r] = x . w[o + r], for the 4 rows from o of w (n wide): dot() four times over, each row with its
   own accumulator (written out, so that they stay in registers), the input's loads shared. Unrolled
   twice: 8 cache lines asked for at once instead of 4, which the memory serves faster (rows are short
   streams for the prefetcher: 12 lines for a bf16 row of 384); bf16's products alone took a quarter
   less time so on an AMD EPYC. And the same places of the rows 8 further on are asked for now, to be
   at hand when their turn comes: the step took a tenth less time again, with 1 thread or 2. */
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

enum { STORE, ADD, GELU, LOGITS }; /* what a product does with its sum: store it, add it to the
                                      residual stream, store its GELU, store it in the weights' dtype */

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

/* ---------------------------------------------------------------------------------------------
   The step */

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

/* The weights, in the order of fast_decode.step_weights: the token embedding; per layer ln_1 (weight,
   bias), qkv, proj, ln_2, fc, mlp's proj (each weight, bias; a product's bias may be NULL); ln_f
   (weight, bias); the output layer. */
enum { LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, FC_W, FC_B, MPROJ_W, MPROJ_B, PER_LAYER };

/* One token for each of B sequences: their logits (B, vocab), and their keys and values written
   into the cache.
   token (B); rope: cos, sin, the position's angles (head/2 each, in angles_dt), or learned
   positions: position, the position's row (C) of the table; cache_k, cache_v: the first row held,
   of `held` rows of head-size elements per (layer, sequence, head), at strides sL, sB, sH elements,
   the new token's going to the row after them (the caller has made room there). scratch: x, h, att
   (B, C), qkv (B, 3C), f (B, 4C), the attention's weights (B, H, held + 1), and each thread's own
   (B, 4C), in floats. Returns 0, or 1 + the first sequence whose token is not in the vocabulary
   (then nothing is written). */
int one_token(const void *const *weights, int dt, int64_t n_layer, int64_t C, int64_t H, int64_t vocab,
               const int64_t *token, int64_t B, const void *cos, const void *sin, int angles_dt,
               const void *position, void *cache_k, void *cache_v, int64_t sL, int64_t sB, int64_t sH,
               int64_t held, void *logits, float *scratch, int threads) {
    int64_t hs = C / H, half = hs / 2, size = dt == F32 ? 4 : 2;
    float *x = scratch, *h = x + B * C, *att = h + B * C, *qkv = att + B * C, *f = qkv + 3 * B * C;
    float *p_all = f + 4 * B * C, *mine_all = p_all + B * H * (held + 1);
    const float scale = 1.0f / sqrtf((float)hs);
    for (int64_t s = 0; s < B; s++)
        if (token[s] < 0 || token[s] >= vocab) return (int)s + 1;
    #pragma omp parallel num_threads(threads)
    {
        float *mine = mine_all + (int64_t)omp_get_thread_num() * B * 4 * C;
        #pragma omp for schedule(static)
        for (int64_t s = 0; s < B; s++)  /* the token's row (plus the position's, for learned positions) */
            for (int64_t i = 0; i < C; i++) {
                float e = get(weights[0], token[s] * C + i, dt);
                x[s * C + i] = position ? rnd(e + get(position, i, dt), dt) : e;
            }
        for (int64_t l = 0; l < n_layer; l++) {
            const void *const *w = weights + 1 + l * PER_LAYER;
            norm(x, B, C, w[LN1_W], w[LN1_B], dt, h);
            product(h, B, w[QKV_W], w[QKV_B], 3 * C, C, dt, qkv, STORE, mine);
            #pragma omp for schedule(static)
            for (int64_t sh = 0; sh < B * H; sh++) {  /* one head of one sequence */
                int64_t s = sh / H, hd = sh % H;
                float *q = qkv + s * 3 * C + hd * hs, *k = q + C, *v = q + 2 * C;
                if (cos)  /* rope: turn the pairs (i, i + head/2) of the query and of the key */
                    for (int64_t i = 0; i < half; i++) {
                        float c = get(cos, i, angles_dt), sn = get(sin, i, angles_dt);
                        float q1 = q[i], q2 = q[half + i], k1 = k[i], k2 = k[half + i];
                        q[i] = rnd(q1 * c - q2 * sn, dt), q[half + i] = rnd(q1 * sn + q2 * c, dt);
                        k[i] = rnd(k1 * c - k2 * sn, dt), k[half + i] = rnd(k1 * sn + k2 * c, dt);
                    }
                int64_t at = l * sL + s * sB + hd * sH;  /* this head's first row held, in elements */
                const char *K = (const char *)cache_k + at * size, *V = (const char *)cache_v + at * size;
                for (int64_t i = 0; i < hs; i++) {  /* the new key and value: the row after those held */
                    put(cache_k, at + held * hs + i, k[i], dt);
                    put(cache_v, at + held * hs + i, v[i], dt);
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
            product(att, B, w[PROJ_W], w[PROJ_B], C, C, dt, x, ADD, mine);
            norm(x, B, C, w[LN2_W], w[LN2_B], dt, h);
            product(h, B, w[FC_W], w[FC_B], 4 * C, C, dt, f, GELU, mine);
            product(f, B, w[MPROJ_W], w[MPROJ_B], C, 4 * C, dt, x, ADD, mine);
        }
        const void *const *last = weights + 1 + n_layer * PER_LAYER;
        norm(x, B, C, last[0], last[1], dt, h);
        product(h, B, last[2], NULL, vocab, C, dt, logits, LOGITS, mine);
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
