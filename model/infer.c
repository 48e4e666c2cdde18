// Greedy generation: a prefill over the prompt, then one token per decode step, the keys and
// values of every block kept in a KV cache (category cache) between steps. Without the cache,
// every step runs the whole sequence so far again. No tape and no saved tensors: each
// intermediate is released as soon as the next op has it, so a block's activations are gone
// before the next block runs. Padded batches follow Hugging Face's generate: position =
// cumsum(mask) - 1 (pads at 1), and pad keys are hidden from every query.
#include "blocks.h"
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define REL(t) (ag_release(t), (t) = NULL)

// What one generation holds between steps. Per-token arrays are [B, cap], row b at b * cap.
typedef struct {
    ag_ctx *ctx;
    llama_model *m;
    const llama_config *c;
    int64_t B, cap;               // batch, prompt + new tokens
    int64_t len;                  // tokens of each row so far
    int32_t *ids, *mask, *pos;    // [B, cap]
    int32_t *step_ids, *step_pos; // [B * cap]: the tokens one forward runs over, contiguous
    int32_t *next;                // [B]
    ag_kv_cache **kv;             // [layers] with the cache, else NULL
} gen;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// ---------------------------------------------------------------------------------------------
// One forward

// x[B, t, H] -> x + attention(norm(x)); takes ownership of x. The t new tokens' keys and values
// (after RoPE) join kv; without a cache they go to a cache of this block alone (activations),
// freed before returning.
// deepseek_v3's cache: the expanded keys (nope + rope a head) and values (v_head_dim), as
// transformers' DynamicCache keeps them.
static ag_kv_cache *new_cache(gen *g, int64_t i, mp_category cat) {
    char s[96];
    const llama_config *c = g->c;
    if (c->mla.kv_lora_rank > 0 && c->mla.latent_cache) // one head of kv_lora + rope, keys alone
        return ag_kv_cache_new_dv(g->ctx, llama_site(s, i, "self_attn"), cat, g->B, 1,
                                  (int)(c->mla.kv_lora_rank + c->mla.qk_rope), 0);
    if (c->mla.kv_lora_rank > 0)
        return ag_kv_cache_new_dv(g->ctx, llama_site(s, i, "self_attn"), cat, g->B, (int)c->heads,
                                  (int)(c->mla.qk_nope + c->mla.qk_rope), (int)c->mla.v_head);
    return ag_kv_cache_new(g->ctx, llama_site(s, i, "self_attn"), cat, g->B, (int)c->kv_heads, (int)c->head_dim);
}

// deepseek_v3's attention half over its cache (the latent attention, eager).
static ag_tensor *mla_attention_part(gen *g, int64_t i, ag_tensor *x) {
    ag_ctx *ctx = g->ctx;
    const llama_layer *L = &g->m->layers[i];
    char s[96];
    ag_kv_cache *kv = g->kv ? g->kv[i] : new_cache(g, i, MP_ACTIVATION);
    ag_tensor *q, *k, *v = NULL, *a = NULL;
    if (g->c->mla.latent_cache) { // DeepSeek's own: the latent cached, kv_b_proj absorbed
        llama_mla_latent(ctx, g->c, L, x, i, g->step_pos, g->cap - 1, &q, &k, &v);
        if (v && ag_kv_cache_append(ctx, kv, v, NULL))
            a = ag_attention_mla_latent(ctx, llama_site(s, i, "self_attn"), q, k, kv, L->kv_b, (int)g->c->heads,
                                        (int)g->c->mla.v_head, g->mask, g->cap, llama_mla_scale(g->c));
        REL(q), REL(k), REL(v);
    } else {
        llama_mla_qkv(ctx, g->c, L, x, i, g->step_pos, g->cap - 1, &q, &k, &v);
        if (k && v) ag_kv_cache_append(ctx, kv, k, v);
        REL(k);
        REL(v);
        a = ag_attention_mla_cached(ctx, llama_site(s, i, "self_attn"), q, kv, g->mask, g->cap, llama_mla_scale(g->c));
        REL(q);
    }
    if (!g->kv) ag_kv_cache_free(kv);
    return llama_attention_out(ctx, g->c, L, x, a, i);
}

