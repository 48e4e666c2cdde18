// LoRA as PEFT builds it: the targets' settings, the adapters beside the frozen base weights,
// PEFT's initialisation, and each adapted projection's forward.
#include "blocks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const proj_names[LLAMA_NPROJ] = {"q_proj",  "k_proj",    "v_proj",   "o_proj",      "gate_proj",
                                                    "up_proj", "down_proj", "qkv_proj", "gate_up_proj"};
static const char *const proj_modules[LLAMA_NPROJ] = {"self_attn.q_proj", "self_attn.k_proj",   "self_attn.v_proj",
                                                      "self_attn.o_proj", "mlp.gate_proj",      "mlp.up_proj",
                                                      "mlp.down_proj",    "self_attn.qkv_proj", "mlp.gate_up_proj"};
// A projection's place in the adapters' seeds: layer x 7 + projection, as before phi3's two were
// added (theirs, 7 and 8, fall on the next layer's q and k_proj, which a phi3 block lacks).
#define SEED_STRIDE 7

const char *llama_proj_name(llama_proj p) { return (unsigned)p < LLAMA_NPROJ ? proj_names[p] : "?"; }
const char *llama_proj_module(llama_proj p) { return (unsigned)p < LLAMA_NPROJ ? proj_modules[p] : "?"; }

int llama_lora_parse_targets(const char *list, unsigned *out, ag_err *err) {
    if (list && strcmp(list, "all-linear") == 0) {
        *out = LLAMA_LORA_ALL;
        return 0;
    }
    unsigned t = 0;
    const char *p = list ? list : "";
    for (int item = 1;; item++) {
        size_t n = strcspn(p, ",");
        int k = 0;
        while (k < LLAMA_NPROJ && !(strlen(proj_names[k]) == n && strncmp(p, proj_names[k], n) == 0)) k++;
        if (k == LLAMA_NPROJ || (t & (1u << k))) {
            ag_err_set(err,
                       "--lora-targets: item %d '%.*s' is %s (expected PEFT's module names q_proj, k_proj, v_proj, "
                       "o_proj, gate_proj, up_proj, down_proj, or phi3's qkv_proj and gate_up_proj, comma-separated, "
                       "or all-linear)",
                       item, (int)n, p, k == LLAMA_NPROJ ? "not a linear layer of the model" : "given twice");
            return -1;
        }
        t |= 1u << k;
        if (!p[n]) break;
        p += n + 1;
    }
    *out = t;
    return 0;
}

const char *llama_lora_targets_text(unsigned targets, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = 0;
    for (int k = 0; k < LLAMA_NPROJ; k++)
        if (targets & (1u << k))
            n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s", n ? "," : "", proj_names[k]);
    return buf;
}

int llama_lora_validate(const llama_lora_config *l, ag_err *err) {
    if (l->rank < 1 || l->rank > (1 << 20))
        ag_err_set(err, "LoRA rank %lld: expected 1 to %d", (long long)l->rank, 1 << 20);
    else if (!(l->alpha >= LLAMA_LORA_MIN_ALPHA && l->alpha <= LLAMA_LORA_MAX_ALPHA))
        ag_err_set(err, "LoRA alpha %g: expected a number from %g to %g", l->alpha, LLAMA_LORA_MIN_ALPHA,
                   LLAMA_LORA_MAX_ALPHA);
    else if (!(l->dropout >= 0 && l->dropout < 1))
        ag_err_set(err, "LoRA dropout %g: expected 0 <= p < 1", l->dropout);
    else if (!(l->targets & LLAMA_LORA_ANY) || (l->targets & ~LLAMA_LORA_ANY))
        ag_err_set(err, "LoRA targets: expected at least one of the linear layers");
    else
        return 0;
    return -1;
}

// A block's weight and bias of projection p (NULL: the block has none).
static ag_tensor *proj_weight(const llama_layer *L, llama_proj p, ag_tensor **bias) {
    ag_tensor *const w[LLAMA_NPROJ] = {L->q, L->k, L->v, L->o, L->gate, L->up, L->down, L->qkv, L->gate_up};
    ag_tensor *const b[LLAMA_NPROJ] = {L->q_bias,  L->k_bias,    L->v_bias, L->o_bias, L->gate_bias,
                                       L->up_bias, L->down_bias, NULL,      NULL};
    if (bias) *bias = b[p];
    return w[p];
}

