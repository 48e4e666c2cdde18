// DeepSeek-V3's multi-head latent attention as transformers' DeepseekV3Attention computes it:
// q from q_a_proj, q_a_layernorm and q_b_proj (or q_proj), split into a position-free and a
// rotated part; kv_a_proj_with_mqa split into the compressed kv (normed, then kv_b_proj into each
// head's k_nope and v) and one shared k_pe; RoPE on q_pe and k_pe alone (de-interleaved first when
// rope_interleave); q = cat(q_nope, q_pe), k = cat(k_nope, k_pe) per head; attention with a value
// head of its own; o_proj.
#include "blocks.h"

#include "model_internal.h"

#define REL(t) (ag_release(t), (t) = NULL)

int llama_deepseek_v3_check_run(const llama_config *c, const ag_ctx *ctx, const char *what, ag_err *err) {
    (void)c, (void)what;
    const ag_framework_row *fw = ag_ctx_framework_row(ctx);
    const char *why = AG_FW(fw, moe) != AG_MOE_GROUPED || AG_FW(fw, attention) != AG_ATTENTION_OPS_FUSED
                          ? "this framework (transformers' DeepseekV3Attention and DeepseekV3TopkRouter are not "
                            "modelled op by op: --framework lean)"
                      : ag_ctx_attention(ctx) != AG_ATTENTION_EAGER
                          ? "this --attention (the latent attention's value head differs from its key head: eager)"
                          : NULL;
    if (!why) return 0;
    ag_err_set(err,
               "%s: model_type \"deepseek_v3\" (DeepseekV3ForCausalLM) runs under --framework lean with eager "
               "attention; not %s",
               what, why);
    return -1;
}

// The query [B, T, H*(nope + rope)]: q_b_proj(q_a_layernorm(q_a_proj(h))), or q_proj(h).
static ag_tensor *mla_query(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *h, int64_t i) {
    char s[96];
    if (c->mla.q_lora_rank == 0) return ag_linear(ctx, llama_site(s, i, "self_attn.q_proj"), h, L->q, NULL);
    ag_tensor *qa = ag_linear(ctx, llama_site(s, i, "self_attn.q_a_proj"), h, L->q_a, NULL);
    ag_tensor *qn = qa ? llama_norm(ctx, c, llama_site(s, i, "self_attn.q_a_layernorm"), qa, L->q_a_norm) : NULL;
    REL(qa);
    ag_tensor *q = qn ? ag_linear(ctx, llama_site(s, i, "self_attn.q_b_proj"), qn, L->q_b, NULL) : NULL;
    REL(qn);
    return q;
}

// Each head's position-free columns and its rotated ones, cat'd (takes ownership of both).
static ag_tensor *mla_cat(ag_ctx *ctx, const llama_config *c, const char *site, ag_tensor *nope, ag_tensor *pe) {
    ag_tensor *y = ag_head_cat(ctx, site, nope, pe, (int)c->heads, (int)c->mla.qk_nope, (int)c->mla.qk_rope);
    ag_release(nope), ag_release(pe);
    return y;
}

// What both caches start from: q's two parts, the normed compressed kv and k_pe (before RoPE).
static void mla_parts(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i,
                      ag_tensor **q_nope, ag_tensor **q_pe, ag_tensor **ckn, ag_tensor **k_pe) {
    char s[96];
    const llama_mla *m = &c->mla;
    const int H = (int)c->heads, nope = (int)m->qk_nope, R = (int)m->qk_rope;
    const int Dq = nope + R, Lk = (int)m->kv_lora_rank;
    ag_tensor *h = llama_norm(ctx, c, llama_site(s, i, "input_layernorm"), x, L->input_norm);
    ag_tensor *q = mla_query(ctx, c, L, h, i);
    ag_tensor *kva = ag_linear(ctx, llama_site(s, i, "self_attn.kv_a_proj_with_mqa"), h, L->kv_a, NULL);
    REL(h);
    *q_nope = ag_head_slice(ctx, llama_site(s, i, "self_attn.q_pass"), q, H, Dq, 0, nope, false);
    *q_pe = ag_head_slice(ctx, llama_site(s, i, "self_attn.q_rot"), q, H, Dq, nope, R, m->rope_interleave);
    REL(q);
    ag_tensor *ckv = ag_head_slice(ctx, llama_site(s, i, "self_attn.k_pass"), kva, 1, Lk + R, 0, Lk, false);
    *k_pe = ag_head_slice(ctx, llama_site(s, i, "self_attn.k_rot"), kva, 1, Lk + R, Lk, R, m->rope_interleave);
    REL(kva);
    *ckn = ckv ? llama_norm(ctx, c, llama_site(s, i, "self_attn.kv_a_layernorm"), ckv, L->kv_a_norm) : NULL;
    REL(ckv);
}

