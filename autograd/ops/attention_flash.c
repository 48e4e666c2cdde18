// attention (flash): causal grouped-query attention as FlashAttention-2 computes it. The forward
// walks key/value tiles of BC keys for each block of BR queries with an online softmax (a
// running maximum and sum per query row), so nothing T x T is ever allocated; it keeps what
// PyTorch's flash kernel keeps for backward: q, k and v (at the key-value heads, as SDPA with
// enable_gqa), the output and a float32 log-sum-exp per query row. The backward recomputes the
// probabilities tile by tile from q, k and the log-sum-exp:
//   D_i = rowsum(dO_i ∘ O_i); per key tile j and query block i:
//   P = exp(Q_i K_jᵀ / sqrt(D) - lse_i), dV_j += Pᵀ dO_i, dP = dO_i V_jᵀ, dS = P ∘ (dP - D_i),
//   dQ_i += dS K_j / sqrt(D), dK_j += dSᵀ Q_i / sqrt(D).
// Threads: the forward over (batch, query head, query block); the backward over (batch,
// key-value head, key tile), each task owning its rows of dK and dV (summed over the query
// heads of the group in the task's accumulators) and adding into dQ under one of a few locks.
// Workspace: per thread, a few tiles (BR x BC, BR x D, BC x D floats), billed as one block.
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "ag_ops.h"

#define BR AG_FLASH_BR
#define BC AG_FLASH_BC
#define NLOCKS 64

// ---------------------------------------------------------------------------------------------
// The op

// Where the output of (b, h, query i) lies: [B, Tq, Hq*D] (LEAN, the op's own output) or
// [B, Hq, Tq, D] (PYTORCH: SDPA's output before transformers' transpose(1, 2).contiguous()).
typedef struct {
    int64_t sb, sh, st;
} out_strides;

static out_strides strides_of(const ag_att_dims *a, bool heads_first) {
    int64_t D = a->D, Hq = a->Hq, Tq = a->Tq;
    return heads_first ? (out_strides){Hq * Tq * D, Tq * D, D} : (out_strides){Tq * Hq * D, D, Hq * D};
}

static double att_macs(const ag_att_dims *a) {
    return (double)a->B * a->Hq * (double)a->Tq * (double)a->Tk * a->D; // within a factor 2 (causal)
}

static int64_t blocks_of(int64_t n, int64_t b) { return (n + b - 1) / b; }
static int64_t round_up(int64_t n, int64_t m) { return m > 1 ? blocks_of(n, m) * m : n; }

static int forward_threads(const ag_att_dims *a) {
    return ag_flash_threads(a->B * a->Hq * blocks_of(a->Tq, BR), att_macs(a));
}

typedef struct {
    const ag_att_dims *a;
    ag_buf q, k, v, o;
    float *lse, *ws;
    int64_t lse_ld; // the log-sum-exp's row of one head: Tq, rounded up as the kernel pads it
    out_strides os;
} fwd_args;

