// What the training forward and generation share: site labels and the halves of a block.
#include "blocks.h"

#define REL(t) (ag_release(t), (t) = NULL)

// "layers.<i>.<what>": the site prefix of an op inside block i.
const char *llama_site(char buf[96], int64_t i, const char *what) {
    size_t n = ag_str_put_i64(buf, 96, ag_str_put(buf, 96, 0, "layers."), (long long)i);
    ag_str_put(buf, 96, ag_str_put(buf, 96, n, "."), what);
    return buf;
}

ag_tensor *llama_norm(ag_ctx *ctx, const llama_config *c, const char *site, ag_tensor *x, ag_tensor *w) {
    return ag_rmsnorm_offset(ctx, site, x, w, (float)c->rms_eps, c->norm_offset);
}

// Gemma 2: a sub-block's output normed before its residual add (takes ownership of y).
static ag_tensor *post_norm(ag_ctx *ctx, const llama_config *c, const char *what, ag_tensor *w, ag_tensor *y,
                            int64_t i) {
    if (!c->ff_norms) return y;
    char s[96];
    ag_tensor *n = llama_norm(ctx, c, llama_site(s, i, what), y, w);
    ag_release(y);
    return n;
}

// act(gate(h)) * up(h), act SiLU or Gemma's GeLU-tanh; takes ownership of h (freed once the
// projections have it).
static ag_tensor *gated(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *h, int64_t i) {
    char s[96];
    ag_tensor *gu[2];
    llama_projs_forward(ctx, L, i, 2, (const llama_proj[]){LLAMA_PROJ_GATE, LLAMA_PROJ_UP}, h, gu);
    REL(h);
    ag_tensor *g = gu[0], *u = gu[1];
    ag_tensor *a =
        c->gelu ? ag_gelu_tanh(ctx, llama_site(s, i, "mlp.act"), g) : ag_silu(ctx, llama_site(s, i, "mlp.act"), g);
    REL(g);
    ag_tensor *m = ag_mul(ctx, llama_site(s, i, "mlp.act_mul_up"), a, u);
    REL(a);
    REL(u);
    return m;
}

// x[B, T, H] -> x + down(act(gate(norm(x))) * up(norm(x))), act SiLU or Gemma's GeLU-tanh (whose
// output is normed again, post_feedforward_layernorm); takes ownership of x.
ag_tensor *llama_mlp_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i) {
    if (llama_layer_moe(c, i)) return llama_moe_block(ctx, c, L, x, i);
    char s[96];
    ag_tensor *h = c->ff_norms ? llama_norm(ctx, c, llama_site(s, i, "pre_feedforward_layernorm"), x, L->pre_ff_norm)
                               : llama_norm(ctx, c, llama_site(s, i, "post_attention_layernorm"), x, L->post_norm);
    ag_tensor *m = c->fused_proj ? llama_fused_glu(ctx, c, L, h, i) : gated(ctx, c, L, h, i);
    ag_tensor *d = llama_proj_forward(ctx, L, i, LLAMA_PROJ_DOWN, m);
    REL(m);
    d = post_norm(ctx, c, "post_feedforward_layernorm", L->post_ff_norm, d, i);
    ag_tensor *y = ag_add(ctx, llama_site(s, i, "mlp_residual"), x, d);
    ag_release(x);
    ag_release(d);
    return y;
}