// RoPE of q_pe (heads) and k_pe (one head) at the positions (NULL: 0 .. t-1); takes both.
static void mla_rope(ag_ctx *ctx, const llama_config *c, int64_t i, const int32_t *pos, int64_t positions,
                     ag_tensor **q_pe, ag_tensor **k_pe) {
    char s[96];
    const int H = (int)c->heads, R = (int)c->mla.qk_rope;
    const ag_rope_freqs f = llama_layer_rope_freqs(c, i, positions);
    ag_tensor *q_r = pos ? ag_rope_positions_f(ctx, llama_site(s, i, "self_attn.q_rope"), *q_pe, H, R, &f, pos)
                         : ag_rope_f(ctx, llama_site(s, i, "self_attn.q_rope"), *q_pe, H, R, &f, 0);
    ag_tensor *k_r = pos ? ag_rope_positions_f(ctx, llama_site(s, i, "self_attn.k_rope"), *k_pe, 1, R, &f, pos)
                         : ag_rope_f(ctx, llama_site(s, i, "self_attn.k_rope"), *k_pe, 1, R, &f, 0);
    REL(*q_pe), REL(*k_pe);
    *q_pe = q_r, *k_pe = k_r;
}

void llama_mla_qkv(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i,
                   const int32_t *pos, int64_t positions, ag_tensor **qf, ag_tensor **kf, ag_tensor **v) {
    char s[96];
    const int H = (int)c->heads, nope = (int)c->mla.qk_nope, Dv = (int)c->mla.v_head;
    ag_tensor *q_nope, *q_pe, *ckn, *k_pe;
    mla_parts(ctx, c, L, x, i, &q_nope, &q_pe, &ckn, &k_pe);
    ag_tensor *kv = ckn ? ag_linear(ctx, llama_site(s, i, "self_attn.kv_b_proj"), ckn, L->kv_b, NULL) : NULL;
    REL(ckn);
    ag_tensor *k_nope = ag_head_slice(ctx, llama_site(s, i, "self_attn.k_nope"), kv, H, nope + Dv, 0, nope, false);
    *v = ag_head_slice(ctx, llama_site(s, i, "self_attn.value"), kv, H, nope + Dv, nope, Dv, false);
    REL(kv);
    mla_rope(ctx, c, i, pos, positions, &q_pe, &k_pe);
    *qf = mla_cat(ctx, c, llama_site(s, i, "self_attn.query"), q_nope, q_pe);
    *kf = mla_cat(ctx, c, llama_site(s, i, "self_attn.key"), k_nope, k_pe);
}

void llama_mla_latent(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i,
                      const int32_t *pos, int64_t positions, ag_tensor **q_nope, ag_tensor **q_pe,
                      ag_tensor **latent) {
    char s[96];
    ag_tensor *ckn, *k_pe;
    mla_parts(ctx, c, L, x, i, q_nope, q_pe, &ckn, &k_pe);
    mla_rope(ctx, c, i, pos, positions, q_pe, &k_pe);
    *latent = ag_head_cat(ctx, llama_site(s, i, "self_attn.latent"), ckn, k_pe, 1, (int)c->mla.kv_lora_rank,
                          (int)c->mla.qk_rope);
    REL(ckn), REL(k_pe);
}

ag_tensor *llama_mla_attention_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x,
                                     int64_t i) {
    char s[96];
    const int H = (int)c->heads, Dq = (int)(c->mla.qk_nope + c->mla.qk_rope);
    ag_tensor *qf, *kf, *v;
    llama_mla_qkv(ctx, c, L, x, i, NULL, x->shape[x->ndim - 2], &qf, &kf, &v); // from position 0
    ag_tensor *a =
        ag_attention_mla(ctx, llama_site(s, i, "self_attn"), qf, kf, v, H, Dq, (int)c->mla.v_head, llama_mla_scale(c));
    REL(qf), REL(kf), REL(v);
    if (!a) {
        ag_release(x);
        return NULL;
    }
    return llama_attention_out(ctx, c, L, x, a, i);
}
