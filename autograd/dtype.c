// The element types: sizes, names and row conversions in one table.
#include <math.h>
#include <string.h>

#include "ag_internal.h"
#include "ag_nf4.h"

float ag_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// Round to nearest even, as c10::BFloat16; a NaN stays a (quiet) NaN.
uint16_t ag_bf16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float ag_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1f)
        u = sign | 0x7f800000u | (m << 13);
    else if (e)
        u = sign | ((e + 112u) << 23) | (m << 13);
    else if (!m)
        u = sign;
    else { // subnormal: normalise
        int s = 0;
        while (!(m & 0x400u)) m <<= 1, s++;
        u = sign | ((uint32_t)(113 - s) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

// IEEE half, round to nearest even; overflow to inf, NaN kept.
uint16_t ag_f16_from_f32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); // rounds to >= 65520: inf
    if (a < 0x38800000u) {                                   // below the smallest normal half
        if (a < 0x33000000u) return (uint16_t)sign;          // below half the smallest subnormal
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a - 0x38000000u; // rebias 127 -> 15
    r = r + 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

static void f32_to(const void *s, float *d, int64_t n) { memcpy(d, s, (size_t)n * sizeof(float)); }
static void f32_from(const float *s, void *d, int64_t n) { memcpy(d, s, (size_t)n * sizeof(float)); }
static void bf16_to(const void *s, float *d, int64_t n) {
    const uint16_t *h = s;
    for (int64_t i = 0; i < n; i++) d[i] = ag_bf16_to_f32(h[i]);
}
static void bf16_from(const float *s, void *d, int64_t n) {
    uint16_t *h = d;
    for (int64_t i = 0; i < n; i++) h[i] = ag_bf16_from_f32(s[i]);
}
static void f16_to(const void *s, float *d, int64_t n) {
    const uint16_t *h = s;
    for (int64_t i = 0; i < n; i++) d[i] = ag_f16_to_f32(h[i]);
}
static void f16_from(const float *s, void *d, int64_t n) {
    uint16_t *h = d;
    for (int64_t i = 0; i < n; i++) h[i] = ag_f16_from_f32(s[i]);
}

static const ag_type_traits traits[AG_NDTYPES] = {
    [AG_F32] = {"float32", 32, false, f32_to, f32_from},
    [AG_BF16] = {"bfloat16", 16, false, bf16_to, bf16_from},
    [AG_F16] = {"float16", 16, false, f16_to, f16_from},
    [AG_Q8] = {"int8", 8, true, NULL, NULL},
    [AG_Q4] = {"int4", 4, true, NULL, NULL},
    [AG_NF4] = {"nf4", 4, true, NULL, NULL},
};

const ag_type_traits *ag_type_traits_of(ag_dtype t) { return (unsigned)t < AG_NDTYPES ? &traits[t] : NULL; }

ag_dtype ag_dtype_of_bits(int bits, bool fp16) {
    switch (bits) {
    case 16: return fp16 ? AG_F16 : AG_BF16;
    case 8: return AG_Q8;
    case 4: return AG_Q4;
    default: return AG_F32;
    }
}

void ag_tensor_row_f32(const ag_tensor *t, int64_t r, float *out) {
    int64_t cols = t->shape[t->ndim - 1], rows = t->numel / cols;
    if (t->dtype == AG_NF4) {
        ag_nf4_range_f32(t->data, t->numel, r * cols, cols, out);
    } else if (t->dtype == AG_Q8 && t->q_group > 0) {
        ag_q8_rows_row_f32(t->data, rows, cols, t->q_group, r, out);
    } else if (t->dtype == AG_Q8) {
        const int8_t *q = (const int8_t *)t->data + r * cols;
        for (int64_t j = 0; j < cols; j++) out[j] = (float)q[j] * t->q_scale;
    } else if (t->dtype == AG_Q4) {
        ag_q4_row_f32(t->data, rows, cols, t->q_group, r, out);
    } else {
        ag_type_traits_of(t->dtype)->to_f32((const char *)t->data + r * cols * t->bits / 8, out, cols);
    }
}

void ag_tensor_rows(ag_tensor *dst, int64_t dr, const ag_tensor *src, int64_t sr, int64_t n) {
    int64_t cols = dst->shape[dst->ndim - 1];
    if (dst->dtype == src->dtype && !ag_type_traits_of(src->dtype)->quantised) {
        size_t row = (size_t)cols * (size_t)src->bits / 8;
        memcpy((char *)dst->data + (size_t)dr * row, (const char *)src->data + (size_t)sr * row, (size_t)n * row);
        return;
    }
    float buf[cols];
    for (int64_t i = 0; i < n; i++) {
        ag_tensor_row_f32(src, sr + i, buf);
        ag_type_traits_of(dst->dtype)->from_f32(buf, (char *)dst->data + (dr + i) * cols * dst->bits / 8, cols);
    }
}

void ag_q4_row_f32(const void *block, int64_t rows, int64_t cols, int64_t group, int64_t r, float *out) {
    const uint8_t *q = block;
    int64_t ng = (cols + group - 1) / group;
    const uint8_t *sc = q + (rows * cols + 1) / 2;
    for (int64_t j = 0; j < cols; j++) {
        int64_t e = r * cols + j;
        int v = (q[e >> 1] >> ((e & 1) * 4)) & 0xf;
        uint16_t h;
        memcpy(&h, sc + 2 * (r * ng + j / group), sizeof h);
        out[j] = (float)(v >= 8 ? v - 16 : v) * ag_f16_to_f32(h);
    }
}

// PyTorch's MinMaxObserver(qint8, per_tensor_symmetric): scale = max|w| / 127.5, at least
// float32's epsilon; q = round-half-even(w / scale) within [-128, 127].
static void q8_quantize(const float *w, int64_t n, int8_t *q, float *scale) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) amax = fabsf(w[i]) > amax ? fabsf(w[i]) : amax;
    float s = amax / 127.5f;
    if (s < 1.1920929e-07f) s = 1.1920929e-07f;
    float inv = 1.0f / s;
    for (int64_t i = 0; i < n; i++) {
        float v = nearbyintf(w[i] * inv);
        q[i] = (int8_t)(v < -128.0f ? -128 : v > 127.0f ? 127 : v);
    }
    *scale = s;
}

