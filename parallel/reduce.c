// Gradients: buckets (DDP's, by size in reverse order; FSDP's, one per unit), reduced once
// every gradient of a bucket is final, this rank's part kept (stages 1 to 3), accumulated over
// the micro-batches of a step.
#include "zero_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int new_bucket(par_zero *z, const size_t *order, size_t n, ag_err *err) {
    zbucket *b = &z->buckets[z->nbuckets];
    if (!(b->slots = malloc(n * sizeof *b->slots))) {
        ag_err_set(err, "out of memory");
        return -1;
    }
    memcpy(b->slots, order, n * sizeof *b->slots);
    b->n = b->pending = n;
    for (size_t j = 0; j < n; j++) {
        const zslot *s = &z->slots[order[j]];
        z->slots[order[j]].bucket = (int)z->nbuckets;
        if (z->st->stage == 0) b->elems += s->numel;
        for (int q = 0; z->st->stage > 0 && q < z->N; q++) b->elems += par_part_cap(z, s, q);
    }
    z->nbuckets++;
    return 0;
}

// DDP's assignment: what trains in reverse parameter order, a bucket closed once it reaches the cap
// (or, group_buckets, before a parameter of another group).
static int by_size(par_zero *z, size_t *order, ag_err *err) {
    size_t bytes = 0, k = 0;
    for (size_t i = z->n; i-- > 0;) {
        const zslot *s = &z->slots[i];
        if (!s->trains) continue;
        if (k && z->st->group_buckets && s->grp != z->slots[order[k - 1]].grp) {
            if (new_bucket(z, order, k, err) != 0) return -1;
            k = bytes = 0;
        }
        order[k++] = i;
        bytes += s->numel * z->reduce_bytes;
        if (bytes >= z->cfg.bucket_bytes) {
            if (new_bucket(z, order, k, err) != 0) return -1;
            k = bytes = 0;
        }
    }
    return k ? new_bucket(z, order, k, err) : 0;
}

// FSDP: each unit's parameters that train, the last unit first (a parameter of two units in the first).
static int by_unit(par_zero *z, size_t *order, ag_err *err) {
    for (size_t u = z->nunits; u-- > 0;) {
        size_t k = 0;
        for (size_t j = 0; j < z->units[u].n; j++) {
            size_t i = z->units[u].slots[j];
            if (z->slots[i].trains && z->slots[i].bucket < 0 && z->slots[i].units[0] == (int)u) order[k++] = i;
        }
        if (k && new_bucket(z, order, k, err) != 0) return -1;
    }
    return 0;
}

int par_make_buckets(par_zero *z, ag_err *err) {
    z->buckets = calloc(z->n ? z->n : 1, sizeof *z->buckets);
    size_t *order = calloc(z->n ? z->n : 1, sizeof *order);
    int rc = z->buckets && order ? 0 : -1;
    if (rc) ag_err_set(err, "out of memory");
    if (rc == 0) rc = z->st->unit_reduce ? by_unit(z, order, err) : by_size(z, order, err);
    free(order);
    return rc;
}

// Where slot j's part of rank q sits in a bucket laid out rank by rank (stages 1 to 3), or the
// slot's offset in a flat one (stage 0).
static size_t bucket_offset(const par_zero *z, const zbucket *b, size_t j, int q) {
    size_t at = 0;
    if (z->st->stage == 0) {
        for (size_t k = 0; k < j; k++) at += z->slots[b->slots[k]].numel;
        return at;
    }
    for (int r = 0; r < q; r++)
        for (size_t k = 0; k < b->n; k++) at += par_part_cap(z, &z->slots[b->slots[k]], r);
    for (size_t k = 0; k < j; k++) at += par_part_cap(z, &z->slots[b->slots[k]], q);
    return at;
}

static void copy_in(const par_zero *z, const zbucket *b, size_t j, const zslot *s) {
    float *dst = b->buf.data;
    const float *g = s->p->grad ? s->p->grad->data : NULL;
    if (!dst) return;
    if (z->st->stage == 0) {
        if (g)
            memcpy(dst + bucket_offset(z, b, j, 0), g + 0, s->numel * sizeof(float));
        else // unused in this backward (find_unused): zeros
            memset(dst + bucket_offset(z, b, j, 0), 0, s->numel * sizeof(float));
        return;
    }
    for (int q = 0; q < z->N; q++) {
        size_t at = bucket_offset(z, b, j, q), len = par_part_len(s, q);
        if (g)
            memcpy(dst + at, g + par_part_lo(s, q), len * sizeof(float));
        else
            memset(dst + at, 0, len * sizeof(float));
        memset(dst + at + len, 0, (par_part_cap(z, s, q) - len) * sizeof(float)); // FSDP's padding
    }
}