// Tasks [lo, hi): one block of queries of one head each, the last query blocks first (they see
// the most keys).
static void forward_part(void *p, int64_t lo, int64_t hi, int thread) {
    const fwd_args *x = p;
    const ag_att_dims *a = x->a;
    const int rep = a->Hq / a->Hkv, D = a->D;
    const int64_t ldq = (int64_t)a->Hq * D, ldk = (int64_t)a->Hkv * D, nqb = blocks_of(a->Tq, BR), heads = a->B * a->Hq;
    const out_strides os = x->os;
    float *mine = x->ws + (size_t)thread * ag_flash_rows_floats(D), *lse = x->lse;
    // 16-bit tensors: each block of queries, tile of keys and values, and block of the output
    // passes through float32 (the tiles the kernel reads anyway).
    const bool f32 = x->q.t == AG_F32 && x->k.t == AG_F32 && x->v.t == AG_F32 && x->o.t == AG_F32;
    float qb[f32 ? 1 : BR * D], kb[f32 ? 1 : BC * D], vb[f32 ? 1 : BC * D], ob[f32 ? 1 : BR * D];
    {
        for (int64_t t = lo; t < hi; t++) {
            int64_t ib = nqb - 1 - t / heads, b = (t % heads) / a->Hq, r0 = ib * BR;
            int h = (int)(t % a->Hq), g = h / rep;
            int64_t nr = a->Tq - r0 < BR ? a->Tq - r0 : BR, qpos0 = r0 + a->Tk - a->Tq, klast = qpos0 + nr - 1;
            ag_flash_rows w;
            ag_flash_rows_begin(&w, mine, ag_tile_f32(x->q, (b * a->Tq + r0) * ldq + (int64_t)h * D, ldq, nr, D, qb),
                                f32 ? ldq : D, nr, D);
            w.window = a->window;
            // tiles wholly behind the block's first query's window hold no key it sees
            for (int64_t c0 = ag_window_first(qpos0, a->window) / BC * BC; c0 <= klast; c0 += BC) {
                int64_t nk = klast + 1 - c0 < BC ? klast + 1 - c0 : BC;
                const int64_t off = (b * a->Tk + c0) * ldk + (int64_t)g * D, ld = f32 ? ldk : D;
                ag_flash_rows_tile(&w, ag_tile_f32(x->k, off, ldk, nk, D, kb), ld,
                                   ag_tile_f32(x->v, off, ldk, nk, D, vb), ld, nk, c0, qpos0, NULL);
            }
            const int64_t at = b * os.sb + h * os.sh + r0 * os.st;
            float *lr = lse ? lse + (b * a->Hq + h) * x->lse_ld + r0 : NULL;
            if (f32) {
                ag_flash_rows_end(&w, (float *)x->o.p + at, os.st, lr);
                continue;
            }
            ag_flash_rows_end(&w, ob, D, lr);
            for (int64_t r = 0; r < nr; r++) ag_vec_copy(ag_buf_at(x->o, at + r * os.st), ag_buf_f32(ob + r * D), D);
        }
    }
}

static void flash_forward(const ag_att_dims *a, ag_buf q, ag_buf k, ag_buf v, ag_buf o, out_strides os, float *lse,
                          int64_t lse_ld, float *ws, int nthreads) {
    fwd_args x = {a, q, k, v, o, lse, ws, lse_ld, os};
    ag_run_tasks(nthreads, a->B * a->Hq * blocks_of(a->Tq, BR), forward_part, &x);
}

// Backward workspace per thread: Kᵀ and Vᵀ of the tile, dK and dV accumulators, P and dS.
// With 16-bit tensors also float32 copies of the tile's keys and of the block's q and dO.
static size_t bwd_floats(int D, bool typed) {
    return 4 * (size_t)D * BC + 2 * (size_t)BR * BC + (typed ? (size_t)D * (BC + 2 * BR) : 0);
}

#if defined(__x86_64__)
// P = exp(S - lse) in place over rows of BC, columns c < vis[r] kept (the rest hidden: 0).
AG_AVX512 static void probs16(float *s, int64_t nr, int64_t nc, const float *lse, int64_t vis0) {
    for (int64_t r = 0; r < nr; r++) {
        int64_t vis = vis0 + r < nc ? vis0 + r : nc;
        __m512 l = _mm512_set1_ps(lse[r]);
        for (int64_t c = 0; c < nc; c += 16) {
            __mmask16 mk = ag_lanes16(nc - c), keep = ag_lanes16(vis - c);
            float *sp = s + r * BC + c;
            __m512 p = _mm512_maskz_mov_ps(keep, ag_exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mk, sp), l)));
            _mm512_mask_storeu_ps(sp, mk, p);
        }
    }
}