unsigned llama_lora_targets_of(const llama_config *c, unsigned targets) {
    return c->fused_proj && targets == LLAMA_LORA_ALL ? LLAMA_LORA_FUSED : targets;
}

uint64_t llama_lora_param_count(const llama_config *c, const llama_lora_config *l) {
    const uint64_t H = (uint64_t)c->hidden, Q = (uint64_t)(c->heads * c->head_dim),
                   KV = (uint64_t)(c->kv_heads * c->head_dim), I = (uint64_t)c->intermediate;
    const uint64_t in_out[LLAMA_NPROJ] = {H + Q, H + KV, H + KV, Q + H, H + I, H + I, I + H, H + Q + 2 * KV, H + 2 * I};
    uint64_t per = 0;
    const unsigned targets = llama_lora_targets_of(c, l->targets);
    for (int k = 0; k < LLAMA_NPROJ; k++)
        if (targets & (1u << k)) per += in_out[k];
    return per * (uint64_t)l->rank * (uint64_t)c->layers;
}

uint64_t llama_model_trainable_count(const llama_model *m) {
    uint64_t n = 0;
    for (size_t i = 0; i < m->ntrainable; i++) n += (uint64_t)m->trainable[i]->numel;
    return n;
}

uint64_t llama_model_param_total(const llama_model *m) {
    uint64_t n = 0;
    for (size_t i = 0; i < m->nparams; i++) n += (uint64_t)m->params[i]->numel;
    for (size_t i = 0; i < m->nadapters; i++) n += (uint64_t)m->adapters[i]->numel;
    return n;
}

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// kaiming_uniform_(a=sqrt(5)) on A [rank, in]: gain sqrt(2 / (1 + 5)), bound gain x sqrt(3 / in)
// = 1 / sqrt(in). B stays zero (PEFT's init_lora_weights=True: the adapted model starts as the base).
static void init_adapter(ag_tensor *a, ag_tensor *b, uint64_t seed) {
    const float bound = 1.0f / sqrtf((float)a->shape[1]);
    for (int64_t j = 0; j < a->numel; j++) {
        uint64_t v = mix(seed + 0x9e3779b97f4a7c15ULL * (uint64_t)(j + 1));
        ag_set(a->data, a->dtype, j, bound * (2.0f * (float)(v >> 40) * 0x1p-24f - 1.0f));
    }
    memset(b->data, 0, (size_t)b->numel * (size_t)b->bits / 8); // zero in every float dtype
}

static ag_tensor *adapter_new(ag_ctx *ctx, int64_t layer, llama_proj p, const char *which, int64_t rows, int64_t cols,
                              int bits, ag_err *err) {
    char name[LLAMA_PARAM_NAME_MAX + 32];
    snprintf(name, sizeof name, "model.layers.%lld.%s.%s.weight", (long long)layer, proj_modules[p], which);
    const int64_t shape[2] = {rows, cols};
    ag_tensor *t = bits ? ag_param_new_bits(ctx, 2, shape, name, bits) : ag_param_new(ctx, 2, shape, name);
    if (!t) ag_err_set(err, "%s", ag_ctx_error(ctx));
    return t;
}

// PEFT matches a target by its module's name: in a sparse layer gate_proj, up_proj and down_proj
// (Mixtral's w1, w3, w2) name every routed expert's projections, each of which would get an
// adapter inside the experts' dispatch, which membill does not model.
static int fits_model(const llama_config *c, const llama_lora_config *l, ag_err *err) {
    const unsigned mlp = (1u << LLAMA_PROJ_GATE) | (1u << LLAMA_PROJ_UP) | (1u << LLAMA_PROJ_DOWN);
    const unsigned qkv = (1u << LLAMA_PROJ_Q) | (1u << LLAMA_PROJ_K) | (1u << LLAMA_PROJ_V);
    if (c->mla.kv_lora_rank > 0 && (l->targets & qkv)) { // deepseek_v3: no k_proj, v_proj; q_proj unwired
        ag_err_set(err,
                   "--lora-targets: %s's latent attention has no q_proj, k_proj, v_proj adapters membill models "
                   "(q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj are not targets); target o_proj",
                   llama_family_class(c->family));
        return -1;
    }
    bool sparse = false;
    for (int64_t i = 0; i < c->layers && !sparse; i++) sparse = llama_layer_moe(c, i);
    if (!sparse || !(l->targets & mlp)) return 0;
    ag_err_set(err,
               "--lora-targets: %s's sparse layers would give every routed expert's projections an adapter, which "
               "membill does not model; target the attention (q_proj,k_proj,v_proj,o_proj)",
               llama_family_class(c->family));
    return -1;
}