// dst = (accumulate ? dst : 0) + src x f.
static void scale_into(float *dst, const float *src, size_t n, float f, bool accumulate) {
    if (!dst || !src) return;
    for (size_t i = 0; i < n; i++) dst[i] = (accumulate ? dst[i] : 0.0f) + src[i] * f;
}

// This rank's gradient shard of slot s from the reduced bucket: made (in host memory when the
// optimizer is offloaded, in float32 there), or accumulated into over the micro-batches.
static int to_grad_shard(par_zero *z, zslot *s, const float *src, float inv, ag_err *err) {
    size_t len = s->hi - s->lo;
    bool acc = s->grad_shard != NULL;
    if (!acc) {
        char label[256];
        snprintf(label, sizeof label, "%s:grad_shard", ag_tensor_name(s->p));
        bool was = mp_set_host(par_offloads(z));
        int bits = par_offloads(z) ? 32 : (int)z->reduce_bytes * 8;
        s->grad_shard = ag_tensor_new_bits(z->ctx, 1, (int64_t[]){(int64_t)len}, MP_GRADIENT, label, bits);
        mp_set_host(was);
        if (!s->grad_shard) {
            ag_err_set(err, "%s", ag_ctx_error(z->ctx));
            return -1;
        }
    }
    scale_into(s->grad_shard->data, src, len, inv, acc);
    return 0;
}

// A parameter this rank's backward did not reach (find_unused) gets its .grad from the reduction,
// as DDP's reducer defines it from the bucket for a parameter another rank used.
static int give_grad(par_zero *z, zslot *s, ag_err *err) {
    if (s->p->grad || !z->cfg.find_unused) return 0;
    char label[256];
    snprintf(label, sizeof label, "%s:grad", ag_tensor_name(s->p));
    s->p->grad = ag_tensor_new(z->ctx, s->p->ndim, s->p->shape, MP_GRADIENT, label);
    if (s->p->grad) return 0;
    ag_err_set(err, "%s", ag_ctx_error(z->ctx));
    return -1;
}

// A simulated rank counts what a real bucket's reduction moves: each group's part of the bucket
// reduced over its own ranks (a bucket of dense parameters alone: one call over every rank).
static void count_reduction(par_zero *z, const zbucket *b, par_collective k) {
    for (int g = 0; g < PAR_NGROUPS; g++) {
        uint64_t elems = 0;
        for (size_t j = 0; j < b->n; j++) {
            const zslot *s = &z->slots[b->slots[j]];
            if (s->grp != &z->groups[g]) continue;
            if (z->st->stage == 0) elems += s->numel;
            for (int q = 0; z->st->stage > 0 && q < s->grp->size; q++) elems += par_part_cap(z, s, q);
        }
        if (elems) par_count_over(z->comm, k, elems * z->reduce_bytes, z->groups[g].size, 0);
    }
}

// Every gradient of the bucket final: the reduction, this rank's results into place, the bucket freed.
static int reduce_bucket(par_zero *z, zbucket *b, ag_err *err) {
    const float inv = 1.0f / (float)z->N;
    float *buf = b->buf.data;
    int rc = 0;
    if (z->st->stage == 0) {
        if (par_real(z))
            rc = par_all_reduce_sum(z->comm, buf, b->elems, z->reduce_bytes, err);
        else
            count_reduction(z, b, PAR_ALL_REDUCE);
        for (size_t j = 0, at = 0; rc == 0 && j < b->n; at += z->slots[b->slots[j]].numel, j++) {
            zslot *s = &z->slots[b->slots[j]];
            if ((rc = give_grad(z, s, err)) == 0)
                scale_into(s->p->grad ? s->p->grad->data : NULL, buf ? buf + at : NULL, s->numel, inv, false);
        }
    } else {
        if (par_real(z)) {
            for (int q = 0; q < z->N; q++) {
                z->counts[q] = 0;
                for (size_t j = 0; j < b->n; j++) z->counts[q] += par_part_cap(z, &z->slots[b->slots[j]], q);
            }
            rc = par_reduce_scatter_sum(z->comm, buf, z->counts, z->reduce_bytes, err);
        } else { // counted whole, as a real bucket's reduce-scatter moves it
            count_reduction(z, b, PAR_REDUCE_SCATTER);
        }
        for (size_t j = 0, at = 0; rc == 0 && j < b->n; j++) {
            zslot *s = &z->slots[b->slots[j]];
            const float *src = buf ? buf + at : NULL;
            if (z->st->stage == 1 && (rc = give_grad(z, s, err)) == 0)
                scale_into(s->p->grad ? (float *)s->p->grad->data + s->lo : NULL, src, s->hi - s->lo, inv, false);
            else if (s->hi > s->lo)
                rc = to_grad_shard(z, s, src, inv, err);
            at += s->held;
        }
    }
    mp_free(&b->buf);
    b->pending = b->n;
    return rc;
}