// dS = P ∘ (dP - D_i) in place over dP.
AG_AVX512 static void dscores16(float *dp, const float *p, int64_t nr, int64_t nc, const float *di) {
    for (int64_t r = 0; r < nr; r++) {
        __m512 d = _mm512_set1_ps(di[r]);
        for (int64_t c = 0; c < nc; c += 16) {
            __mmask16 mk = ag_lanes16(nc - c);
            float *g = dp + r * BC + c;
            __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk, p + r * BC + c),
                                     _mm512_sub_ps(_mm512_maskz_loadu_ps(mk, g), d));
            _mm512_mask_storeu_ps(g, mk, x);
        }
    }
}
#endif

static void probs(float *s, int64_t nr, int64_t nc, const float *lse, int64_t vis0) {
#if defined(__x86_64__)
    if (ag_flash_fast()) {
        probs16(s, nr, nc, lse, vis0);
        return;
    }
#endif
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < nc; c++) s[r * BC + c] = c < vis0 + r ? expf(s[r * BC + c] - lse[r]) : 0.0f;
}

// Sliding window: P = 0 where key c0 + c lies window or more positions behind query qpos0 + r.
static void window_zero(float *p, int64_t nr, int64_t nc, int64_t qpos0, int64_t c0, int64_t window) {
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < nc && c0 + c < ag_window_first(qpos0 + r, window); c++) p[r * BC + c] = 0.0f;
}

static void dscores(float *dp, const float *p, int64_t nr, int64_t nc, const float *di) {
#if defined(__x86_64__)
    if (ag_flash_fast()) {
        dscores16(dp, p, nr, nc, di);
        return;
    }
#endif
    for (int64_t r = 0; r < nr; r++)
        for (int64_t c = 0; c < nc; c++) dp[r * BC + c] = p[r * BC + c] * (dp[r * BC + c] - di[r]);
}

typedef struct {
    const ag_att_dims *a;
    ag_buf q, k, v, o, dout;
    const float *lse;
    int64_t lse_ld;
    out_strides os;
    float *di;        // [B, Hq, Tq]
    ag_grad_dst d[4]; // dq, dk, dv, and with sinks dsinks
    float *dq;        // dQ's float32 sums: d[0]'s own data, or (16 bits) a float32 buffer
    bool typed;       // some tensor is not float32
    pthread_mutex_t *locks;
    float *ws;
} bwd_args;

