// The sizes of a grouped-query attention and which keys each query sees: what the attention ops
// and the causal kernels share.
#pragma once

#include <math.h>
#include <stdint.h>

// q[B, Tq, Hq*D], k and v [B, Tk, Hkv*D].
typedef struct {
    int64_t B, Tq, Tk;
    int Hq, Hkv, D;
    int64_t window; // 0: causal only; else the query at position p sees keys j with p - j < window
    float scale;    // on Q Kᵀ; 0: 1 / sqrt(D)
    float softcap;  // the scores capped as softcap tanh(S / softcap) before the softmax; 0: none
} ag_att_dims;

static inline float ag_att_scale(const ag_att_dims *a) {
    return a->scale > 0.0f ? a->scale : 1.0f / sqrtf((float)a->D);
}

// The first key the query at position p sees: p - window + 1 under a sliding window, else 0.
static inline int64_t ag_window_first(int64_t p, int64_t window) {
    return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

// How many keys query row i (of Tq, at position i + Tk - Tq) sees: keys 0 .. that - 1.
static inline int64_t ag_keys_seen(const ag_att_dims *a, int64_t i) { return i + a->Tk - a->Tq + 1; }