// LLM.int8's vector-wise layout (bitsandbytes' int8_vectorwise_quant): per group of a row, its
// absmax (SCB, float32, after the int8 values) and q = round-half-even(w x 127 / absmax).
static void q8_rows_quantize(const float *w, int64_t rows, int64_t cols, int64_t group, int8_t *q) {
    int64_t ng = (cols + group - 1) / group;
    uint8_t *sc = (uint8_t *)q + rows * cols;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < ng; g++) {
            int64_t j0 = g * group, j1 = j0 + group < cols ? j0 + group : cols;
            float amax = 0.0f;
            for (int64_t j = j0; j < j1; j++) amax = fabsf(w[r * cols + j]) > amax ? fabsf(w[r * cols + j]) : amax;
            memcpy(sc + 4 * (r * ng + g), &amax, sizeof amax);
            float k = amax > 0.0f ? 127.0f / amax : 0.0f;
            for (int64_t j = j0; j < j1; j++) {
                float v = nearbyintf(w[r * cols + j] * k);
                q[r * cols + j] = (int8_t)(v < -127.0f ? -127 : v > 127.0f ? 127 : v);
            }
        }
}

void ag_q8_rows_row_f32(const void *block, int64_t rows, int64_t cols, int64_t group, int64_t r, float *out) {
    const int8_t *q = (const int8_t *)block + r * cols;
    const uint8_t *sc = (const uint8_t *)block + rows * cols;
    int64_t ng = (cols + group - 1) / group;
    for (int64_t j = 0; j < cols; j++) {
        float amax;
        memcpy(&amax, sc + 4 * (r * ng + j / group), sizeof amax);
        out[j] = (float)q[j] * (amax * (1.0f / 127.0f));
    }
}

// Symmetric per group of a row: s = amax / 7 as float16 (1 for an all-zero group),
// q = round-half-even(w / s) within [-8, 7].
static void q4_quantize(const float *w, int64_t rows, int64_t cols, int64_t group, uint8_t *block) {
    int64_t ng = (cols + group - 1) / group;
    uint8_t *sc = block + (rows * cols + 1) / 2;
    memset(block, 0, (size_t)(rows * cols + 1) / 2);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t g = 0; g < ng; g++) {
            int64_t j0 = g * group, j1 = j0 + group < cols ? j0 + group : cols;
            float amax = 0.0f;
            for (int64_t j = j0; j < j1; j++) amax = fabsf(w[r * cols + j]) > amax ? fabsf(w[r * cols + j]) : amax;
            uint16_t h = ag_f16_from_f32(amax > 0.0f ? amax / 7.0f : 1.0f);
            memcpy(sc + 2 * (r * ng + g), &h, sizeof h);
            float s = ag_f16_to_f32(h);
            for (int64_t j = j0; j < j1; j++) {
                float v = nearbyintf(w[r * cols + j] / s);
                int q = (int)(v < -8.0f ? -8 : v > 7.0f ? 7 : v);
                int64_t e = r * cols + j;
                block[e >> 1] |= (uint8_t)((q & 0xf) << ((e & 1) * 4));
            }
        }
}

void ag_tensor_from_f32(ag_tensor *t, const float *src) {
    if (!t->data) return;
    int64_t cols = t->shape[t->ndim - 1];
    switch (t->dtype) {
    case AG_Q8:
        if (t->q_group > 0)
            q8_rows_quantize(src, t->numel / cols, cols, t->q_group, t->data);
        else
            q8_quantize(src, t->numel, t->data, &t->q_scale);
        break;
    case AG_NF4: ag_nf4_store(t->data, src, t->numel); break;
    case AG_Q4: q4_quantize(src, t->numel / cols, cols, t->q_group, t->data); break;
    default: ag_type_traits_of(t->dtype)->from_f32(src, t->data, t->numel);
    }
}

void ag_tensor_to_f32(const ag_tensor *t, float *dst) {
    if (!t->data) return;
    int64_t cols = t->shape[t->ndim - 1];
    for (int64_t r = 0; r < t->numel / cols; r++) ag_tensor_row_f32(t, r, dst + r * cols);
}