// One task: key tile jb of key-value head g of batch b, over every query head of the group.
static void backward_tile(const bwd_args *x, float *ws, int64_t b, int g, int64_t jb) {
    const ag_att_dims *a = x->a;
    const int rep = a->Hq / a->Hkv, D = a->D;
    const int64_t ldq = (int64_t)a->Hq * D, ldk = (int64_t)a->Hkv * D, shift = a->Tk - a->Tq;
    const int64_t c0 = jb * BC, nc = a->Tk - c0 < BC ? a->Tk - c0 : BC, nqb = blocks_of(a->Tq, BR);
    const float scale = 1.0f / sqrtf((float)D);
    const bool dq = x->d[0].needed, dk = x->d[1].needed, dv = x->d[2].needed;
    float *kt = ws, *vt = kt + (size_t)D * BC, *dka = vt + (size_t)D * BC, *dva = dka + (size_t)D * BC,
          *p = dva + (size_t)D * BC, *ds = p + (size_t)BR * BC, *kf = ds + (size_t)BR * BC, *qf = kf + (size_t)D * BC,
          *dof = qf + (size_t)D * BR;
    const int64_t kv0 = (b * a->Tk + c0) * ldk + (int64_t)g * D, ldkf = x->typed ? D : ldk, ldqf = x->typed ? D : ldq;
    const float *kj = ag_tile_f32(x->k, kv0, ldk, nc, D, kf);
    float vrow[D];
    for (int64_t c = 0; c < nc; c++) {
        const float *vr = ag_tile_f32(x->v, kv0 + c * ldk, ldk, 1, D, vrow);
        for (int d = 0; d < D; d++) {
            kt[(int64_t)d * BC + c] = kj[c * ldkf + d];
            vt[(int64_t)d * BC + c] = vr[d];
        }
    }
    memset(dka, 0, (size_t)(nc * D) * sizeof(float));
    memset(dva, 0, (size_t)(nc * D) * sizeof(float));
    int64_t first = c0 - shift > 0 ? (c0 - shift) / BR : 0; // the first query block that sees key c0
    for (int h = g * rep; h < (g + 1) * rep; h++)
        for (int64_t ib = first; ib < nqb; ib++) {
            int64_t r0 = ib * BR, nr = a->Tq - r0 < BR ? a->Tq - r0 : BR;
            const int64_t row = (b * a->Tq + r0) * ldq + (int64_t)h * D, stat = (b * a->Hq + h) * a->Tq + r0;
            const float *qi = ag_tile_f32(x->q, row, ldq, nr, D, qf), *doi = ag_tile_f32(x->dout, row, ldq, nr, D, dof);
            ag_flash_mm(nr, nc, D, scale, qi, ldqf, 1, kt, BC, p, BC, false);
            probs(p, nr, nc, x->lse + (b * a->Hq + h) * x->lse_ld + r0,
                  r0 + shift - c0 + 1); // query r sees keys c <= r0 + r + shift - c0
            if (a->window > 0) window_zero(p, nr, nc, r0 + shift, c0, a->window);
            if (dv) ag_flash_mm(nc, D, nr, 1.0f, p, 1, BC, doi, ldqf, dva, D, true);
            if (!dq && !dk) continue;
            ag_flash_mm(nr, nc, D, 1.0f, doi, ldqf, 1, vt, BC, ds, BC, false);
            dscores(ds, p, nr, nc, x->di + stat);
            if (dq) {
                pthread_mutex_t *lk = &x->locks[((b * a->Hq + h) * nqb + ib) % NLOCKS];
                pthread_mutex_lock(lk);
                ag_flash_mm(nr, D, nc, scale, ds, BC, 1, kj, ldkf, x->dq + row, ldq, true);
                pthread_mutex_unlock(lk);
            }
            if (dk) ag_flash_mm(nc, D, nr, scale, ds, 1, BC, qi, ldqf, dka, D, true);
        }
    for (int i = 1; i < 3; i++) {
        if (!x->d[i].needed) continue;
        const float *src = i == 1 ? dka : dva;
        ag_buf dst = ag_dst_buf(&x->d[i]);
        for (int64_t c = 0; c < nc; c++)
            ag_vec_acc(ag_buf_at(dst, kv0 + c * ldk), x->d[i].fresh, ag_buf_f32(src + c * D), D);
    }
}

// Rows [lo, hi) of [B, Hq, Tq]: D_i = rowsum(dO_i ∘ O_i), and a fresh dQ zeroed, since every key
// tile adds into it.
static void delta_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const bwd_args *x = p;
    const ag_att_dims *a = x->a;
    const int D = a->D;
    const int64_t ldq = (int64_t)a->Hq * D;
    for (int64_t r = lo; r < hi; r++) {
        int64_t b = r / (a->Hq * a->Tq), h = (r / a->Tq) % a->Hq, i = r % a->Tq;
        float gb[D], ob[D];
        const float *dO = ag_rd(x->dout, (b * a->Tq + i) * ldq + h * D, D, gb),
                    *O = ag_rd(x->o, b * x->os.sb + h * x->os.sh + i * x->os.st, D, ob);
        double s = 0.0;
        for (int d = 0; d < D; d++) s += (double)dO[d] * O[d];
        x->di[r] = (float)s;
        // A fresh dQ, or the float32 sums of a 16-bit one, start from zero.
        if (x->d[0].needed && (x->d[0].fresh || x->dq != x->d[0].data))
            memset(x->dq + (b * a->Tq + i) * ldq + h * D, 0, (size_t)D * sizeof(float));
    }
}

