// Private to model/: the pieces of a block that training and generation share.
#pragma once

#include "model.h"

// lora.c: projection p of block i on x (x stays the caller's): the base linear, plus its adapter
// when it has one (PEFT's lora.Linear).
ag_tensor *llama_proj_forward(ag_ctx *ctx, const llama_layer *L, int64_t i, llama_proj p, ag_tensor *x);
// A fused projection's rows in parts (phi3's qkv_proj: q, k, v; gate_up_proj: gate, up).
typedef struct {
    int n;
    int64_t rows[3];
} llama_parts;
// The same with the output laid out part after part (ag_linear_parts), its adapter's too; parts
// NULL: llama_proj_forward.
ag_tensor *llama_proj_forward_parts(ag_ctx *ctx, const llama_layer *L, int64_t i, llama_proj p, ag_tensor *x,
                                    const llama_parts *parts);
// Projections p[0..n) of block i on one input x, as llama_proj_forward gives each; without adapters
// on any, as one ag_linear_group (a decode step's products of one input in one loop of the pool).
void llama_projs_forward(ag_ctx *ctx, const llama_layer *L, int64_t i, int n, const llama_proj *p, ag_tensor *x,
                         ag_tensor **out);
// "layers.<i>.<what>": the site prefix of an op inside block i.
const char *llama_site(char buf[96], int64_t i, const char *what);
// The config's RMSNorm of x (x stays the caller's): Gemma's weight as 1 + w.
ag_tensor *llama_norm(ag_ctx *ctx, const llama_config *c, const char *site, ag_tensor *x, ag_tensor *w);
// The attention half's two ends, shared by training and generation. llama_qkv: q, k, v of
// norm(x) (x stays the caller's). llama_attention_out: x + o_proj(a) (Gemma 2: x + norm(o_proj(a))),
// taking ownership of x and a.
void llama_qkv(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i, ag_tensor **q,
               ag_tensor **k, ag_tensor **v);
ag_tensor *llama_attention_out(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, ag_tensor *a,
                               int64_t i);
// x[B, T, H] -> x + down(silu(gate(norm(x))) * up(norm(x))); takes ownership of x. Records on
// the tape in grad mode, not otherwise.
ag_tensor *llama_mlp_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i);
// blocks_moe.c: the same for a sparse layer (the router, the routed experts, the shared expert).
ag_tensor *llama_moe_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i);
// blocks_fused.c: phi3's fused projections split into their parts as the framework's row says
// (fused_split). q, k and v of h (h stays the caller's); act(gate) * up of h, before down_proj
// (taking ownership of h, freed once the product has it).
void llama_fused_qkv(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *h, int64_t i, ag_tensor **q,
                     ag_tensor **k, ag_tensor **v);
ag_tensor *llama_fused_glu(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *h, int64_t i);
// What a training forward shares across its blocks as transformers' LlamaModel runs it
// (PYTORCH semantics); all NULL for the lean forward.
typedef struct {
    ag_tensor *cos, *sin;             // LlamaRotaryEmbedding's tables [1, T, head_dim]: ag_rope_cs, else ag_rope
    ag_tensor *cos_local, *sin_local; // Gemma 3's rotary_emb_local (its sliding layers'); NULL: none
    ag_tensor **cache;                // [2 * layers]: the DynamicCache of the output (k after RoPE, v), kept
                                      // until the output is dropped; NULL: none
    ag_tensor *positions;             // checkpointing: cache_position, int64 [T], handed to every layer; NULL: none
} llama_shared;

// x[B, T, H] -> x + o_proj(attention(rope(q), rope(k), v)) of norm(x); takes ownership of x.
ag_tensor *llama_attention_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, const llama_shared *sh,
                                 ag_tensor *x, int64_t i);
// blocks_mla.c: deepseek_v3's q and k [B, t, heads*(nope + rope)] and v [B, t, heads*v_head] of
// norm(x) (x stays the caller's), RoPE at the given positions (NULL: 0 .. t-1) of a run of
// `positions` in all (longrope picks its factors by it).
void llama_mla_qkv(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i,
                   const int32_t *pos, int64_t positions, ag_tensor **qf, ag_tensor **kf, ag_tensor **v);
// The same for DeepSeek's latent cache: q_nope [B, t, heads*nope], the rotated q_pe [B, t,
// heads*rope] and a token's latent [B, t, kv_lora + rope] (the normed compressed kv, the rotated k_pe).
void llama_mla_latent(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x, int64_t i,
                      const int32_t *pos, int64_t positions, ag_tensor **q_nope, ag_tensor **q_pe,
                      ag_tensor **latent);
// blocks_mla.c: deepseek_v3's latent attention half, x + o_proj(attention) of norm(x); takes
// ownership of x.
ag_tensor *llama_mla_attention_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, ag_tensor *x,
                                     int64_t i);
// One decoder block, the attention half then the MLP half; takes ownership of x. sh may be NULL.
ag_tensor *llama_block(ag_ctx *ctx, const llama_config *c, const llama_layer *L, const llama_shared *sh, ag_tensor *x,
                       int64_t i);