// The targets a block of this model has: all-linear is every one of them (the seven named
// explicitly read as all-linear too); a named module the block lacks is refused, as PEFT refuses a
// target it does not find (phi3's fused projections).
static int resolve_targets(const llama_model *m, llama_lora_config *l, ag_err *err) {
    const unsigned present = m->cfg.fused_proj ? LLAMA_LORA_FUSED : LLAMA_LORA_ALL;
    l->targets = llama_lora_targets_of(&m->cfg, l->targets);
    unsigned absent = l->targets & ~present;
    if (!absent) return 0;
    char names[128], have[128];
    ag_err_set(err, "--lora-targets: %s %s no module of %s (its linear layers: %s)%s",
               llama_lora_targets_text(absent, names, sizeof names), absent & (absent - 1) ? "are" : "is",
               llama_family_class(m->cfg.family), llama_lora_targets_text(present, have, sizeof have),
               m->cfg.fused_proj ? "; PEFT has no default targets for phi3: name them" : "");
    return -1;
}

int llama_model_add_lora(llama_model *m, ag_ctx *ctx, const llama_lora_config *lc, uint64_t seed, ag_err *err) {
    llama_lora_config resolved = *lc;
    const llama_lora_config *l = &resolved;
    if (llama_lora_validate(l, err) != 0 || resolve_targets(m, &resolved, err) != 0 || fits_model(&m->cfg, l, err) != 0)
        return -1;
    if (m->adapters) {
        ag_err_set(err, "the model already has adapters");
        return -1;
    }
    size_t per = 0;
    for (int k = 0; k < LLAMA_NPROJ; k++) per += (l->targets >> k) & 1u;
    size_t n = 2 * per * (size_t)m->cfg.layers;
    m->adapters = calloc(n, sizeof *m->adapters);
    if (!m->adapters) {
        ag_err_set(err, "out of memory for the adapters");
        return -1;
    }
    for (size_t i = 0; i < m->nparams; i++) m->params[i]->requires_grad = false;
    m->lora =
        (llama_lora_state){.cfg = *l, .scale = (float)(l->alpha / (double)l->rank), .seed = mix(seed ^ 0x4c6f5241)};
    for (int64_t i = 0; i < m->cfg.layers; i++) {
        llama_layer *L = &m->layers[i];
        L->lora = &m->lora;
        for (int k = 0; k < LLAMA_NPROJ; k++) {
            if (!(l->targets & (1u << k))) continue;
            const ag_tensor *w = proj_weight(L, (llama_proj)k, NULL);
            ag_tensor *a = adapter_new(ctx, i, (llama_proj)k, "lora_A", l->rank, w->shape[1], l->adapter_bits, err);
            if (a) m->adapters[m->nadapters++] = a;
            ag_tensor *b =
                a ? adapter_new(ctx, i, (llama_proj)k, "lora_B", w->shape[0], l->rank, l->adapter_bits, err) : NULL;
            if (!b) return -1; // what was made is freed with the model
            m->adapters[m->nadapters++] = b;
            L->lora_a[k] = a, L->lora_b[k] = b;
        }
    }
    m->trainable = m->adapters;
    m->ntrainable = m->nadapters;
    llama_lora_init(m, seed);
    return 0;
}

void llama_lora_init(llama_model *m, uint64_t seed) {
    for (int64_t i = 0; i < m->cfg.layers; i++)
        for (int k = 0; k < LLAMA_NPROJ; k++) {
            ag_tensor *a = m->layers[i].lora_a[k], *b = m->layers[i].lora_b[k];
            if (a && b && a->data && b->data)
                init_adapter(a, b, mix(seed * 0x9e3779b97f4a7c15ULL + (uint64_t)(i * SEED_STRIDE + k)));
        }
}

// PEFT's lora.Linear.forward: result = base(x); x = x.to(lora_A's dtype); result + lora_B(lora_A(
// dropout(x))) * scaling, then .to(result's dtype). Adapters of the base's dtype make both casts
// nothing. Over a quantised base (bitsandbytes' and GPTQ's lora layers) the adapters' output is
// cast back before it is added, and the sum is the base's dtype. Without an adapter, the base
// linear alone.
// The linear of a projection: a fused one's output laid out part after part (ag_linear_parts).
static ag_tensor *proj_linear(ag_ctx *ctx, const char *site, ag_tensor *x, ag_tensor *w, ag_tensor *b,
                              const llama_parts *parts) {
    return parts ? ag_linear_parts(ctx, site, x, w, parts->n, parts->rows) : ag_linear(ctx, site, x, w, b);
}

