// RoPE's frequencies under rope_scaling, computed as transformers' modeling_rope_utils does
// (_compute_default / linear / dynamic / llama3 / yarn_parameters), in double, then float32.
#include <math.h>

#include "model.h"

static void default_freqs(double *inv, int half, int dim, double base) {
    for (int i = 0; i < half; i++) inv[i] = 1.0 / pow(base, (double)(2 * i) / dim);
}

// Llama 3.1: wavelengths past original / low_freq_factor divided by factor, those below
// original / high_freq_factor kept, the ones between interpolated.
static void llama3(double *inv, int half, const llama_rope_scaling *r) {
    const double old = (double)r->original_max_positions, lo = r->low_freq_factor, hi = r->high_freq_factor;
    const double low_wavelen = old / lo, high_wavelen = old / hi;
    for (int i = 0; i < half; i++) {
        double wavelen = 2.0 * M_PI / inv[i], f = wavelen > low_wavelen ? inv[i] / r->factor : inv[i];
        if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
            double smooth = (old / wavelen - lo) / (hi - lo);
            f = (1.0 - smooth) * f / r->factor + smooth * f;
        }
        inv[i] = f;
    }
}

static double yarn_mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

// The dimension at which num_rotations turns fit the original context.
static double correction_dim(double rotations, int dim, double base, double positions) {
    return (dim * log(positions / (rotations * 2.0 * M_PI))) / (2.0 * log(base));
}

// YaRN; returns the attention factor.
static double yarn(double *inv, int half, int dim, double base, const llama_config *c) {
    const llama_rope_scaling *r = &c->rope;
    double factor = r->factor, orig = (double)c->max_positions;
    if (r->original_max_positions > 0) { // transformers then takes the ratio, not factor
        orig = (double)r->original_max_positions;
        factor = (double)c->max_positions / orig;
    }
    double att = r->attention_factor;
    if (att == 0.0)
        att = r->mscale > 0.0 && r->mscale_all_dim > 0.0
                  ? yarn_mscale(factor, r->mscale) / yarn_mscale(factor, r->mscale_all_dim)
                  : yarn_mscale(factor, 1.0);
    double low = correction_dim(r->beta_fast, dim, base, orig), high = correction_dim(r->beta_slow, dim, base, orig);
    if (r->truncate) low = floor(low), high = ceil(high);
    low = low > 0.0 ? low : 0.0;
    high = high < dim - 1 ? high : dim - 1;
    if (low == high) high += 0.001; // transformers' guard against a zero-width ramp
    for (int i = 0; i < half; i++) {
        double pos_freq = pow(base, (double)(2 * i) / dim), ramp = ((double)i - low) / (high - low);
        ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
        double extrapolation = 1.0 - ramp; // its share
        inv[i] = 1.0 / (factor * pos_freq) * (1.0 - extrapolation) + 1.0 / pos_freq * extrapolation;
    }
    return att;
}

// The original context of longrope: rope_scaling's, else the config's
// original_max_position_embeddings (0: max_position_embeddings).
static int64_t longrope_original(const llama_config *c) {
    return c->rope.original_max_positions > 0 ? c->rope.original_max_positions : c->max_positions;
}

// LongRoPE (_compute_longrope_parameters): each default frequency divided by its factor, short or
// long; returns the attention factor, sqrt(1 + ln(factor) / ln(original)) unless given, factor
// being max_position_embeddings / original.
static double longrope(double *inv, float *long_inv, int half, int dim, double base, const llama_config *c) {
    const llama_rope_scaling *r = &c->rope;
    const double orig = (double)longrope_original(c), factor = (double)c->max_positions / orig;
    for (int i = 0; i < half; i++) {
        double f = pow(base, (double)(2 * i) / dim);
        long_inv[i] = (float)(1.0 / (r->long_factor[i] * f));
        inv[i] = 1.0 / (r->short_factor[i] * f);
    }
    if (r->attention_factor > 0.0) return r->attention_factor;
    return factor <= 1.0 ? 1.0 : sqrt(1.0 + log(factor) / log(orig));
}

void llama_rope_prepare(llama_config *c) {
    const int dim = (int)c->head_dim, half = dim / 2;
    double inv[AG_ROPE_MAX_HEAD_DIM / 2], scale = 1.0;
    llama_rope_scaling *r = &c->rope;
    if (half < 1 || half > AG_ROPE_MAX_HEAD_DIM / 2) return;
    default_freqs(inv, half, dim, c->rope_theta);
    switch (r->type) {
    case LLAMA_ROPE_DEFAULT:
    case LLAMA_ROPE_DYNAMIC: break; // dynamic: the default up to max_position_embeddings
    case LLAMA_ROPE_LINEAR:
        for (int i = 0; i < half; i++) inv[i] /= r->factor;
        break;
    case LLAMA_ROPE_LLAMA3: llama3(inv, half, r); break;
    case LLAMA_ROPE_YARN: scale = yarn(inv, half, dim, c->rope_theta, c); break;
    case LLAMA_ROPE_LONGROPE: scale = longrope(inv, r->long_inv_freq, half, dim, c->rope_theta, c); break;
    }
    for (int i = 0; i < half; i++) r->inv_freq[i] = (float)inv[i];
    r->scale = (float)scale;
    r->prepared = true;
}

ag_rope_freqs llama_rope_freqs(const llama_config *c) {
    // the default stays the ops' own float32 formula, as before rope_scaling existed
    if (!c->rope.prepared || c->rope.type == LLAMA_ROPE_DEFAULT || c->rope.type == LLAMA_ROPE_DYNAMIC)
        return (ag_rope_freqs){(float)c->rope_theta, NULL, 1.0f};
    return (ag_rope_freqs){(float)c->rope_theta, c->rope.inv_freq, c->rope.scale};
}

ag_rope_freqs llama_rope_freqs_at(const llama_config *c, int64_t positions) {
    ag_rope_freqs f = llama_rope_freqs(c);
    if (c->rope.prepared && c->rope.type == LLAMA_ROPE_LONGROPE && positions > longrope_original(c))
        f.inv_freq = c->rope.long_inv_freq;
    return f;
}
