// Private to parallel/: the state of a sharded run (zero.c builds it, gather.c gathers stage 3's
// units, reduce.c reduces the gradients, offload.c keeps the host copies).
#pragma once

#include "parallel_internal.h"

// One parameter. Its elements are what is sharded: a quantised frozen weight's storage is
// handled as bytes (one element a byte).
typedef struct {
    ag_tensor *p;
    bool trains;           // requires_grad: reduced and stepped
    size_t numel;          // elements (bytes of the storage for a quantised weight)
    const par_group *grp;  // the ranks it is partitioned over (every rank, or its experts' data group)
    size_t gsize;          // bytes of one element gathered (the parameter's storage)
    size_t ssize;          // bytes of one element of this rank's shard
    size_t stride;         // a rank's part: ceil(numel / its group's size) elements (FSDP: whole rows)
    size_t lo, hi;         // this rank's part [lo, hi), clipped to the parameter
    size_t held;           // elements this rank's shard holds: hi - lo (FSDP: stride, padded)
    int bucket;            // -1: none (frozen)
    bool ready;            // its gradient is final in this backward
    ag_tensor view;        // stages 1 to 3: what the optimizer steps on
    ag_tensor view_grad;   // stage 1: a view of .grad over the shard
    ag_tensor *grad_shard; // stages 2 and 3 (owned)
    mp_block shard;        // stage 3: this rank's weights (host memory with params offloaded)
    mp_block master;       // offload: the float32 copy the optimizer steps on (host memory)
    int gathered;          // stage 3: units holding the whole parameter
    int units[2], nunits;  // stage 3: the units it belongs to
} zslot;

typedef struct {
    size_t *slots, n; // in bucket order
    size_t elems, pending;
    mp_block buf;
} zbucket;

typedef struct {
    size_t *slots, n;
    bool held;
} zunit;

struct par_zero {
    par_zero_config cfg;
    const par_strategy *st;
    par_comm *comm;
    ag_ctx *ctx;
    int N, rank;
    par_group groups[PAR_NGROUPS];   // every rank; this rank's expert-data-parallel group
    size_t grad_bytes, reduce_bytes; // of a gradient element, and of one reduced
    bool sync;                       // the coming backward is the step's last
    zslot *slots;
    size_t n, last;
    zbucket *buckets;
    size_t nbuckets;
    zunit *units;
    size_t nunits;
    bool in_backward; // stage 3: the backward has begun
    long bw_unit;     // stage 3: the unit the backward is in; -1 before it
    ag_tensor **opt;
    size_t nopt;
    size_t *counts, *displs; // [N] scratch for the collectives (real runs only)
};

// zero.c
bool par_real(const par_zero *z); // a real run over several ranks: collectives move data
// Rank q's part [lo, lo + len) of a slot, clipped to the parameter; and what rank q's shard
// holds of it (the padded stride under FSDP).
size_t par_part_lo(const zslot *s, int q);
size_t par_part_len(const zslot *s, int q);
size_t par_part_cap(const par_zero *z, const zslot *s, int q);
long par_find_slot(par_zero *z, const ag_tensor *p);
// A block billed under a label "<param>:<what>" (host memory when `host`); -1 with err set.
int par_alloc(mp_block *b, size_t bytes, mp_category cat, const ag_tensor *p, const char *what, bool host, ag_err *err);

// gather.c
bool par_before_backward(void *user, ag_tensor *leaf, ag_err *err);
int par_hold(par_zero *z, long u, ag_err *err);
void par_let_go(par_zero *z, long u);

// reduce.c
int par_make_buckets(par_zero *z, ag_err *err);
bool par_grad_ready(void *user, ag_tensor *leaf, ag_err *err);

// offload.c
bool par_offloads(const par_zero *z);
bool par_params_on_host(const par_zero *z);
int par_offload_setup(par_zero *z, ag_err *err); // the host copies, once the shards hold data