static ag_tensor *attention_part(gen *g, int64_t i, ag_tensor *x) {
    if (g->c->mla.kv_lora_rank > 0) return mla_attention_part(g, i, x);
    ag_ctx *ctx = g->ctx;
    const llama_config *c = g->c;
    const llama_layer *L = &g->m->layers[i];
    const int hq = (int)c->heads, hkv = (int)c->kv_heads, hd = (int)c->head_dim;
    const ag_rope_freqs f = llama_layer_rope_freqs(c, i, g->cap - 1); // the last forward's positions
    char s[96];
    ag_kv_cache *kv =
        g->kv ? g->kv[i] : ag_kv_cache_new(ctx, llama_site(s, i, "self_attn"), MP_ACTIVATION, g->B, hkv, hd);
    ag_tensor *q, *k, *v;
    llama_qkv(ctx, c, L, x, i, &q, &k, &v);
    ag_tensor *qr = ag_rope_positions_f(ctx, llama_site(s, i, "self_attn.q_rope"), q, hq, hd, &f, g->step_pos);
    ag_tensor *kr = ag_rope_positions_f(ctx, llama_site(s, i, "self_attn.k_rope"), k, hkv, hd, &f, g->step_pos);
    REL(q);
    REL(k);
    if (kr && v) ag_kv_cache_append(ctx, kv, kr, v);
    REL(kr);
    REL(v);
    const ag_attention_spec spec = {llama_layer_window(c, i), llama_attention_scale(c), (float)c->attn_softcap};
    ag_tensor *a =
        L->sinks // gpt_oss's sinks (no scale of its own, no cap)
            ? ag_attention_cached_sinks(ctx, llama_site(s, i, "self_attn"), qr, kv, g->mask, g->cap, hq, spec.window,
                                        L->sinks)
            : ag_attention_cached_spec(ctx, llama_site(s, i, "self_attn"), qr, kv, g->mask, g->cap, hq, &spec);
    REL(qr);
    if (!g->kv) ag_kv_cache_free(kv);
    return llama_attention_out(ctx, c, L, x, a, i);
}

// x[B, t, H] -> x[B, 1, H], its last position; takes ownership of x.
static ag_tensor *last_position(ag_ctx *ctx, ag_tensor *x) {
    if (!x || x->shape[1] == 1) return x;
    int64_t B = x->shape[0], t = x->shape[1], H = x->shape[2];
    ag_tensor *y = ag_tensor_new(ctx, 3, (int64_t[]){B, 1, H}, MP_ACTIVATION, "last_position:out");
    if (y && y->data)
        for (int64_t b = 0; b < B; b++) ag_tensor_rows(y, b, x, b * t + t - 1, 1);
    ag_release(x);
    return y;
}

// The final norm and the head: logits [B, t, V] over every position, or [B, 1, V] over the last
// only (the norm is per position, so the last one is cut out before it). Takes ownership of x.
static ag_tensor *head(gen *g, ag_tensor *x, bool all_positions) {
    if (!all_positions) x = last_position(g->ctx, x);
    ag_tensor *n = llama_norm(g->ctx, g->c, "norm", x, g->m->norm);
    ag_release(x);
    ag_tensor *logits = ag_linear(g->ctx, "lm_head:logits", n, g->m->lm_head, NULL);
    ag_release(n);
    if (!logits || g->c->final_softcap <= 0.0) return logits;
    ag_tensor *capped = ag_softcap(g->ctx, "final_softcap:logits", logits, (float)g->c->final_softcap);
    ag_release(logits);
    return capped;
}

// dst[B, t] = src[:, from .. from + t) of a [B, cap] array.
static void gather(int32_t *dst, const int32_t *src, const gen *g, int64_t from, int64_t t) {
    for (int64_t b = 0; src && b < g->B; b++) memcpy(dst + b * t, src + b * g->cap + from, (size_t)t * sizeof(int32_t));
}

