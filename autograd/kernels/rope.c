// RoPE's rotation of one row of heads, and the frequencies a rope op can take (the rope op with
// its angles from the positions, and rope_cs with HF's cos/sin tables, both run on it).
#include <math.h>

#include "ag_kernels.h"

void ag_rope_row(float *y, const float *x, const float *c0, const float *s0, const float *c1, const float *s1, int nh,
                 int hd, float sign, bool accumulate) {
    const int half = hd / 2;
    for (int h = 0; h < nh; h++) {
        const float *xa = x + h * hd, *xb = xa + half;
        float *ya = y + h * hd, *yb = ya + half;
        for (int i = 0; i < half; i++) {
            float va = xa[i] * c0[i] - xb[i] * sign * s0[i], vb = xb[i] * c1[i] + xa[i] * sign * s1[i];
            ya[i] = accumulate ? ya[i] + va : va;
            yb[i] = accumulate ? yb[i] + vb : vb;
        }
    }
}

bool ag_rope_freqs_ok(const ag_rope_freqs *f, int hd) {
    if (!f || !(f->theta > 0.0f) || !(f->scale >= 0.0f && isfinite(f->scale))) return false;
    for (int i = 0; f->inv_freq && i < hd / 2; i++)
        if (!(f->inv_freq[i] > 0.0f && isfinite(f->inv_freq[i]))) return false;
    return true;
}
