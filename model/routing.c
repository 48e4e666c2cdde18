// Routings of a mixture of experts: how many tokens each expert gets, forward by forward and
// layer by layer. A real run measures them (and may write them out); a meta run, which has no
// router output, takes them from an assumption (balanced, worst) or from a file a real run wrote,
// so that meta == real to the byte under the same routing.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

// One sparse layer of one forward.
typedef struct {
    int64_t forward, layer, tokens;
    int64_t *count; // [experts]
} entry;

struct llama_routing {
    llama_routing_kind kind;
    char path[256]; // LLAMA_ROUTING_FILE: where it came from
    int experts, top_k;
    entry *e;
    size_t n, cap;
};

int llama_routing_new(llama_routing **out, llama_routing_kind kind, ag_err *err) {
    *out = calloc(1, sizeof **out);
    if (!*out) {
        ag_err_set(err, "out of memory for the routing");
        return -1;
    }
    (*out)->kind = kind;
    return 0;
}

void llama_routing_free(llama_routing *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) free(r->e[i].count);
    free(r->e);
    free(r);
}

llama_routing_kind llama_routing_kind_of(const llama_routing *r) { return r ? r->kind : LLAMA_ROUTING_BALANCED; }

const char *llama_routing_describe(const llama_routing *r, char *buf, size_t len) {
    switch (llama_routing_kind_of(r)) {
    case LLAMA_ROUTING_WORST:
        snprintf(buf, len, "worst (every token to the same top-k experts: each of them gets all the tokens)");
        break;
    case LLAMA_ROUTING_FILE: snprintf(buf, len, "recorded (%s, a real run's routing)", r->path); break;
    case LLAMA_ROUTING_MEASURED: snprintf(buf, len, "measured (the router's choices)"); break;
    default: snprintf(buf, len, "balanced (every expert gets tokens x k / experts)"); break;
    }
    return buf;
}

static entry *find(const llama_routing *r, int64_t forward, int64_t layer) {
    for (size_t i = 0; i < r->n; i++)
        if (r->e[i].forward == forward && r->e[i].layer == layer) return &r->e[i];
    return NULL;
}

int llama_routing_add(llama_routing *r, int64_t forward, int64_t layer, int64_t tokens, int E, int k,
                      const int64_t *count, ag_err *err) {
    if (find(r, forward, layer)) return 0; // a recomputation (checkpointing) routes as the forward did
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 64;
        entry *e = realloc(r->e, cap * sizeof *e);
        if (!e) {
            ag_err_set(err, "out of memory recording the routing");
            return -1;
        }
        r->e = e, r->cap = cap;
    }
    int64_t *c = malloc((size_t)E * sizeof *c);
    if (!c) {
        ag_err_set(err, "out of memory recording the routing");
        return -1;
    }
    memcpy(c, count, (size_t)E * sizeof *c);
    r->e[r->n++] = (entry){forward, layer, tokens, c};
    r->experts = E, r->top_k = k;
    return 0;
}

int llama_routing_counts(const llama_routing *r, int64_t forward, int64_t layer, int64_t tokens, int E, int k,
                         int64_t *count, ag_err *err) {
    switch (llama_routing_kind_of(r)) {
    case LLAMA_ROUTING_WORST: // the same k experts for every token: k of them get all N
        for (int e = 0; e < E; e++) count[e] = e < k ? tokens : 0;
        return 0;
    case LLAMA_ROUTING_FILE: {
        const entry *x = find(r, forward, layer);
        if (!x) {
            ag_err_set(err, "%s: no routing for forward %lld, layer %lld (the file holds %zu layer routings)", r->path,
                       (long long)forward, (long long)layer, r->n);
            return -1;
        }
        if (x->tokens != tokens || r->experts != E || r->top_k != k) {
            ag_err_set(err,
                       "%s: forward %lld, layer %lld routed %lld tokens to %d experts, %d each; this run has %lld, "
                       "%d, %d",
                       r->path, (long long)forward, (long long)layer, (long long)x->tokens, r->experts, r->top_k,
                       (long long)tokens, E, k);
            return -1;
        }
        memcpy(count, x->count, (size_t)E * sizeof *count);
        return 0;
    }
    default: // balanced (and a measured routing asked in meta mode)
        for (int e = 0; e < E; e++) count[e] = tokens * k / E + (e < tokens * k % E ? 1 : 0);
        return 0;
    }
}

