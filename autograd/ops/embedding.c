// embedding: y[B, T, H] = table[ids[b*T + t], :].
#include <stdlib.h>
#include <string.h>

#include "ag_ops.h"

// Backward needs only the ids (copied into the node, not a tensor): the table gradient is
// dy scattered back onto the rows they picked. Rows picked twice, and a table also used as
// the output head (tied), accumulate.
static void embedding_backward(ag_ctx *ctx, ag_node *n, const void *dy) {
    const ag_embedding_state *st = &n->state.embedding;
    int64_t rows = st->rows, H = st->hidden, V = st->vocab;
    ag_grad_dst d;
    if (!ag_grad_get(ctx, n, 0, &d) || mp_is_meta()) return;
    if (d.fresh) // a scatter-add: rows no id picked must read zero
        memset(d.data, 0, (size_t)(V * H) * (size_t)ag_type_traits_of(d.dtype)->bits / 8);
    // Serial over rows: two rows may hit the same id, and the order keeps the sum deterministic.
    ag_buf g = ag_dst_buf(&d), src = {(void *)dy, n->grad_dtype};
    float gb[AG_BLK], sb[AG_BLK];
    for (int64_t r = 0; r < rows; r++) {
        if (st->ids[r] == st->padding_idx) continue; // nn.Embedding(padding_idx): that row stays
        for (int64_t j = 0; j < H; j += AG_BLK) {
            int64_t m = H - j < AG_BLK ? H - j : AG_BLK, at = (int64_t)st->ids[r] * H + j;
            float *o = ag_rw(g, at, m, gb);
            const float *x = ag_rd(src, r * H + j, m, sb);
            for (int64_t k = 0; k < m; k++) o[k] += x[k];
            ag_wr_end(g, at, m, o);
        }
    }
}

static void embedding_release(ag_op_state *st) { free(st->embedding.ids); }

static const ag_op embedding_op = {.name = "embedding", .backward = embedding_backward, .release = embedding_release};

ag_tensor *ag_embedding(ag_ctx *ctx, const char *site, const int32_t *ids, int64_t B, int64_t T, ag_tensor *table) {
    return ag_embedding_padded(ctx, site, ids, B, T, table, -1);
}

ag_tensor *ag_embedding_padded(ag_ctx *ctx, const char *site, const int32_t *ids, int64_t B, int64_t T,
                               ag_tensor *table, int64_t padding_idx) {
    ag_tensor *ins[] = {table};
    if (!ag_check_inputs(ctx, "embedding", site, 1, ins, (const char *[]){"table"})) return NULL;
    ag_site s;
    ag_site_parse(&s, site);
    char st[64];
    // Meta mode reads no ids: a bill of shapes takes no host memory per token.
    bool meta = mp_is_meta();
    if (table->ndim != 2 || (!ids && !meta) || B < 1 || T < 1) {
        ag_fail(ctx, AG_ERR_ARG,
                "embedding %s: expected ids[B*T] with B, T >= 1 and a table "
                "[V, H], got B=%lld T=%lld, %s %s",
                s.base, (long long)B, (long long)T, ag_tensor_name(table), ag_shape_str(table, st));
        return NULL;
    }
    int64_t V = table->shape[0], H = table->shape[1];
    for (int64_t r = 0; !meta && r < B * T; r++)
        if (ids[r] < 0 || ids[r] >= V) {
            ag_fail(ctx, AG_ERR_ARG, "embedding %s: id %d at position %lld is outside [0, %lld)", s.base, ids[r],
                    (long long)r, (long long)V);
            return NULL;
        }
    ag_tensor *y = ag_tensor_new(ctx, 3, (int64_t[]){B, T, H}, MP_ACTIVATION, s.out);
    if (!y) return NULL;
    if (!meta)
        for (int64_t r = 0; r < B * T; r++) ag_tensor_rows(y, r, table, ids[r], 1);
    if (!ag_any_needs_grad(ctx, 1, ins)) return y;
    ag_node *n = ag_record(ctx, &embedding_op, s.base, y, 1, ins);
    ag_embedding_state *sn = n ? &n->state.embedding : NULL;
    if (sn && !meta) sn->ids = malloc((size_t)(B * T) * sizeof(int32_t));
    if (!n || (!meta && !sn->ids)) {
        if (n) ag_fail(ctx, AG_ERR_NOMEM, "embedding %s: out of memory for the ids", s.base);
        ag_release(y); // its node stays on the tape, empty, until backward or clear
        return NULL;
    }
    if (!meta) memcpy(sn->ids, ids, (size_t)(B * T) * sizeof(int32_t));
    sn->rows = B * T, sn->hidden = H, sn->vocab = V, sn->padding_idx = padding_idx;
    return y;
}