static int open_bucket(par_zero *z, zbucket *b, ag_err *err) {
    char label[64];
    snprintf(label, sizeof label, "zero.bucket.%d", (int)(b - z->buckets));
    mp_status st = mp_alloc(&b->buf, b->elems * z->reduce_bytes, MP_TEMPORARY, label);
    if (st == MP_OK) return 0;
    ag_err_set(err, "cannot allocate %s (%zu bytes, temporary): %s", label, b->elems * z->reduce_bytes,
               st == MP_ERR_BUDGET ? "over the memory budget" : "out of memory");
    return -1;
}

// FSDP's post-backward of a unit: its gradients into one buffer, freed, reduce-scattered.
static int reduce_unit(par_zero *z, zbucket *b, ag_err *err) {
    if (open_bucket(z, b, err) != 0) return -1;
    for (size_t j = 0; j < b->n; j++) {
        copy_in(z, b, j, &z->slots[b->slots[j]]);
        ag_zero_grad(z->slots[b->slots[j]].p);
    }
    return reduce_bucket(z, b, err);
}

bool par_grad_ready(void *user, ag_tensor *leaf, ag_err *err) {
    par_zero *z = user;
    if (!leaf->requires_grad || (!z->sync && !z->st->reduce_every_backward)) return true; // no_sync: .grad accumulates
    long i = par_find_slot(z, leaf);
    if (i < 0 || z->slots[i].ready || z->slots[i].bucket < 0) return true;
    zslot *s = &z->slots[i];
    zbucket *b = &z->buckets[s->bucket];
    s->ready = true;
    if (z->st->unit_reduce) return --b->pending > 0 || reduce_unit(z, b, err) == 0;
    if (!b->buf.bytes && open_bucket(z, b, err) != 0) return false;
    size_t j = 0;
    while (b->slots[j] != (size_t)i) j++;
    copy_in(z, b, j, s);
    if (z->st->stage >= 2) ag_zero_grad(s->p); // the bucket holds it now
    return --b->pending > 0 || reduce_bucket(z, b, err) == 0;
}

int par_zero_after_backward(par_zero *z, ag_err *err) {
    bool reduced = z->sync || z->st->reduce_every_backward;
    for (size_t i = 0; reduced && i < z->n; i++)
        if (z->slots[i].trains && !z->slots[i].ready && z->cfg.find_unused) {
            if (!par_grad_ready(z, z->slots[i].p, err)) return -1;
        } else if (z->slots[i].trains && !z->slots[i].ready) {
            ag_err_set(err,
                       "zero: %s got no gradient in backward (every parameter that trains must take part, as DDP "
                       "without find_unused_parameters)",
                       ag_tensor_name(z->slots[i].p));
            return -1;
        }
    for (long u = (long)z->nunits - 1; u >= 0; u--) par_let_go(z, u);
    z->bw_unit = -1;
    z->in_backward = false;
    for (size_t i = 0; i < z->n; i++) {
        zslot *s = &z->slots[i];
        s->ready = false;
        if (!z->sync || !s->trains) continue;
        if (z->st->stage == 1 && s->hi > s->lo && s->p->grad) {
            const ag_tensor *g = s->p->grad;
            ag_tensor *v = &s->view_grad;
            memset(v, 0, sizeof *v);
            v->ndim = 1;
            v->shape[0] = v->numel = (int64_t)(s->hi - s->lo);
            v->data = g->data ? (char *)g->data + s->lo * (size_t)g->bits / 8 : NULL;
            v->refcount = 1;
            v->bits = g->bits;
            v->dtype = g->dtype;
            v->site = g->site;
            s->view.grad = v;
        } else if (z->st->stage >= 2) {
            s->view.grad = s->grad_shard;
        }
    }
    return 0;
}

void par_zero_zero_grad(par_zero *z) {
    for (size_t i = 0; i < z->n; i++) {
        zslot *s = &z->slots[i];
        ag_zero_grad(s->p);
        s->view.grad = NULL;
        ag_release(s->grad_shard);
        s->grad_shard = NULL;
    }
}