// ------------------------------------------------------------------------------------------------
// The file: {"membill_routing": 1, "experts": E, "top_k": k,
//            "layers": [{"forward": f, "layer": l, "tokens": n, "count": [c_0, ..., c_{E-1}]}, ...]}

int llama_routing_write(const llama_routing *r, FILE *f, ag_err *err) {
    json_t *root = json_pack("{s:i, s:i, s:i}", "membill_routing", 1, "experts", r->experts, "top_k", r->top_k);
    json_t *layers = json_array();
    for (size_t i = 0; root && layers && i < r->n; i++) {
        json_t *c = json_array();
        for (int e = 0; c && e < r->experts; e++) json_array_append_new(c, json_integer((json_int_t)r->e[i].count[e]));
        json_array_append_new(layers,
                              json_pack("{s:I, s:I, s:I, s:o}", "forward", (json_int_t)r->e[i].forward, "layer",
                                        (json_int_t)r->e[i].layer, "tokens", (json_int_t)r->e[i].tokens, "count", c));
    }
    int rc = root && layers && json_object_set_new(root, "layers", layers) == 0 &&
                     json_dumpf(root, f, JSON_INDENT(1) | JSON_COMPACT) == 0 && fputc('\n', f) != EOF
                 ? 0
                 : -1;
    if (!root || !layers || rc != 0) ag_err_set(err, "cannot write the routing");
    if (!root) json_decref(layers);
    json_decref(root);
    return rc;
}

// One layer's entry of the file, checked against the config.
static int load_entry(llama_routing *r, json_t *l, size_t i, const llama_config *c, const char *path, ag_err *err) {
    json_int_t fw = -1, layer = -1, tokens = -1;
    json_t *count = NULL;
    if (json_unpack(l, "{s:I, s:I, s:I, s:o}", "forward", &fw, "layer", &layer, "tokens", &tokens, "count", &count) ||
        fw < 0 || layer < 0 || layer >= c->layers || tokens < 1 || !json_is_array(count) ||
        json_array_size(count) != (size_t)c->moe.experts || !llama_layer_moe(c, layer)) {
        ag_err_set(err,
                   "%s: layers[%zu] must be {\"forward\", \"layer\" (a sparse layer of the model), \"tokens\", "
                   "\"count\": [%lld counts]}",
                   path, i, (long long)c->moe.experts);
        return -1;
    }
    int64_t cnt[c->moe.experts], sum = 0;
    for (size_t e = 0; e < json_array_size(count); e++) {
        const json_t *v = json_array_get(count, e);
        cnt[e] = json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
        if (cnt[e] < 0 || cnt[e] > tokens) {
            ag_err_set(err, "%s: layers[%zu].count[%zu] must be a count from 0 to tokens (%lld)", path, i, e,
                       (long long)tokens);
            return -1;
        }
        sum += cnt[e];
    }
    if (sum != tokens * c->moe.top_k) {
        ag_err_set(err, "%s: layers[%zu] routes %lld pairs, expected tokens x top_k = %lld", path, i, (long long)sum,
                   (long long)(tokens * c->moe.top_k));
        return -1;
    }
    return llama_routing_add(r, fw, layer, tokens, (int)c->moe.experts, (int)c->moe.top_k, cnt, err);
}