// Tasks [lo, hi), key tile 0 first: it is seen by every query block.
static void tiles_part(void *p, int64_t lo, int64_t hi, int thread) {
    const bwd_args *x = p;
    const ag_att_dims *a = x->a;
    float *mine = x->ws + (size_t)thread * bwd_floats(a->D, x->typed);
    for (int64_t t = lo; t < hi; t++) {
        int64_t jb = t / (a->B * a->Hkv), bg = t % (a->B * a->Hkv);
        backward_tile(x, mine, bg / a->Hkv, (int)(bg % a->Hkv), jb);
    }
}

static void flash_backward_run(bwd_args *x, float *ws, int nthreads) {
    const ag_att_dims *a = x->a;
    pthread_mutex_t locks[NLOCKS];
    for (int i = 0; i < NLOCKS; i++) pthread_mutex_init(&locks[i], NULL);
    x->locks = locks;
    x->ws = ws;
    const int64_t rows = a->B * a->Hq * a->Tq;
    if (nthreads > 1)
        ag_parallel_for(rows, AG_PAR_GRAIN / a->D + 1, delta_part, x);
    else
        delta_part(x, 0, rows, 0);
    ag_run_tasks(nthreads, a->B * a->Hkv * blocks_of(a->Tk, BC), tiles_part, x);
    for (int i = 0; i < NLOCKS; i++) pthread_mutex_destroy(&locks[i]);
}

// Two inputs of the node that write one gradient buffer (q = k): their threads would race.
static bool shared_grad(const ag_node *n, int i, int j) {
    const ag_edge *x = &n->in[i], *y = &n->in[j];
    return x->kind != AG_EDGE_NONE && x->kind == y->kind && x->node == y->node && x->leaf == y->leaf;
}

// Attention sinks (gpt_oss): the sink's probability in row r is e^(sink - lse_r) (lse with the
// sink in it); its gradient -Σ p_sink D_r over the head's rows (D_r = rowsum(dO ∘ O)).
// lse's rows are lse_ld apart (the kernel's padding), di's Tq.
static void sinks_grad(const ag_grad_dst *d, const ag_tensor *sinks, const float *lse, int64_t lse_ld, const float *di,
                       const ag_att_dims *a) {
    for (int h = 0; h < a->Hq; h++) {
        const float sink = ag_get(sinks->data, sinks->dtype, h);
        double g = 0.0;
        for (int64_t b = 0; b < a->B; b++)
            for (int64_t i = 0; i < a->Tq; i++) {
                const int64_t r = (b * a->Hq + h) * a->Tq + i;
                g -= exp((double)sink - lse[(b * a->Hq + h) * lse_ld + i]) * di[r];
            }
        ag_set(d->data, d->dtype, h, (float)g + (d->fresh ? 0.0f : ag_get(d->data, d->dtype, h)));
    }
}

// The sinks join each row's softmax after the pass: lse' = log(e^lse + e^sink), O scaled by
// e^(lse - lse') (the share of the row's mass that stays on the keys).
static void sinks_forward(ag_buf o, out_strides os, float *lse, int64_t lse_ld, const ag_tensor *sinks,
                          const ag_att_dims *a) {
    const int D = a->D;
    float ob[D];
    for (int64_t b = 0; b < a->B; b++)
        for (int h = 0; h < a->Hq; h++) {
            const double sink = ag_get(sinks->data, sinks->dtype, h);
            for (int64_t i = 0; i < a->Tq; i++) {
                float *l = lse + (b * a->Hq + h) * lse_ld + i;
                const double m = *l > sink ? *l : sink, total = m + log(exp(*l - m) + exp(sink - m));
                const float keep = (float)exp(*l - total);
                const int64_t at = b * os.sb + h * os.sh + i * os.st;
                float *row = ag_rw(o, at, D, ob);
                for (int d = 0; d < D; d++) row[d] *= keep;
                ag_wr_end(o, at, D, row);
                *l = (float)total;
            }
        }
}

