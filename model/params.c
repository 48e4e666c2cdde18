// The model's parameters: allocation in Hugging Face order, seeded random init, load, save.
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int llama_model_new(llama_model **out, ag_ctx *ctx, const llama_config *cfg, ag_err *err) {
    return llama_model_new_proj_dtype(out, ctx, cfg, NULL, err);
}

// Parameter i (Hugging Face order) into its slot: the embedding, a block's (layer, j), the norm,
// the head.
static ag_tensor **param_slot(llama_model *m, size_t i, int64_t layer, size_t j) {
    if (i == 0) return &m->embed;
    if (layer >= 0) return llama_layer_slot(&m->layers[layer], &m->cfg, layer, j);
    return i == llama_layer_first_param(&m->cfg, m->cfg.layers) ? &m->norm : &m->lm_head;
}

// One parameter made under the context's dtype, or a block's matrix under proj when given.
static ag_tensor *make_param(ag_ctx *ctx, const llama_param_info *p, const ag_precision *proj, ag_err *err) {
    const ag_precision own = ag_ctx_precision(ctx);
    bool switched = proj && p->matrix;
    if (switched && !ag_ctx_set_precision(ctx, proj)) {
        ag_err_set(err, "%s", ag_ctx_error(ctx));
        return NULL;
    }
    ag_tensor *t = ag_param_new(ctx, p->ndim, p->shape, p->name);
    if (switched) ag_ctx_set_precision(ctx, &own);
    if (!t)
        ag_err_set(err, "%s", ag_ctx_error(ctx));
    else if (p->buffer)
        t->requires_grad = false; // a buffer: loaded and billed, never trained
    return t;
}

int llama_model_new_proj_dtype(llama_model **out, ag_ctx *ctx, const llama_config *cfg, const ag_precision *proj,
                               ag_err *err) {
    *out = NULL;
    if (llama_config_validate(cfg, err) != 0) return -1;
    if (proj && proj->weight_bits < 16 && cfg->mla.kv_lora_rank > 0) { // not built nor checked for deepseek_v3
        ag_err_set(err, "--base-dtype: a quantised base of %s is not modelled (a float or 16-bit base is)",
                   llama_family_class(cfg->family));
        return -1;
    }
    llama_model *m = calloc(1, sizeof *m);
    size_t n = llama_param_count_tensors(cfg);
    if (m) {
        m->cfg = *cfg;
        llama_rope_prepare(&m->cfg); // the frequencies the model's ops point to
        m->layers = calloc((size_t)cfg->layers, sizeof *m->layers);
        m->params = calloc(n, sizeof *m->params);
    }
    bool ok = m && m->layers && m->params;
    for (int64_t l = 0; ok && l < cfg->layers; l++) {
        ok = llama_layer_alloc(&m->layers[l], cfg, l) == 0;
        m->layers[l].moe = &m->moe;
    }
    // the routers' logits the load-balancing loss reads, kept from each sparse layer to the loss
    if (ok && cfg->moe.experts > 0 && cfg->moe.aux_loss)
        ok = (m->moe.logits = calloc((size_t)cfg->layers, sizeof *m->moe.logits)) != NULL;
    if (!ok) {
        llama_model_free(m);
        ag_err_set(err, "out of memory building the model");
        return -1;
    }
    int64_t layer = -1;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        llama_param_info p;
        llama_param_info_of(cfg, i, &p);
        j = p.layer == layer ? j + 1 : 0, layer = p.layer;
        ag_tensor *t = make_param(ctx, &p, proj, err);
        if (!t) {
            llama_model_free(m);
            return -1;
        }
        m->params[m->nparams++] = t;
        *param_slot(m, i, p.layer, j) = t;
    }
    if (cfg->tied) m->lm_head = m->embed;
    m->trainable = m->params;
    m->ntrainable = m->nparams;
    *out = m;
    return 0;
}

void llama_model_free(llama_model *m) {
    if (!m) return;
    for (size_t i = 0; i < m->nparams; i++) ag_release(m->params[i]);
    for (size_t i = 0; i < m->nadapters; i++) ag_release(m->adapters[i]);
    free(m->params);
    free(m->adapters);
    for (int64_t l = 0; m->layers && l < m->cfg.layers; l++) llama_layer_release(&m->layers[l]);
    for (int64_t l = 0; m->moe.logits && l < m->cfg.layers; l++) ag_release(m->moe.logits[l]);
    free(m->moe.logits);
    free(m->layers);
    free(m);
}

// splitmix64: a small, well-mixed generator; one stream per chunk keeps init deterministic
// whatever the number of threads.
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define INIT_CHUNK 65536

// Box-Muller in float, a pair of normals from one 64-bit draw (two 24-bit uniforms): float
// logf and sincosf make the init of 134M weights a fraction of a second.
typedef struct {
    float *x;
    int64_t n;
    float std;
    uint64_t seed;
} normal_args;

static void normal_part(void *p, int64_t lo, int64_t hi, int thread) {
    (void)thread;
    const normal_args *a = p;
    float *x = a->x, std = a->std;
    const int64_t n = a->n;
    for (int64_t c = lo; c < hi; c++) {
        uint64_t s = a->seed ^ ((uint64_t)c * 0xd1b54a32d192ed03ULL);
        int64_t end = (c + 1) * INIT_CHUNK < n ? (c + 1) * INIT_CHUNK : n;
        for (int64_t i = c * INIT_CHUNK; i < end; i += 2) {
            uint64_t v = splitmix(&s);
            float u1 = ((float)(v >> 40) + 0.5f) * 0x1p-24f; // (0, 1): logf stays finite
            float u2 = (float)((v >> 8) & 0xffffff) * 0x1p-24f;
            float r = std * sqrtf(-2.0f * logf(u1)), sn, cs;
            sincosf(6.28318530718f * u2, &sn, &cs);
            x[i] = r * cs;
            if (i + 1 < end) x[i + 1] = r * sn;
        }
    }
}