int llama_routing_load(llama_routing **out, const char *path, const llama_config *c, ag_err *err) {
    *out = NULL;
    char *text;
    size_t len;
    if (llama_read_file(path, "a routing file", 256u << 20, &text, &len, err) != 0) return -1;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    json_int_t E = 0, k = 0;
    json_t *layers = NULL;
    int rc = -1;
    if (!root) {
        ag_err_set(err, "%s: not valid JSON (line %d: %s)", path, jerr.line, jerr.text);
    } else if (json_unpack(root, "{s:i, s:I, s:I, s:o}", "membill_routing", &(int){0}, "experts", &E, "top_k", &k,
                           "layers", &layers) ||
               !json_is_array(layers)) {
        ag_err_set(err, "%s: expected {\"membill_routing\": 1, \"experts\", \"top_k\", \"layers\": [...]}", path);
    } else if (E != c->moe.experts || k != c->moe.top_k) {
        ag_err_set(err, "%s: a routing of %lld experts, %lld a token; the model has %lld, %lld", path, (long long)E,
                   (long long)k, (long long)c->moe.experts, (long long)c->moe.top_k);
    } else if (llama_routing_new(out, LLAMA_ROUTING_FILE, err) == 0) {
        snprintf((*out)->path, sizeof(*out)->path, "%s", path);
        (*out)->experts = (int)E, (*out)->top_k = (int)k;
        rc = 0;
        for (size_t i = 0; rc == 0 && i < json_array_size(layers); i++)
            rc = load_entry(*out, json_array_get(layers, i), i, c, path, err);
        if (rc != 0) llama_routing_free(*out), *out = NULL;
    }
    json_decref(root);
    return rc;
}

// ------------------------------------------------------------------------------------------------
// What training's gradients and optimizer state cover

// The parameters of the routed experts whose hit[layer x E + expert] lacks `bit`.
static uint64_t idle_params(const llama_config *c, const unsigned char *hit, unsigned char bit) {
    uint64_t idle = 0;
    const size_t n = llama_param_count_tensors(c);
    for (size_t i = 0; i < n; i++) {
        llama_param_info p;
        if (llama_param_info_of(c, i, &p) != 0 || p.expert < 0 || p.buffer) continue;
        if (!(hit[p.layer * c->moe.experts + p.expert] & bit))
            idle += (uint64_t)p.shape[0] * (uint64_t)p.shape[1] * (uint64_t)p.shape[2];
    }
    return idle;
}

// hit: bit 1 the step under way, bit 2 some step.
static int step_hits(const llama_routing *r, const llama_config *c, int64_t tokens, int64_t from, int64_t accum,
                     unsigned char *hit, int64_t *count, ag_err *err) {
    const int E = (int)c->moe.experts, k = (int)c->moe.top_k;
    for (int64_t l = 0; l < c->layers; l++)
        for (int e = 0; e < E; e++) hit[l * E + e] &= 2;
    for (int64_t f = from; f < from + accum; f++)
        for (int64_t l = 0; l < c->layers; l++) {
            if (!llama_layer_moe(c, l)) continue;
            if (llama_routing_counts(r, f, l, tokens, E, k, count, err) != 0) return -1;
            for (int e = 0; e < E; e++)
                if (count[e] > 0) hit[l * E + e] = 3;
        }
    return 0;
}

int llama_routing_trained(const llama_routing *r, const llama_config *c, int64_t tokens, int64_t steps, int64_t accum,
                          uint64_t *most, uint64_t *any, ag_err *err) {
    const uint64_t P = llama_param_count(c);
    *most = *any = P;
    if (c->moe.experts <= 0) return 0;
    unsigned char *hit = calloc((size_t)(c->layers * c->moe.experts), 1);
    int64_t *count = malloc((size_t)c->moe.experts * sizeof *count);
    int rc = hit && count ? 0 : -1;
    if (rc != 0) ag_err_set(err, "out of memory for the routing's experts");
    *most = 0;
    for (int64_t s = 0; rc == 0 && s < steps; s++) {
        rc = step_hits(r, c, tokens, s * accum, accum, hit, count, err);
        uint64_t covered = P - idle_params(c, hit, 1);
        if (rc == 0 && covered > *most) *most = covered;
    }
    if (rc == 0) *any = P - idle_params(c, hit, 2);
    free(hit);
    free(count);
    return rc;
}