// A decode step reads every weight once and computes little between its products: the pool's
// idle threads fetch what block i reads after its q, k, v (and the next block's q, k, v, or the
// head) while the caller runs the ops in between.
static void prefetch_after_qkv(const gen *g, int64_t i, int64_t t) {
    if (g->B * t > 8) { // a prefill's products are bound by arithmetic, not by the weights
        ag_prefetch(0, NULL);
        return;
    }
    const llama_layer *L = &g->m->layers[i], *N = i + 1 < g->c->layers ? L + 1 : NULL;
    const ag_tensor *w[] = {L->o, L->gate, L->up, L->down, N ? N->q : g->m->lm_head, N ? N->k : NULL, N ? N->v : NULL};
    ag_prefetch(7, w);
}

// Logits of tokens [from, len) of every row (all positions, or the last one).
static ag_tensor *forward(gen *g, int64_t from, bool all_positions) {
    int64_t t = g->len - from;
    gather(g->step_ids, g->ids, g, from, t);
    gather(g->step_pos, g->pos, g, from, t);
    ag_tensor *x = ag_embedding(g->ctx, "embed_tokens", g->step_ids, g->B, t, g->m->embed);
    if (x && g->c->embed_scale) { // Gemma 2: times sqrt(hidden_size)
        ag_tensor *y = ag_scale(g->ctx, "embed_scale", x, llama_embedding_scale(g->c));
        ag_release(x);
        x = y;
    }
    for (int64_t i = 0; i < g->c->layers && x; i++) {
        prefetch_after_qkv(g, i, t);
        x = attention_part(g, i, x);
        x = llama_mlp_block(g->ctx, g->c, &g->m->layers[i], x, i);
    }
    g->m->moe.forward++; // each forward of a generation is routed on its own
    return x ? head(g, x, all_positions) : NULL;
}

// The greedy choice of each row from its last position's logits (ties: the lowest id, as
// torch.argmax), which must be finite: a NaN would pick id 0 as if it were an answer. In meta
// mode there are no logits: every row picks id 0. -1 with the row and id at fault.
static int pick(gen *g, const ag_tensor *logits, ag_err *err) {
    int64_t t = logits->shape[1], V = logits->shape[2];
    const bool f32 = logits->dtype == AG_F32; // read in place; other dtypes through a float32 row
    float *own = logits->data && !f32 ? malloc((size_t)V * sizeof(float)) : NULL;
    for (int64_t b = 0; b < g->B; b++) {
        g->next[b] = 0;
        if (!logits->data || (!f32 && !own)) continue;
        const float *row = f32 ? ag_f32(logits) + (b * t + t - 1) * V : own;
        if (!f32) ag_tensor_row_f32(logits, b * t + t - 1, own);
        int64_t bad = llama_first_nonfinite(row, V);
        if (bad >= 0) {
            ag_err_set(err, "non-finite logits: %g in row %lld at id %lld (lm_head)", row[bad], (long long)b,
                       (long long)bad);
            free(own);
            return -1;
        }
        g->next[b] = (int32_t)ag_argmax(row, V);
    }
    free(own);
    return 0;
}

// Appends the chosen ids as every row's next token: real, one position past the last.
static void extend(gen *g) {
    for (int64_t b = 0; g->ids && b < g->B; b++) {
        int64_t r = b * g->cap + g->len;
        g->ids[r] = g->next[b];
        g->mask[r] = 1;
        g->pos[r] = g->pos[r - 1] + 1;
    }
    g->len++;
}

// ---------------------------------------------------------------------------------------------
// Input checks and set-up