static void flash_attention_backward(ag_ctx *ctx, ag_node *n, const void *dout) {
    const ag_attention_flash_state *st = &n->state.attention_flash;
    const ag_att_dims *a = &st->dims;
    const ag_sdpa_kernel *kr = st->kernel;
    bwd_args x = {.a = a, .os = strides_of(a, st->heads_first), .lse_ld = st->lse_ld};
    if (!ag_grad_get_all(ctx, n, x.d)) return;
    const char *base = mp_site_name(n->site);
    char label[AG_LABEL_MAX];
    mp_block di = {0}, ws = {0}, dq = {0}, dkv[2] = {{0}};
    // The kernel's float32 row statistics rowsum(dO ∘ O), its rows rounded up as it pads them.
    const int64_t rows = round_up(a->Tq, AG_SDPA(kr, d_rows_align));
    ag_label(label, base, "flash_d");
    if (!ag_alloc_exact(ctx, &di, (size_t)(a->B * a->Hq * rows) * sizeof(float), MP_ACTIVATION, label)) return;
    int nthreads = ag_flash_threads(a->B * a->Hkv * blocks_of(a->Tk, BC), 2.5 * att_macs(a));
    if (shared_grad(n, 0, 1) || shared_grad(n, 0, 2)) nthreads = 1;
    x.q = ag_buf_of(st->q), x.k = ag_buf_of(st->k), x.v = ag_buf_of(st->v), x.o = ag_buf_of(st->out);
    x.dout = (ag_buf){(void *)dout, n->grad_dtype};
    x.typed = x.q.t != AG_F32 || x.k.t != AG_F32 || x.v.t != AG_F32 || x.o.t != AG_F32 || x.dout.t != AG_F32 ||
              x.d[1].dtype != AG_F32 || x.d[2].dtype != AG_F32;
    // dQ summed over the key tiles in float32, then rounded: for a 16-bit dQ, or (FlashAttention-2's
    // dq_accum) always, its rows and head dimension rounded up as the kernel lays it out.
    const bool always = AG_SDPA(kr, dq_accum) == AG_DQ_ALWAYS;
    const int64_t nq = a->B * a->Tq * a->Hq * a->D,
                  nacc = always ? a->B * rows * a->Hq * round_up(a->D, AG_SDPA(kr, dq_dim_align)) : nq;
    ag_label(label, base, "flash_dq_float");
    bool ok = !x.d[0].needed || (x.d[0].dtype == AG_F32 && !always) ||
              ag_alloc_exact(ctx, &dq, (size_t)nacc * sizeof(float), MP_ACTIVATION, label);
    x.dq = dq.bytes ? dq.data : x.d[0].data;
    // Grouped heads: the kernel's dK and dV at every query head, summed into the grouped ones (the
    // tiles here sum the group's heads themselves, into the same values).
    const bool expand = a->Hq != a->Hkv && AG_SDPA(kr, dkv_expanded);
    for (int i = 0; i < 2 && ok && expand; i++) {
        ag_label(label, base, i ? "dv_expanded" : "dk_expanded");
        ok = !x.d[1 + i].needed || ag_alloc_exact(ctx, &dkv[i],
                                                  (size_t)(a->B * a->Tk * a->Hq * a->D) *
                                                      (size_t)ag_type_traits_of(x.d[1 + i].dtype)->bits / 8,
                                                  MP_ACTIVATION, label);
    }
    ag_label(label, base, "flash_workspace");
    if (ok &&
        ag_alloc_exact(ctx, &ws, (size_t)nthreads * bwd_floats(a->D, x.typed) * sizeof(float), MP_ACTIVATION, label) &&
        !mp_is_meta()) {
        x.lse = st->lse->data, x.di = di.data;
        flash_backward_run(&x, ws.data, nthreads);
        if (dq.bytes) ag_vec_acc(ag_dst_buf(&x.d[0]), x.d[0].fresh, ag_buf_f32(dq.data), nq);
        if (st->sinks && x.d[3].needed) sinks_grad(&x.d[3], st->sinks, x.lse, st->lse_ld, x.di, a);
    }
    mp_free(&ws);
    mp_free(&dkv[1]);
    mp_free(&dkv[0]);
    mp_free(&dq);
    mp_free(&di);
}

