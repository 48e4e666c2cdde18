// A tensor's values across dtypes: rows read as float32, rows copied or cast, a whole tensor set
// from float32 (rounded or quantised) and read back.
#include <string.h>

#include "ag_kernels.h"

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
    if (t->dtype == AG_Q8) {
        const int8_t *q = (const int8_t *)t->data + r * cols;
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
    case AG_Q8: ag_q8_quantize_weight(src, t->numel / cols, cols, t->data, &t->q_scale); break;
    case AG_Q4: ag_q4_quantize_weight(src, t->numel / cols, cols, t->q_group, t->data); break;
    default: ag_type_traits_of(t->dtype)->from_f32(src, t->data, t->numel);
    }
}

void ag_tensor_to_f32(const ag_tensor *t, float *dst) {
    if (!t->data) return;
    int64_t cols = t->shape[t->ndim - 1];
    for (int64_t r = 0; r < t->numel / cols; r++) ag_tensor_row_f32(t, r, dst + r * cols);
}