// Each row: 0 and 1 only, pads (0) on the left, at least one real token.
static int check_mask(const int32_t *mask, int64_t B, int64_t T, ag_err *err) {
    for (int64_t b = 0; b < B; b++) {
        const int32_t *m = mask + b * T;
        for (int64_t j = 0; j < T; j++) {
            if (m[j] != 0 && m[j] != 1) {
                ag_err_set(err,
                           "attention mask row %lld, column %lld: %d, expected 0 (pad) "
                           "or 1 (real token)",
                           (long long)b, (long long)j, m[j]);
                return -1;
            }
            if (j > 0 && m[j - 1] == 1 && m[j] == 0) {
                ag_err_set(err,
                           "attention mask row %lld: a pad at column %lld follows a real "
                           "token; prompts must be left-padded (pads first)",
                           (long long)b, (long long)j);
                return -1;
            }
        }
        if (m[T - 1] == 0) {
            ag_err_set(err,
                       "attention mask row %lld is all pads: every prompt needs at least "
                       "one real token",
                       (long long)b);
            return -1;
        }
    }
    return 0;
}

static int check_args(ag_ctx *ctx, const llama_model *m, const int32_t *ids, const int32_t *mask, int64_t B, int64_t T,
                      int64_t n, const int32_t *out, ag_err *err) {
    // Meta mode reads no ids: a bill of shapes takes no host memory per token.
    bool meta = mp_is_meta();
    if (!ctx || !m || (!ids && !meta) || !out) {
        ag_err_set(err, "generate: %s is NULL",
                   !ctx   ? "the context"
                   : !m   ? "the model"
                   : !ids ? "the prompt ids"
                          : "the output ids");
        return -1;
    }
    if (ag_is_grad_enabled(ctx) || ag_ctx_status(ctx) != AG_OK) {
        ag_err_set(err, "generate: %s",
                   ag_ctx_status(ctx) != AG_OK
                       ? ag_ctx_error(ctx)
                       : "grad mode is on; generation runs without a tape (ag_set_grad_enabled(ctx, false))");
        return -1;
    }
    const llama_config *c = &m->cfg;
    // The last new token is chosen but never run through the model: it needs no position.
    if (B < 1 || (!meta && B > INT32_MAX / c->max_positions) || T < 1 || n < 1 || T > c->max_positions ||
        n - 1 > c->max_positions - T) {
        if (B > INT32_MAX / c->max_positions && B >= 1)
            ag_err_set(err,
                       "generate: batch %lld x max_position_embeddings %lld passes 2^31 (the positions of a real "
                       "run are 32-bit): at most batch %lld, or meta mode",
                       (long long)B, (long long)c->max_positions, (long long)(INT32_MAX / c->max_positions));
        else
            ag_err_set(err,
                       "generate: batch %lld, prompt of %lld tokens, %lld new tokens: expected "
                       "batch >= 1, a prompt of at least 1 token, at least 1 new token, and the "
                       "prompt + new tokens - 1 (the tokens run through the model) at most "
                       "max_position_embeddings (%lld)",
                       (long long)B, (long long)T, (long long)n, (long long)c->max_positions);
        return -1;
    }
    if (ids && llama_check_tokens(c, ids, (size_t)(B * T), err) != 0) return -1;
    if (llama_family_check_run(c, ctx, "generate", err) != 0) return -1;
    // longrope: transformers switches to the long factors once a forward passes the original
    // context, and then recomputes the whole cache (Phi3ForCausalLM.prepare_inputs_for_generation)
    const llama_rope_scaling *r = &c->rope;
    const int64_t orig = r->original_max_positions > 0 ? r->original_max_positions : c->max_positions;
    if (r->type == LLAMA_ROPE_LONGROPE && T <= orig && T + n - 1 > orig) {
        ag_err_set(err,
                   "generate: a prompt of %lld tokens and %lld new tokens cross longrope's original context "
                   "(original_max_position_embeddings %lld), where transformers recomputes the cache with the long "
                   "factors: not modelled (stay within it, or start past it)",
                   (long long)T, (long long)n, (long long)orig);
        return -1;
    }
    return mask && !meta ? check_mask(mask, B, T, err) : 0;
}

