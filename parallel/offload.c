// Offload (ZeRO-Offload, FSDP's CPUOffloadPolicy): the optimizer's side of a shard in host memory,
// the step run there, the updated shard sent back; and stages 1 and 2's all-gather after the step.
#include "zero_internal.h"

#include <string.h>

bool par_offloads(const par_zero *z) { return z->cfg.offload != PAR_OFFLOAD_NONE; }
bool par_params_on_host(const par_zero *z) { return z->cfg.offload == PAR_OFFLOAD_OPTIMIZER_PARAMS; }

// Where the device keeps slot s's part of the weights: the parameter (stages 1, 2) or its shard.
static void *device_part(const par_zero *z, const zslot *s) {
    if (z->st->stage < 3) return s->p->data ? (char *)s->p->data + s->lo * s->gsize : NULL;
    return s->shard.data;
}

// ZeRO: a float32 copy of each shard that trains, in host memory, which the optimizer steps on.
// FSDP: the shards are on the host already and are what it steps on.
int par_offload_setup(par_zero *z, ag_err *err) {
    if (!par_offloads(z) || z->st->unit_gather) return 0;
    for (size_t i = 0; i < z->n; i++) {
        zslot *s = &z->slots[i];
        size_t len = s->hi - s->lo;
        if (!s->trains || !len) continue;
        if (par_alloc(&s->master, len * sizeof(float), MP_OPTIMIZER, s->p, "master", true, err) != 0) return -1;
        const void *from = device_part(z, s);
        if (s->master.data && from) memcpy(s->master.data, from, len * sizeof(float)); // real runs: float32
        s->view.data = s->master.data;
        s->view.bits = 32;
        s->view.dtype = AG_F32;
    }
    return 0;
}

void par_zero_before_step(par_zero *z) {
    if (par_offloads(z)) mp_set_host(true); // CPU Adam: its state and temporaries in host memory
}

// The updated float32 copy back into the weights (through a host buffer of the weights' dtype
// when they are 16-bit and on the device: the conversion's output, pinned for the copy).
static int send_back(par_zero *z, zslot *s, ag_err *err) {
    size_t len = s->hi - s->lo;
    mp_block staging = {0};
    if (s->gsize < sizeof(float) && !par_params_on_host(z) &&
        par_alloc(&staging, len * s->gsize, MP_TEMPORARY, s->p, "staging", true, err) != 0)
        return -1;
    void *to = device_part(z, s);
    if (to && s->master.data) memcpy(to, s->master.data, len * sizeof(float)); // real runs: float32
    mp_free(&staging);
    return 0;
}

int par_zero_after_step(par_zero *z, ag_err *err) {
    mp_set_host(false);
    for (size_t i = 0; par_offloads(z) && i < z->n; i++)
        if (z->slots[i].master.bytes && send_back(z, &z->slots[i], err) != 0) return -1;
    if (z->st->stage != 1 && z->st->stage != 2) return 0;
    for (size_t i = 0; i < z->n; i++) {
        zslot *s = &z->slots[i];
        if (!s->trains) continue;
        if (!par_real(z)) {
            par_count_over(z->comm, PAR_ALL_GATHER, (uint64_t)s->numel * s->gsize, s->grp->size, 0);
            continue;
        }
        for (int q = 0; q < z->N; q++)
            z->counts[q] = par_part_len(s, q) * s->gsize, z->displs[q] = par_part_lo(s, q) * s->gsize;
        if (par_all_gather(z->comm, s->p->data, z->counts, z->displs, err) != 0) return -1;
    }
    return 0;
}
