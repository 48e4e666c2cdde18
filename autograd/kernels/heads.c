// Elements copied or cast, and a [B, T, Hs*D] tensor laid out head by head.
#include <string.h>

#include "ag_kernels.h"

void ag_copy_elems(void *dst, ag_dtype dt, const void *src, ag_dtype st, int64_t D) {
    if (dt == st) {
        memcpy(dst, src, (size_t)D * (size_t)ag_type_traits_of(dt)->bits / 8);
        return;
    }
    float buf[AG_BLK];
    for (int64_t i = 0; i < D; i += AG_BLK) {
        int64_t n = D - i < AG_BLK ? D - i : AG_BLK;
        const float *f = ag_rd((ag_buf){(void *)src, st}, i, n, buf);
        ag_vec_copy(ag_buf_at((ag_buf){dst, dt}, i), ag_buf_f32(f), n);
    }
}

void ag_to_heads(ag_buf dst, ag_buf src, int64_t B, int64_t T, int H, int Hs, int D) {
    int rep = H / Hs;
    for (int64_t b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int64_t t = 0; t < T; t++)
                ag_copy_elems(ag_buf_at(dst, ((b * H + h) * T + t) * D).p, dst.t,
                              ag_buf_at(src, ((b * T + t) * Hs + h / rep) * D).p, src.t, D);
}
