// The products of a causal attention head that skip what the mask hides. Query row i sees keys
// below ag_keys_seen(a, i); a float32 product runs over blocks of AG_CAUSAL_BLOCK query rows,
// each as far as the keys its last row sees, or over blocks of keys, each from the first query
// that sees it. A 16-bit or mixed product stays whole: its workspace (the operands it widens or
// packs) follows its size, and so would its bill.
#include "ag_kernels.h"

static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

static int64_t block(int64_t whole, ag_buf x, ag_buf y, ag_buf z) {
    return x.t == AG_F32 && y.t == AG_F32 && z.t == AG_F32 ? AG_CAUSAL_BLOCK : whole;
}

// The first query row that sees key j.
static int64_t first_query(const ag_att_dims *a, int64_t j) { return j > a->Tk - a->Tq ? j - (a->Tk - a->Tq) : 0; }

bool ag_causal_scores(const ag_att_dims *a, float alpha, ag_buf q, int64_t ldq, ag_buf k, int64_t ldk, ag_buf s) {
    bool ok = true;
    for (int64_t r0 = 0, step = block(a->Tq, q, k, s); r0 < a->Tq && ok; r0 += step) {
        int64_t r1 = min64(r0 + step, a->Tq);
        ok = ag_gemm_buf(CblasNoTrans, CblasTrans, r1 - r0, ag_keys_seen(a, r1 - 1), a->D, alpha,
                         ag_buf_at(q, r0 * ldq), ldq, k, ldk, 0.0f, ag_buf_at(s, r0 * a->Tk), a->Tk);
    }
    return ok;
}

bool ag_causal_rows(const ag_att_dims *a, float alpha, ag_buf p, ag_buf v, int64_t ldv, float beta, ag_buf c,
                    int64_t ldc) {
    bool ok = true;
    for (int64_t r0 = 0, step = block(a->Tq, p, v, c); r0 < a->Tq && ok; r0 += step) {
        int64_t r1 = min64(r0 + step, a->Tq);
        ok = ag_gemm_buf(CblasNoTrans, CblasNoTrans, r1 - r0, a->D, ag_keys_seen(a, r1 - 1), alpha,
                         ag_buf_at(p, r0 * a->Tk), a->Tk, v, ldv, beta, ag_buf_at(c, r0 * ldc), ldc);
    }
    return ok;
}

bool ag_causal_keys(const ag_att_dims *a, float alpha, ag_buf p, ag_buf y, int64_t ldy, float beta, ag_buf c,
                    int64_t ldc) {
    bool ok = true;
    for (int64_t j0 = 0, step = block(a->Tk, p, y, c); j0 < a->Tk && ok; j0 += step) {
        int64_t j1 = min64(j0 + step, a->Tk), r = first_query(a, j0);
        ok = ag_gemm_buf(CblasTrans, CblasNoTrans, j1 - j0, a->D, a->Tq - r, alpha, ag_buf_at(p, r * a->Tk + j0), a->Tk,
                         ag_buf_at(y, r * ldy), ldy, beta, ag_buf_at(c, j0 * ldc), ldc);
    }
    return ok;
}
