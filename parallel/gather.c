// Stage 3's units: gathered before a part of the forward and again for its backward, freed after
// each (FSDP shard-grad-op: after its backward alone), parameter by parameter (ZeRO) or in one
// all-gather per unit (FSDP).
#include "zero_internal.h"

#include <stdio.h>
#include <string.h>

static void set_parts(par_zero *z, const zslot *s) {
    for (int q = 0; q < z->N; q++)
        z->counts[q] = par_part_len(s, q) * s->gsize, z->displs[q] = par_part_lo(s, q) * s->gsize;
}

static int storage(par_zero *z, zslot *s, ag_err *err) {
    if (ag_param_alloc_storage(z->ctx, s->p)) return 0;
    ag_err_set(err, "%s", ag_ctx_error(z->ctx));
    return -1;
}

// ZeRO: one parameter's storage, this rank's shard copied in, the rest all-gathered.
static int gather_slot(par_zero *z, zslot *s, ag_err *err) {
    if (s->gathered++) return 0;
    if (storage(z, s, err) != 0) {
        s->gathered--;
        return -1;
    }
    if (s->p->data && s->shard.data)
        memcpy((char *)s->p->data + s->lo * s->gsize, s->shard.data, (s->hi - s->lo) * s->gsize);
    if (!par_real(z)) { // a simulated rank counts what a real one would move
        par_count_over(z->comm, PAR_ALL_GATHER, (uint64_t)s->numel * s->gsize, s->grp->size, 0);
        return 0;
    }
    set_parts(z, s);
    return par_all_gather(z->comm, s->p->data, z->counts, z->displs, err);
}

static void release_slot(zslot *s) {
    if (s->gathered > 0 && --s->gathered == 0) ag_param_free_storage(s->p);
}

// FSDP: every rank's padded shards of the unit back to back (rank q's at q x U), this rank's
// copied in (through an input made on the device when the shards are cast or on the host).
static int unit_copy_in(par_zero *z, const zunit *U, char *out, size_t total, bool through, ag_err *err, long u) {
    mp_block in = {0};
    char label[64];
    snprintf(label, sizeof label, "fsdp.unit.%ld:all_gather_input", u);
    if (through && mp_alloc(&in, total, MP_TEMPORARY, label) != MP_OK) {
        ag_err_set(err, "cannot allocate %s (%zu bytes, temporary): over the memory budget or out of memory", label,
                   total);
        return -1;
    }
    char *dst = in.data ? in.data : (out ? out + (size_t)z->rank * total : NULL);
    for (size_t j = 0, at = 0; dst && j < U->n; j++) {
        const zslot *s = &z->slots[U->slots[j]];
        if (s->gathered) continue;
        if (s->shard.data) memcpy(dst + at, s->shard.data, s->held * s->gsize);
        at += s->stride * s->gsize;
    }
    if (in.data && out) memcpy(out + (size_t)z->rank * total, in.data, total);
    mp_free(&in);
    return 0;
}

// FSDP: one all-gather of the unit into a flat buffer, copied out into each parameter's storage.
static int gather_unit(par_zero *z, const zunit *U, long u, ag_err *err) {
    size_t total = 0;
    bool through = par_params_on_host(z);
    for (size_t j = 0; j < U->n; j++) {
        const zslot *s = &z->slots[U->slots[j]];
        if (!s->gathered) total += s->stride * s->gsize, through = through || s->ssize != s->gsize;
    }
    mp_block out = {0};
    char label[64];
    snprintf(label, sizeof label, "fsdp.unit.%ld:all_gather_output", u);
    size_t N = (size_t)z->N;
    if (total && mp_alloc(&out, N * total, MP_TEMPORARY, label) != MP_OK) {
        ag_err_set(err, "cannot allocate %s (%zu bytes, temporary): over the memory budget or out of memory", label,
                   N * total);
        return -1;
    }
    int rc = total ? unit_copy_in(z, U, out.data, total, through, err, u) : 0;
    if (rc == 0 && total && par_real(z)) {
        for (int q = 0; q < z->N; q++) z->counts[q] = total, z->displs[q] = (size_t)q * total;
        rc = par_all_gather(z->comm, out.data, z->counts, z->displs, err);
    } else if (rc == 0 && total) {
        par_count(z->comm, PAR_ALL_GATHER, (uint64_t)(N * total), 0);
    }
    for (size_t j = 0, at = 0; rc == 0 && j < U->n; j++) {
        zslot *s = &z->slots[U->slots[j]];
        if (s->gathered++) continue;
        if ((rc = storage(z, s, err)) != 0) {
            s->gathered--;
            while (j-- > 0) release_slot(&z->slots[U->slots[j]]); // what this gather held goes back
            break;
        }
        for (int q = 0; s->p->data && out.data && q < z->N; q++)
            memcpy((char *)s->p->data + par_part_lo(s, q) * s->gsize, (char *)out.data + (size_t)q * total + at,
                   par_part_len(s, q) * s->gsize);
        at += s->stride * s->gsize;
    }
    mp_free(&out);
    return rc;
}