static void gen_free(gen *g) {
    for (int64_t i = 0; g->kv && i < g->c->layers; i++) ag_kv_cache_free(g->kv[i]);
    free(g->kv);
    free(g->ids);
    free(g->mask);
    free(g->pos);
    free(g->step_ids);
    free(g->step_pos);
    free(g->next);
}

// Copies the prompt and its mask, sets the positions, makes the (empty) caches.
static int gen_init(gen *g, ag_ctx *ctx, llama_model *m, bool use_cache, const int32_t *ids, const int32_t *mask,
                    int64_t B, int64_t T, int64_t n, ag_err *err) {
    memset(g, 0, sizeof *g);
    g->ctx = ctx, g->m = m, g->c = &m->cfg, g->B = B, g->cap = T + n, g->len = T;
    // Meta mode keeps no ids, positions or mask: nothing per token on the host.
    bool meta = mp_is_meta();
    size_t cells = meta ? 0 : (size_t)(B * g->cap);
    if (!meta) {
        g->ids = malloc(cells * sizeof(int32_t));
        g->mask = malloc(cells * sizeof(int32_t));
        g->pos = malloc(cells * sizeof(int32_t));
        g->step_ids = malloc(cells * sizeof(int32_t));
        g->step_pos = malloc(cells * sizeof(int32_t));
    }
    g->next = malloc((size_t)B * sizeof(int32_t));
    g->kv = use_cache ? calloc((size_t)g->c->layers, sizeof *g->kv) : NULL;
    bool ok = (meta || (g->ids && g->mask && g->pos && g->step_ids && g->step_pos)) && g->next && (g->kv || !use_cache);
    for (int64_t b = 0; ok && !meta && b < B; b++) {
        int64_t real = 0;
        for (int64_t j = 0; j < T; j++) {
            int64_t r = b * g->cap + j;
            g->ids[r] = ids[b * T + j];
            g->mask[r] = mask ? mask[b * T + j] : 1;
            real += g->mask[r];
            g->pos[r] = g->mask[r] ? (int32_t)(real - 1) : 1; // cumsum(mask) - 1; pads at 1
        }
    }
    for (int64_t i = 0; ok && use_cache && i < g->c->layers; i++) {
        g->kv[i] = new_cache(g, i, MP_CACHE);
        ok = g->kv[i] != NULL;
    }
    if (!ok) {
        ag_err_set(err, "generate: %s", ag_ctx_error(ctx) ? ag_ctx_error(ctx) : "out of memory");
        gen_free(g);
        return -1;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Stats

static int stats_init(llama_generate_stats *st, int64_t n, ag_err *err) {
    memset(st, 0, sizeof *st);
    st->step_s = calloc((size_t)n, sizeof *st->step_s);
    st->cache_bytes = calloc((size_t)n, sizeof *st->cache_bytes);
    st->cache_usable = calloc((size_t)n, sizeof *st->cache_usable);
    st->cache_shape = calloc((size_t)n, sizeof *st->cache_shape);
    if (st->step_s && st->cache_bytes && st->cache_usable && st->cache_shape) return 0;
    llama_generate_stats_free(st);
    ag_err_set(err, "generate: out of memory for the statistics of %lld steps", (long long)n);
    return -1;
}

void llama_generate_stats_free(llama_generate_stats *st) {
    if (!st) return;
    free(st->step_s);
    free(st->cache_bytes);
    free(st->cache_usable);
    free(st->cache_shape);
    memset(st, 0, sizeof *st);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// Totals and the median decode step, once every step is recorded.
static void stats_finish(llama_generate_stats *st) {
    if (st->steps < 1) return;
    st->prefill_s = st->step_s[0];
    int64_t nd = st->steps - 1;
    double *d = nd ? malloc((size_t)nd * sizeof *d) : NULL;
    for (int64_t k = 0; k < nd; k++) st->decode_s += st->step_s[k + 1];
    if (d) {
        memcpy(d, st->step_s + 1, (size_t)nd * sizeof *d);
        qsort(d, (size_t)nd, sizeof *d, cmp_double);
        st->decode_step_s = nd % 2 ? d[nd / 2] : 0.5 * (d[nd / 2 - 1] + d[nd / 2]);
        free(d);
    }
    st->generate_s = st->prefill_s + st->decode_s;
}

// ---------------------------------------------------------------------------------------------
// Generation

// Forward k (0: the prefill) and its token; with the cache, a decode step runs over its one
// new token, else over the whole sequence. Returns -1 with err set.
static int step(gen *g, int64_t k, ag_err *err) {
    bool cached = g->kv != NULL;
    // transformers' generate asks for the last position's logits only (logits_to_keep=1).
    bool all = k == 0 && !AG_FW(ag_ctx_framework_row(g->ctx), prefill_last_logits);
    ag_tensor *logits = forward(g, cached && k > 0 ? g->len - 1 : 0, all);
    if (!logits) {
        const char *why = ag_ctx_error(g->ctx);
        ag_err_set(err, "generate, %s %lld: %s", k ? "decode step" : "prefill", (long long)k, why ? why : "failed");
        return -1;
    }
    ag_err bad;
    int rc = pick(g, logits, &bad);
    if (rc != 0) ag_err_set(err, "generate, %s %lld: %s", k ? "decode step" : "prefill", (long long)k, bad.msg);
    ag_release(logits);
    return rc;
}

// Whether the caller's stop callback ends the generation after this forward.
static bool record(gen *g, const llama_generate_opts *o, llama_generate_stats *st, int64_t k, double seconds) {
    llama_generate_step s = {
        .step = k, .positions = g->kv && k > 0 ? 1 : g->len, .seconds = seconds, .next = g->next, .cache = g->kv};
    mp_counter cc = mp_get_counter(MP_CACHE);
    s.cache_bytes = cc.live, s.cache_usable = cc.live_usable;
    if (g->kv) ag_kv_cache_shape(g->kv[0], s.cache_shape);
    if (st) {
        st->steps = k + 1;
        st->step_s[k] = seconds;
        st->cache_bytes[k] = s.cache_bytes;
        st->cache_usable[k] = s.cache_usable;
        memcpy(st->cache_shape[k], s.cache_shape, sizeof s.cache_shape);
    }
    if (o->on_step) o->on_step(o->user, &s);
    return o->stop && o->stop(o->user, &s);
}

int llama_generate(ag_ctx *ctx, llama_model *m, const llama_generate_opts *opts, const int32_t *prompt_ids,
                   const int32_t *mask, int64_t B, int64_t T, int64_t new_tokens, int32_t *out_ids,
                   llama_generate_stats *stats, ag_err *err) {
    const llama_generate_opts defaults = {.use_cache = true};
    const llama_generate_opts *o = opts ? opts : &defaults;
    if (stats) memset(stats, 0, sizeof *stats);
    if (check_args(ctx, m, prompt_ids, mask, B, T, new_tokens, out_ids, err) != 0) return -1;
    m->lora.training = false; // PEFT in eval mode: no dropout
    if (stats && stats_init(stats, new_tokens, err) != 0) return -1;
    gen g;
    if (gen_init(&g, ctx, m, o->use_cache, prompt_ids, mask, B, T, new_tokens, err) != 0) return -1;
    int rc = 0;
    for (int64_t k = 0; k < new_tokens && rc == 0; k++) {
        if (k < 2) mp_set_phase(k == 0 ? MP_PHASE_PREFILL : MP_PHASE_DECODE);
        double t0 = now();
        rc = step(&g, k, err);
        double seconds = now() - t0;
        if (rc != 0) break;
        for (int64_t b = 0; b < B; b++) out_ids[b * new_tokens + k] = g.next[b];
        if (record(&g, o, stats, k, seconds)) break;
        if (k + 1 < new_tokens) extend(&g);
    }
    gen_free(&g); // the end of generation: the cache goes
    if (stats) stats_finish(stats);
    return rc;
}