ag_tensor *llama_proj_forward(ag_ctx *ctx, const llama_layer *L, int64_t i, llama_proj p, ag_tensor *x) {
    return llama_proj_forward_parts(ctx, L, i, p, x, NULL);
}

ag_tensor *llama_proj_forward_parts(ag_ctx *ctx, const llama_layer *L, int64_t i, llama_proj p, ag_tensor *x,
                                    const llama_parts *parts) {
    char s[96], t[128];
    ag_tensor *b, *w = proj_weight(L, p, &b);
    llama_site(s, i, proj_modules[p]);
    if (!L->lora || !L->lora_a[p]) return proj_linear(ctx, s, x, w, b, parts);
    const llama_lora_state *st = L->lora;
    snprintf(t, sizeof t, "%s:base_out", s);
    ag_tensor *y = proj_linear(ctx, t, x, w, b, parts);
    const int abits = L->lora_a[p]->bits, ybits = y ? y->bits : abits;
    snprintf(t, sizeof t, "%s:input_to_adapter", s);
    ag_tensor *h = y ? ag_cast(ctx, t, x, abits) : NULL;
    if (h && st->training && st->cfg.dropout > 0) { // nn.Dropout; p = 0 is nn.Identity (no copy)
        snprintf(t, sizeof t, "%s.lora_dropout", s);
        uint64_t seed = mix(st->seed ^ mix(st->forwards * 0x9e3779b97f4a7c15ULL + (uint64_t)(i * SEED_STRIDE + p)));
        ag_tensor *d = ag_dropout(ctx, t, h, (float)st->cfg.dropout, seed);
        ag_release(h);
        h = d;
    }
    snprintf(t, sizeof t, "%s.lora_A", s);
    ag_tensor *ha = h ? ag_linear(ctx, t, h, L->lora_a[p], NULL) : NULL;
    ag_release(h);
    snprintf(t, sizeof t, "%s.lora_B", s);
    ag_tensor *hb = ha ? proj_linear(ctx, t, ha, L->lora_b[p], NULL, parts) : NULL;
    ag_release(ha);
    snprintf(t, sizeof t, "%s.lora_scale", s);
    ag_tensor *sc = hb ? ag_scale(ctx, t, hb, st->scale) : NULL;
    ag_release(hb);
    const bool quantised = w->bits < 16;
    if (sc && quantised) { // output.to(expected_dtype), then result + output
        snprintf(t, sizeof t, "%s:adapter_out", s);
        ag_tensor *c = ag_cast(ctx, t, sc, ybits);
        ag_release(sc);
        sc = c;
    }
    snprintf(t, sizeof t, "%s:%s", s, quantised || abits == ybits ? "out" : "sum");
    ag_tensor *out = sc ? ag_add(ctx, t, y, sc) : NULL;
    ag_release(y);
    ag_release(sc);
    if (out && out->bits != ybits) { // result.to(torch_result_dtype)
        snprintf(t, sizeof t, "%s:out", s);
        ag_tensor *c = ag_cast(ctx, t, out, ybits);
        ag_release(out);
        out = c;
    }
    return out;
}

void llama_projs_forward(ag_ctx *ctx, const llama_layer *L, int64_t i, int n, const llama_proj *p, ag_tensor *x,
                         ag_tensor **out) {
    bool adapted = false;
    for (int j = 0; j < n; j++) adapted = adapted || (L->lora && L->lora_a[p[j]]);
    if (adapted || n > LLAMA_NPROJ) {
        for (int j = 0; j < n; j++) out[j] = llama_proj_forward(ctx, L, i, p[j], x);
        return;
    }
    char s[LLAMA_NPROJ][96];
    const char *sites[LLAMA_NPROJ];
    ag_tensor *w[LLAMA_NPROJ], *b[LLAMA_NPROJ];
    for (int j = 0; j < n; j++) w[j] = proj_weight(L, p[j], &b[j]), sites[j] = llama_site(s[j], i, proj_modules[p[j]]);
    ag_linear_group(ctx, n, sites, x, w, b, out); // NULLs and the context's error on failure
}