static const ag_op flash_op = {
    .name = "flash_attention", .backward = flash_attention_backward, .nsaved = AG_NSAVED(attention_flash)};

// Under torch.autocast SDPA runs in 16 bits: its inputs are cast, the casts kept.
static ag_tensor *sdpa_operand(ag_ctx *ctx, const char *base, const char *what, ag_tensor *t) {
    if (!ag_autocast(ctx) || t->bits <= 16) return ag_retain(t);
    char l[AG_LABEL_MAX];
    ag_label(l, base, what);
    ag_tensor *c = ag_tensor_new_bits(ctx, t->ndim, t->shape, MP_ACTIVATION, l, 16);
    if (c && !mp_is_meta()) ag_vec_copy(ag_buf_of(c), ag_buf_of(t), t->numel);
    return c;
}

// out[B, Tq, Hq*D] = c[B, Hq, Tq, D].transpose(1, 2)
static void untranspose(ag_buf out, ag_buf c, const ag_att_dims *a) {
    for (int64_t b = 0; b < a->B; b++)
        for (int h = 0; h < a->Hq; h++)
            for (int64_t t = 0; t < a->Tq; t++)
                ag_copy_elems(ag_buf_at(out, ((b * a->Tq + t) * a->Hq + h) * a->D).p, out.t,
                              ag_buf_at(c, ((b * a->Hq + h) * a->Tq + t) * a->D).p, c.t, a->D);
}

// The RNG seed and offset a kernel keeps on the device (cuDNN's at::zeros({1}, kLong)), kept by
// the node; NULL when the kernel keeps them on the host.
static ag_tensor *rng_tensor(ag_ctx *ctx, const char *base, const char *what, int bytes) {
    if (bytes <= 0) return NULL;
    char l[AG_LABEL_MAX];
    ag_label(l, base, what);
    ag_tensor *t = ag_tensor_new_bits(ctx, 1, (int64_t[]){(bytes + 3) / 4}, MP_ACTIVATION, l, 32);
    if (t && !mp_is_meta()) memset(t->data, 0, (size_t)t->numel * sizeof(float)); // at::zeros
    return t;
}

