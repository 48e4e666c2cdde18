// A tensor's values across dtypes: rows read as float32, rows copied or cast, a whole tensor set
// from float32 (rounded or quantised) and read back.
#include <math.h>
#include <string.h>

#include "ag_internal.h"
#include "kernels/ag_kernels.h"
#include "kernels/ag_nf4.h"

ag_dtype ag_dtype_of_bits(int bits, bool fp16) {
    switch (bits) {
    case 16: return fp16 ? AG_F16 : AG_BF16;
    case 8: return AG_Q8;
    case 4: return AG_Q4;
    default: return AG_F32;
    }
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

static void q8_rows_row_f32(const void *block, int64_t rows, int64_t cols, int64_t group, int64_t r, float *out) {
    const int8_t *q = (const int8_t *)block + r * cols;
    const uint8_t *sc = (const uint8_t *)block + rows * cols;
    int64_t ng = (cols + group - 1) / group;
    for (int64_t j = 0; j < cols; j++) {
        float amax;
        memcpy(&amax, sc + 4 * (r * ng + j / group), sizeof amax);
        out[j] = (float)q[j] * (amax * (1.0f / 127.0f));
    }
}

void ag_tensor_row_f32(const ag_tensor *t, int64_t r, float *out) {
    int64_t cols = t->shape[t->ndim - 1], rows = t->numel / cols;
    if (t->dtype == AG_NF4) {
        ag_nf4_range_f32(t->data, t->numel, r * cols, cols, out);
    } else if (t->dtype == AG_Q8 && t->q_group > 0) {
        q8_rows_row_f32(t->data, rows, cols, t->q_group, r, out);
    } else if (t->dtype == AG_Q8) {
        int8_t q[cols];
        ag_q8_unpack_row(t->data, rows, cols, r, q);
        for (int64_t j = 0; j < cols; j++) out[j] = (float)q[j] * t->q_scale;
    } else if (t->dtype == AG_Q4) {
        ag_q4_dequantize_rows(t->data, rows, cols, t->q_group, r, r + 1, out);
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

void ag_tensor_from_f32(ag_tensor *t, const float *src) {
    if (!t->data) return;
    int64_t cols = t->shape[t->ndim - 1];
    switch (t->dtype) {
    case AG_Q8:
        if (t->q_group > 0) // LLM.int8's row scales (a QLoRA base)
            q8_rows_quantize(src, t->numel / cols, cols, t->q_group, t->data);
        else
            ag_q8_quantize_weight_packed(src, t->numel / cols, cols, t->data, &t->q_scale);
        break;
    case AG_NF4: ag_nf4_store(t->data, src, t->numel); break;
    case AG_Q4: ag_q4_quantize_weight(src, t->numel / cols, cols, t->q_group, t->data); break;
    default: ag_type_traits_of(t->dtype)->from_f32(src, t->data, t->numel);
    }
}

void ag_tensor_to_f32(const ag_tensor *t, float *dst) {
    if (!t->data) return;
    int64_t cols = t->shape[t->ndim - 1];
    for (int64_t r = 0; r < t->numel / cols; r++) ag_tensor_row_f32(t, r, dst + r * cols);
}