void llama_qkv(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i, ag_tensor **q,
               ag_tensor **k, ag_tensor **v) {
    char s[96];
    ag_tensor *h = llama_norm(ctx, c, llama_site(s, i, "input_layernorm"), x, L->input_norm);
    ag_tensor *qkv[3];
    if (c->fused_proj)
        llama_fused_qkv(ctx, c, L, h, i, &qkv[0], &qkv[1], &qkv[2]);
    else
        llama_projs_forward(ctx, L, i, 3, (const llama_proj[]){LLAMA_PROJ_Q, LLAMA_PROJ_K, LLAMA_PROJ_V}, h, qkv);
    *q = qkv[0], *k = qkv[1], *v = qkv[2];
    ag_release(h);
    if (!c->qk_norm) return;
    // Qwen3: RMSNorm of each head of q and k (q_norm over q.view(..., heads, head_dim)), before RoPE
    ag_tensor *qn = llama_norm(ctx, c, llama_site(s, i, "self_attn.q_norm"), *q, L->q_norm);
    ag_tensor *kn = llama_norm(ctx, c, llama_site(s, i, "self_attn.k_norm"), *k, L->k_norm);
    ag_release(*q);
    ag_release(*k);
    *q = qn, *k = kn;
}

ag_tensor *llama_attention_out(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, ag_tensor *a,
                               int64_t i) {
    char s[96];
    ag_tensor *o = llama_proj_forward(ctx, L, i, LLAMA_PROJ_O, a);
    ag_release(a);
    o = post_norm(ctx, c, "post_attention_layernorm", L->post_norm, o, i);
    ag_tensor *y = ag_add(ctx, llama_site(s, i, "attn_residual"), x, o);
    ag_release(x);
    ag_release(o);
    return y;
}

// x[B, T, H] -> x + attention(norm(x)); takes ownership of x.
ag_tensor *llama_attention_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, const llama_shared *sh,
                                 ag_tensor *x, int64_t i) {
    if (c->mla.kv_lora_rank > 0) return llama_mla_attention_block(ctx, c, L, x, i);
    char s[96];
    const int hq = (int)c->heads, hkv = (int)c->kv_heads, hd = (int)c->head_dim;
    const ag_rope_freqs f = llama_layer_rope_freqs(c, i, x->shape[x->ndim - 2]); // from position 0
    ag_tensor *q, *k, *v, *qr, *kr;
    llama_qkv(ctx, c, L, x, i, &q, &k, &v);
    if (sh && sh->cos) { // Gemma 3's sliding layers: the local tables
        const bool local = sh->cos_local && llama_layer_window(c, i) > 0;
        ag_tensor *cs = local ? sh->cos_local : sh->cos, *sn = local ? sh->sin_local : sh->sin;
        qr = ag_rope_cs(ctx, llama_site(s, i, "self_attn.q_rope"), q, hq, hd, cs, sn);
        kr = ag_rope_cs(ctx, llama_site(s, i, "self_attn.k_rope"), k, hkv, hd, cs, sn);
    } else {
        qr = ag_rope_f(ctx, llama_site(s, i, "self_attn.q_rope"), q, hq, hd, &f, 0);
        kr = ag_rope_f(ctx, llama_site(s, i, "self_attn.k_rope"), k, hkv, hd, &f, 0);
    }
    REL(q);
    REL(k);
    if (sh && sh->cache && kr && v) { // DynamicCache.update keeps the layer's k and v as they are
        sh->cache[2 * i] = ag_retain(kr);
        sh->cache[2 * i + 1] = ag_retain(v);
    }
    const ag_attention_spec spec = {llama_layer_window(c, i), llama_attention_scale(c), (float)c->attn_softcap};
    ag_tensor *a =
        L->sinks // gpt_oss's sinks (no scale of its own, no cap)
            ? ag_attention_sinks(ctx, llama_site(s, i, "self_attn"), qr, kr, v, hq, hkv, hd, spec.window, L->sinks)
            : ag_attention_spec_run(ctx, llama_site(s, i, "self_attn"), qr, kr, v, hq, hkv, hd, &spec);
    REL(qr);
    REL(kr);
    REL(v);
    return llama_attention_out(ctx, c, L, x, a, i);
}

// One decoder block: x[B, T, H] -> mlp_block(attention_block(x)); takes ownership of x.
ag_tensor *llama_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, const llama_shared *sh, ag_tensor *x,
                       int64_t i) {
    return llama_mlp_block(ctx, c, L, llama_attention_block(ctx, c, L, sh, x, i), i);
}
