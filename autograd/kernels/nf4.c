// NF4 with double quantisation, as bitsandbytes lays it out (ag_nf4.h). Rounding follows its
// reference kernels: a value scaled into [-1, 1] takes the lowest code whose midpoint with the
// next is not below it (torch.bucketize over the midpoints).
#include "ag_nf4.h"
#include "autograd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const float ag_nf4_code[16] = {-1.0f,
                               -0.6961928009986877f,
                               -0.5250730514526367f,
                               -0.39491748809814453f,
                               -0.28444138169288635f,
                               -0.18477343022823334f,
                               -0.09105003625154495f,
                               0.0f,
                               0.07958029955625534f,
                               0.16093020141124725f,
                               0.24611230194568634f,
                               0.33791524171829224f,
                               0.44070982933044434f,
                               0.5626170039176941f,
                               0.7229568362236023f,
                               1.0f};

// torch.linspace(0.1, 1, n) in float32, as its CPU kernel steps: from the start for the first
// half, from the end for the second.
static float linspace_at(int i, int n) {
    const float a = 0.1f, b = 1.0f, step = (b - a) / (float)(n - 1);
    return i < n / 2 ? a + step * (float)i : b - step * (float)(n - 1 - i);
}

static int cmp_float(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

// Each exponent i of 7 gives 2^i fractions (the midpoints of linspace(0.1, 1, 2^i + 1)) scaled by
// 10^(i - 6), positive and negative: 254 values, then 0 and 1.
void ag_dynamic_map(float code[256]) {
    int k = 0;
    for (int i = 0; i < 7; i++) {
        int items = (1 << i) + 1;
        float scale = (float)pow(10.0, (double)(i - 6));
        for (int j = 0; j + 1 < items; j++) {
            float mean = (linspace_at(j, items) + linspace_at(j + 1, items)) / 2.0f;
            code[k++] = scale * mean;
            code[k++] = -(scale * mean);
        }
    }
    code[k++] = 0.0f;
    code[k++] = 1.0f;
    qsort(code, 256, sizeof *code, cmp_float);
}

ag_nf4_layout ag_nf4_layout_of(uint64_t n) {
    ag_nf4_layout l;
    l.blocks = (n + AG_NF4_BLOCK - 1) / AG_NF4_BLOCK;
    l.blocks2 = (l.blocks + AG_NF4_BLOCK2 - 1) / AG_NF4_BLOCK2;
    l.packed = (n + 1) / 2;
    l.absmax = l.blocks;
    l.absmax2 = 4 * l.blocks2;
    l.offset = 4;
    l.code = 16 * 4;
    l.code2 = 256 * 4;
    l.paper = l.packed + l.absmax + l.absmax2;
    l.total = l.paper + l.offset + l.code + l.code2;
    return l;
}

uint64_t ag_nf4_bytes(uint64_t n) { return ag_nf4_layout_of(n).total; }

// The index of v in a sorted code of n values: the first midpoint >= v (bucketize, right=False).
static int bucket(float v, const float *mid, int nmid) {
    int lo = 0, hi = nmid; // answer in [0, nmid]
    while (lo < hi) {
        int m = (lo + hi) / 2;
        if (mid[m] < v)
            lo = m + 1;
        else
            hi = m;
    }
    return lo;
}

static float clamp1(float v) { return v < -1.0f ? -1.0f : v > 1.0f ? 1.0f : v; }

// Blockwise absmax quantisation of a[n] against a sorted code: q[i] the bucket of a[i] scaled by
// its block's absmax (a full block multiplies by the reciprocal, the last partial one divides,
// as the reference kernel does), absmax[block].
static void blockwise(const float *a, int64_t n, int64_t bs, const float *mid, int nmid, uint8_t *q, bool nibbles,
                      float *absmax) {
    for (int64_t b0 = 0, blk = 0; b0 < n; b0 += bs, blk++) {
        int64_t e = b0 + bs < n ? b0 + bs : n;
        float m = 0.0f;
        for (int64_t i = b0; i < e; i++) m = fmaxf(m, fabsf(a[i]));
        absmax[blk] = m;
        m = fmaxf(m, 1e-38f);
        const bool full = e - b0 == bs;
        const float r = 1.0f / m;
        for (int64_t i = b0; i < e; i++) {
            int c = bucket(clamp1(full ? a[i] * r : a[i] / m), mid, nmid);
            if (!nibbles)
                q[i] = (uint8_t)c;
            else if (i % 2 == 0)
                q[i / 2] = (uint8_t)(c << 4);
            else
                q[i / 2] |= (uint8_t)c;
        }
    }
}

bool ag_nf4_quantize(const float *x, int64_t n, uint8_t *packed, uint8_t *qabsmax, float *absmax2, float *offset) {
    ag_nf4_layout l = ag_nf4_layout_of((uint64_t)n);
    float *absmax = malloc((l.blocks ? l.blocks : 1) * sizeof *absmax);
    if (!absmax) return false;
    float mid4[15], code2[256], mid2[255];
    for (int i = 0; i < 15; i++) mid4[i] = (ag_nf4_code[i] + ag_nf4_code[i + 1]) / 2.0f;
    ag_dynamic_map(code2);
    for (int i = 0; i < 255; i++) mid2[i] = (code2[i] + code2[i + 1]) / 2.0f;
    if (n % 2) packed[n / 2] = 0; // the pad element of an odd count is index 0 in the low nibble
    blockwise(x, n, AG_NF4_BLOCK, mid4, 15, packed, true, absmax);
    if (n % 2) packed[n / 2] |= (uint8_t)bucket(0.0f, mid4, 15);
    double sum = 0.0;
    for (uint64_t b = 0; b < l.blocks; b++) sum += absmax[b];
    *offset = l.blocks ? (float)(sum / (double)l.blocks) : 0.0f;
    for (uint64_t b = 0; b < l.blocks; b++) absmax[b] -= *offset;
    blockwise(absmax, (int64_t)l.blocks, AG_NF4_BLOCK2, mid2, 255, qabsmax, false, absmax2);
    free(absmax);
    return true;
}

void ag_nf4_dequantize(const uint8_t *packed, const uint8_t *qabsmax, const float *absmax2, float offset, int64_t n,
                       float *out) {
    float code2[256];
    ag_dynamic_map(code2);
    for (int64_t b0 = 0, blk = 0; b0 < n; b0 += AG_NF4_BLOCK, blk++) {
        float am = code2[qabsmax[blk]] * absmax2[blk / AG_NF4_BLOCK2] + offset;
        int64_t e = b0 + AG_NF4_BLOCK < n ? b0 + AG_NF4_BLOCK : n;
        for (int64_t i = b0; i < e; i++) {
            int c = i % 2 == 0 ? packed[i / 2] >> 4 : packed[i / 2] & 0xF;
            out[i] = ag_nf4_code[c] * am;
        }
    }
}

ag_nf4_parts ag_nf4_parts_of(void *block, uint64_t n) {
    ag_nf4_layout l = ag_nf4_layout_of(n);
    float *f = block;
    ag_nf4_parts p = {.absmax2 = f, .offset = f + l.blocks2, .code = f + l.blocks2 + 1, .code2 = f + l.blocks2 + 17};
    p.packed = (uint8_t *)(p.code2 + 256);
    p.qabsmax = p.packed + l.packed;
    return p;
}

bool ag_nf4_store(void *block, const float *x, int64_t n) {
    ag_nf4_parts p = ag_nf4_parts_of(block, (uint64_t)n);
    memcpy(p.code, ag_nf4_code, sizeof ag_nf4_code);
    ag_dynamic_map(p.code2);
    if (ag_nf4_quantize(x, n, p.packed, p.qabsmax, p.absmax2, p.offset)) return true;
    memset(block, 0, (size_t)ag_nf4_layout_of((uint64_t)n).total);
    return false;
}

void ag_nf4_range_f32(const void *block, int64_t n, int64_t start, int64_t count, float *out) {
    ag_nf4_parts p = ag_nf4_parts_of((void *)block, (uint64_t)n);
    const float off = *p.offset;
    for (int64_t i = start, e = start + count; i < e;) {
        const int64_t blk = i / AG_NF4_BLOCK, be = (blk + 1) * AG_NF4_BLOCK < e ? (blk + 1) * AG_NF4_BLOCK : e;
        const float am = p.code2[p.qabsmax[blk]] * p.absmax2[blk / AG_NF4_BLOCK2] + off;
        for (; i < be; i++) {
            int c = i % 2 == 0 ? p.packed[i / 2] >> 4 : p.packed[i / 2] & 0xF;
            *out++ = p.code[c] * am;
        }
    }
}