static void fill_normal(float *x, int64_t n, float std, uint64_t seed) {
    ag_parallel_for((n + INIT_CHUNK - 1) / INIT_CHUNK, 1, normal_part, &(normal_args){x, n, std, seed});
}

// A parameter's values are made in float32, then stored in its dtype (rounded or quantised).
void llama_model_init_random(llama_model *m, uint64_t seed) {
    for (size_t i = 0; i < m->nparams; i++) {
        ag_tensor *p = m->params[i];
        if (!p->data) continue; // meta mode
        float *f = p->dtype == AG_F32 ? p->data : malloc((size_t)p->numel * sizeof(float));
        if (!f) continue;   // left as allocated: out of memory shows in the loss
        if (p->ndim == 1) { // norms start at 1, biases at 0 (transformers' _init_weights)
            const char *name = ag_tensor_name(p);
            size_t n = strlen(name);
            float v = n >= 5 && strcmp(name + n - 5, ".bias") == 0 ? 0.0f : 1.0f;
            for (int64_t j = 0; j < p->numel; j++) f[j] = v;
        } else {
            uint64_t s = seed * 0x9e3779b97f4a7c15ULL + i;
            fill_normal(f, p->numel, 0.02f, splitmix(&s));
        }
        if (f != p->data) ag_tensor_from_f32(p, f), free(f);
    }
}

const float *llama_f32_view(const ag_tensor *t, float **own, ag_err *err) {
    *own = NULL;
    if (t->dtype == AG_F32) return t->data;
    if (!(*own = malloc((size_t)t->numel * sizeof(float)))) {
        ag_err_set(err, "%s: out of memory for its float32 values", ag_tensor_name(t));
        return NULL;
    }
    ag_tensor_to_f32(t, *own);
    return *own;
}

int llama_read_into(const llama_st_file *f, const llama_st_tensor *t, ag_tensor *p, ag_err *err) {
    if (p->dtype == AG_F32) return llama_st_read_f32(f, t, p->data, (size_t)p->numel, err);
    float *v = malloc((size_t)p->numel * sizeof(float));
    if (!v) {
        ag_err_set(err, "%s: out of memory for its float32 values", ag_tensor_name(p));
        return -1;
    }
    int rc = llama_st_read_f32(f, t, v, (size_t)p->numel, err);
    if (rc == 0) ag_tensor_from_f32(p, v);
    free(v);
    return rc;
}

int llama_model_load(llama_model *m, const char *st_path, ag_err *err) {
    llama_ckpt *c = NULL;
    if (llama_ckpt_open(&c, st_path, err) != 0) return -1;
    int rc = llama_ckpt_check_params(c, &m->cfg, false, err);
    for (size_t i = 0; rc == 0 && i < m->nparams; i++) {
        ag_tensor *p = m->params[i];
        const llama_st_file *f;
        const llama_st_tensor *t = llama_ckpt_find(c, ag_tensor_name(p), &f);
        if (p->data) rc = llama_read_into(f, t, p, err);
    }
    llama_ckpt_close(c);
    return rc;
}

int llama_model_save_file(const llama_model *m, FILE *f, bool grads, ag_err *err) {
    ag_tensor *const *list = grads ? m->trainable : m->params;
    size_t n = grads ? m->ntrainable : m->nparams;
    const char **names = calloc(n, sizeof *names);
    int *ndims = calloc(n, sizeof *ndims);
    int64_t(*shapes)[LLAMA_ST_WRITE_MAX_DIMS] = calloc(n, sizeof *shapes);
    const float **data = calloc(n, sizeof *data);
    float **wide = calloc(n, sizeof *wide); // float32 copies of tensors of other dtypes
    int rc = -1;
    if (!names || !ndims || !shapes || !data || !wide) {
        ag_err_set(err, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        const ag_tensor *p = list[i];
        const ag_tensor *src = grads ? p->grad : p;
        if (!src || !src->data) {
            ag_err_set(err, "%s has no %s to write", ag_tensor_name(p), grads ? "gradient" : "data (meta mode)");
            goto done;
        }
        names[i] = ag_tensor_name(p);
        ndims[i] = p->ndim;
        memcpy(shapes[i], p->shape, sizeof(int64_t) * (size_t)p->ndim);
        if (!(data[i] = llama_f32_view(src, &wide[i], err))) goto done;
    }
    const int64_t(*cshapes)[LLAMA_ST_WRITE_MAX_DIMS] = (const int64_t(*)[LLAMA_ST_WRITE_MAX_DIMS])shapes;
    rc = llama_st_write_f32_file(f, n, names, ndims, cshapes, data, err);
done:
    for (size_t i = 0; wide && i < n; i++) free(wide[i]);
    free(wide);
    free(names);
    free(ndims);
    free(shapes);
    free(data);
    return rc;
}

int llama_check_tokens(const llama_config *c, const int32_t *ids, size_t n, ag_err *err) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= c->vocab) {
            ag_err_set(err, "token id %d at position %zu is out of range: the vocabulary has ids 0 to %lld", ids[i], i,
                       (long long)c->vocab - 1);
            return -1;
        }
    return 0;
}