ag_tensor *ag_attention_flash_checked(ag_ctx *ctx, const ag_site *s, ag_tensor *q, ag_tensor *k, ag_tensor *v,
                                      ag_tensor *sinks, const ag_att_dims *a, bool rec) {
    const ag_sdpa_kernel *kr = ag_ctx_sdpa(ctx);
    if (!kr) kr = &ag_sdpa_fused;
    const bool pt = AG_FW(ctx->fw, flash) == AG_FLASH_SDPA, meta = mp_is_meta();
    // The kernel's output laid out [B, Hq, Tq, D] (transformers' .contiguous() then copies it), or
    // [B, Tq, Hq, D] returned as a transposed view (nothing copied).
    const bool heads_first = pt && AG_SDPA(kr, out_heads_first);
    char label[AG_LABEL_MAX];
    ag_tensor *qs = sdpa_operand(ctx, s->base, "q_bf16", q), *ks = sdpa_operand(ctx, s->base, "k_bf16", k),
              *vs = sdpa_operand(ctx, s->base, "v_bf16", v);
    // SDPA's own output (kept by its node), at its inputs' element size.
    ag_tensor *o = NULL, *lse = NULL, *out = NULL, *seed = NULL, *offset = NULL;
    if (qs && ks && vs)
        o = heads_first ? ag_tensor_new_bits(ctx, 4, (int64_t[]){a->B, a->Hq, a->Tq, a->D}, MP_ACTIVATION,
                                             (ag_label(label, s->base, "sdpa_out"), label), qs->bits)
            : pt ? ag_tensor_new_bits(ctx, 3, (int64_t[]){a->B, a->Tq, (int64_t)a->Hq * a->D}, MP_ACTIVATION, s->out,
                                      qs->bits)
                 : ag_tensor_like(ctx, q, MP_ACTIVATION, s->out);
    // The log-sum-exp, float32, its rows padded as the kernel pads them (the memory-efficient
    // kernel's to a multiple of 32).
    const int64_t lse_ld = round_up(a->Tq, AG_SDPA(kr, lse_align));
    if (o && (rec || sinks)) // the sinks read each row's log-sum-exp even without a node
        lse = ag_tensor_new_f32(ctx, 3, (int64_t[]){a->B, a->Hq, lse_ld}, MP_ACTIVATION,
                                (ag_label(label, s->base, "lse"), label));
    const int rng = AG_SDPA(kr, rng_bytes);
    if (lse && rng > 0 &&
        (!(seed = rng_tensor(ctx, s->base, "philox_seed", rng)) ||
         !(offset = rng_tensor(ctx, s->base, "philox_offset", rng))))
        ag_release(lse), lse = NULL;
    mp_block ws = {0};
    int nthreads = forward_threads(a);
    ag_label(label, s->base, "flash_workspace");
    if (o && (lse || (!rec && !sinks)) &&
        ag_alloc_exact(ctx, &ws, (size_t)nthreads * ag_flash_rows_floats(a->D) * sizeof(float), MP_ACTIVATION, label) &&
        !meta)
        flash_forward(a, ag_buf_of(qs), ag_buf_of(ks), ag_buf_of(vs), ag_buf_of(o), strides_of(a, heads_first),
                      lse ? lse->data : NULL, lse_ld, ws.data, nthreads);
    mp_free(&ws);
    if (sinks && lse && !meta && ctx->status == AG_OK)
        sinks_forward(ag_buf_of(o), strides_of(a, heads_first), lse->data, lse_ld, sinks, a);
    if (sinks && !rec) ag_release(lse), lse = NULL;
    // transformers: attn_output.transpose(1, 2).contiguous(), the copy o_proj keeps.
    if (heads_first && o && ctx->status == AG_OK)
        out =
            ag_tensor_new_bits(ctx, 3, (int64_t[]){a->B, a->Tq, (int64_t)a->Hq * a->D}, MP_ACTIVATION, s->out, o->bits);
    else if (o)
        out = ag_retain(o);
    if (heads_first && out && !meta) untranspose(ag_buf_of(out), ag_buf_of(o), a);
    ag_tensor *ins[] = {q, k, v, sinks};
    ag_node *n =
        out && rec && ctx->status == AG_OK ? ag_record(ctx, &flash_op, s->base, out, sinks ? 4 : 3, ins) : NULL;
    if (n) {
        n->state.attention_flash = (ag_attention_flash_state){.q = qs,
                                                              .k = ks,
                                                              .v = vs,
                                                              .out = o,
                                                              .lse = lse,
                                                              .seed = seed,
                                                              .offset = offset,
                                                              .sinks = ag_retain(sinks),
                                                              .dims = *a,
                                                              .lse_ld = lse_ld,
                                                              .kernel = kr,
                                                              .heads_first = heads_first};
        return out;
    }
    ag_release(qs), ag_release(ks), ag_release(vs), ag_release(o), ag_release(lse), ag_release(seed),
        ag_release(offset);
    if (rec || ctx->status != AG_OK) ag_release(out), out = NULL; // no node: failed
    return out;
}