static bool is_root(const par_zero *z, long u) { return z->st->root_stays && u == 0; }

int par_hold(par_zero *z, long u, ag_err *err) {
    if (u < 0 || (size_t)u >= z->nunits || z->units[u].held) return 0;
    zunit *U = &z->units[u];
    if (z->st->unit_gather) {
        if (gather_unit(z, U, u, err) != 0) return -1;
    } else {
        for (size_t j = 0; j < U->n; j++)
            if (gather_slot(z, &z->slots[U->slots[j]], err) != 0) {
                while (j-- > 0) release_slot(&z->slots[U->slots[j]]);
                return -1;
            }
    }
    U->held = true;
    return 0;
}

void par_let_go(par_zero *z, long u) {
    if (u < 0 || (size_t)u >= z->nunits || !z->units[u].held) return;
    zunit *U = &z->units[u];
    for (size_t j = 0; j < U->n; j++) release_slot(&z->slots[U->slots[j]]);
    U->held = false;
}

// The backward has moved into unit u: every unit above it is done (the root stays).
static int move_into(par_zero *z, long u, ag_err *err) {
    for (long w = (long)z->nunits - 1; w > u; w--)
        if (!is_root(z, w)) par_let_go(z, w);
    z->bw_unit = u;
    for (long k = 0; k <= z->cfg.prefetch; k++)
        if (par_hold(z, u - k, err) != 0) return -1;
    return 0;
}

bool par_zero_on_part(void *user, int64_t part, bool before, ag_err *err) {
    par_zero *z = user;
    if (z->st->stage != 3) return true;
    if (part < 0 || (size_t)part >= z->nunits) {
        ag_err_set(err, "zero: the forward ran part %lld, past the %zu units", (long long)part, z->nunits);
        return false;
    }
    long u = (long)part;
    if (z->in_backward) // a checkpointed block recomputed: gathered again until its backward is done
        return !before || move_into(z, u, err) == 0;
    if (!before) {
        if (z->st->reshard_after_forward && !is_root(z, u)) par_let_go(z, u);
        return true;
    }
    for (long k = 0; k <= z->cfg.prefetch; k++)
        if (par_hold(z, u + k, err) != 0) return false;
    return true;
}

static bool in_unit(const zslot *s, long u) {
    for (int k = 0; k < s->nunits; k++)
        if (s->units[k] == u) return true;
    return false;
}

// Before a node's backward reaches a parameter (or keeps a frozen one): the unit the backward
// has moved into (the last one in forward order below the current that holds it), gathered with
// the next ones it will reach; every unit above it freed.
bool par_before_backward(void *user, ag_tensor *leaf, ag_err *err) {
    par_zero *z = user;
    if (z->st->stage != 3) return true;
    z->in_backward = true;
    long i = par_find_slot(z, leaf);
    if (i < 0) return true; // not one of ours
    zslot *s = &z->slots[i];
    if ((z->bw_unit >= 0 && in_unit(s, z->bw_unit)) || (s->nunits == 1 && is_root(z, s->units[0]))) return true;
    long u = -1;
    for (int k = 0; k < s->nunits; k++)
        if ((z->bw_unit < 0 || s->units[k] < z->bw_unit) && s->units[k] > u) u = s->units[k];
    if (u < 0) u = s->units[0];
    return move_into(z, u, err) == 0;
}
