// parallel: data parallelism across processes. A communicator (MPI when built with MEMBILL_MPI, or a
// simulated rank whose collectives move nothing) and ZeRO's stages 0 to 3 over it, as PyTorch
// DDP and DeepSpeed run them, every buffer billed through the profiler. It knows parameters and
// the units they are gathered in (a model's modules), not models.
//
// Every function that can fail returns 0 (or non-NULL) on success and -1 (NULL) with one line
// in *err. Nothing here prints or exits.
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "autograd.h"

// ================================================================================================
// The communicator
// ================================================================================================

typedef enum { PAR_ALL_REDUCE, PAR_REDUCE_SCATTER, PAR_ALL_GATHER, PAR_NCOLLECTIVES } par_collective;

// What the collectives of one communicator did. bytes: the buffer each call handed over (the
// message size, as nccl-tests counts it: an all-reduce's whole bucket, a reduce-scatter's whole
// input, an all-gather's whole output); sent_bytes: what one rank sends over a ring for it
// (2 (N-1)/N of the buffer for an all-reduce, (N-1)/N for the others).
typedef struct {
    uint64_t calls[PAR_NCOLLECTIVES], bytes[PAR_NCOLLECTIVES], sent_bytes[PAR_NCOLLECTIVES];
    double seconds[PAR_NCOLLECTIVES];
} par_stats;

typedef struct par_comm par_comm;

// Whether this build has MPI (cmake -DMEMBILL_MPI=ON).
bool par_mpi_built(void);
// MPI_COMM_WORLD, initialising MPI (MPI_Init_thread, funneled) if nobody did; the first call
// initialises, par_comm_free finalises. -1 without the MPI build, naming it.
int par_comm_world(par_comm **out, ag_err *err);
// Rank `rank` of `size` simulated in one process: every collective is counted (calls, bytes) and
// moves nothing, as a meta run's buffers hold nothing (membill plan's simulated rank).
int par_comm_simulated(par_comm **out, int rank, int size, ag_err *err);
void par_comm_free(par_comm *c); // NULL is ignored
int par_rank(const par_comm *c);
int par_size(const par_comm *c);
bool par_is_simulated(const par_comm *c);
const char *par_collective_name(par_collective k); // "all_reduce", "reduce_scatter", "all_gather"
par_stats par_get_stats(const par_comm *c);
double par_comm_seconds(const par_comm *c); // every collective's time together

// Collectives over float32 buffers (NULL data in meta mode: counted, nothing moved). elem_bytes
// is what one element is billed at (4 in real runs), for the byte counts.
// buf[n] summed over the ranks, in place.
int par_all_reduce_sum(par_comm *c, float *buf, size_t n, size_t elem_bytes, ag_err *err);
// buf holds every rank's part back to back, counts[r] elements each (rank order); afterwards
// this rank's part, summed over the ranks, is at the start of buf.
int par_reduce_scatter_sum(par_comm *c, float *buf, const size_t *counts, size_t elem_bytes, ag_err *err);
// Bytes: buf[displs[r] .. + counts[r]) is rank r's part; afterwards every rank's part is in every
// buf (any dtype, a quantised weight's storage too).
int par_all_gather(par_comm *c, void *buf, const size_t *counts, const size_t *displs, ag_err *err);
// Each rank's text to rank 0 (not counted: reporting, not training). On rank 0 *all gets
// size() malloc'd strings (the caller frees each and the array), elsewhere NULL.
int par_gather_text(par_comm *c, const char *mine, char ***all, ag_err *err);
// The largest of each rank's value, on every rank (not counted).
int par_max_int(par_comm *c, int mine, int *out, ag_err *err);
// The largest of each rank's status, waiting at most timeout_s for every rank to come: 0 and
// *worst when they all did, -1 when one did not (it may wait in a collective the others left:
// the caller should par_abort). Not counted.
int par_agree(par_comm *c, int mine, double timeout_s, int *worst, ag_err *err);
// Ends every rank of the job at once with this exit code (MPI_Abort): a rank that failed while
// the others may be waiting in a collective. Simulated: does nothing.
void par_abort(par_comm *c, int code);

// ================================================================================================
// Sharded data parallelism: ZeRO's stages (DeepSpeed) and FSDP (PyTorch's fully_shard, FSDP2)
//
// What differs between them is data, a row of par_strategy (strategy.c), not code.
//
// ZeRO: each parameter is split into size() contiguous shards of ceil(numel / N) elements (the
// last ones shorter, or empty), rank r owning [r x s, (r + 1) x s). Stage 0 is DDP: every rank
// keeps everything and the gradients are all-reduced. Stage 1 shards the optimizer state: the
// optimizer steps on this rank's shard of each parameter (views into the weights and their
// gradients), and the updated shards are all-gathered. Stage 2 shards the gradients too: each
// parameter's .grad is copied into its bucket and freed, and the bucket's reduce-scatter leaves
// this rank its gradient shard ("<param>:grad_shard", gradient). Stage 3 shards the weights:
// each rank keeps its shard ("<param>:shard", weight) and a unit's parameters get their full
// storage (weight, under their own names) just before the unit's forward and again before its
// backward, all-gathered parameter by parameter, and lose it right after, with the next
// `prefetch` units gathered ahead. Gradients are reduced in buckets of at most bucket_bytes (a
// larger parameter alone in its own), filled in reverse parameter order as their gradients
// become final (DDP's order); a bucket ("zero.bucket.<k>", temporary) lives from its first
// gradient to its reduction.
//
// FSDP (fully_shard on each block and on the root): every parameter sharded on dim 0, each rank
// ceil(rows / N) rows, padded so that every rank holds as many (the padding is billed); one
// all-gather per unit into a flat buffer ("fsdp.unit.<u>:all_gather_output", temporary, N times
// the unit's padded shards) copied out into the parameters' storage, then freed; with a mixed
// precision policy, or shards on the host, the all-gather input made on the device first
// ("...:all_gather_input"). full-shard frees a block's parameters after its forward,
// shard-grad-op keeps them until its backward is done; the root (the first unit: embedding,
// final norm, head) stays gathered from the forward's start to the backward's end. Gradients are
// reduce-scattered per unit once its backward is done: the unit's gradients copied into one
// buffer ("zero.bucket.<k>", padded) and freed, this rank's part left as gradient shards.
//
// Frozen parameters (requires_grad off: a LoRA base) are never reduced nor stepped: stages 0 to
// 2 leave them whole, stage 3 and FSDP shard and gather them in their own dtype (a quantised
// base's storage as bytes). Every gradient is averaged over the ranks (each rank's loss is the
// mean over its own batch).
//
// Offload (ZeRO-Offload, FSDP's CPUOffloadPolicy) puts in host memory (the profiler's host
// counters, mp_set_host): a float32 copy of each shard that trains ("<param>:master", optimizer),
// the gradient shards, and everything the optimizer allocates (it runs on the host); with
// params, the weight shards too. After the step the updated shard goes back to the device
// (through a host staging buffer, "<param>:staging", when the weights are 16-bit). FSDP's
// policy moves the parameters with the optimizer and steps on the float32 shards themselves.
//
// Gradient accumulation: a micro-batch's backward with sync off reduces nothing under DDP and
// stage 1 (DDP's no_sync: the gradients accumulate in .grad), and reduces as usual under stages
// 2, 3 and FSDP, the gradient shards accumulating.
// ================================================================================================

// Expert parallelism (DeepSpeed-MoE's groups): with ep > 1 the experts of each sparse layer are
// split over ep ranks, each rank holding its own. The parameters are partitioned over groups of
// ranks, a group per parameter: the dense ones (attention, norms, embeddings, routers, shared
// experts) over every rank, as without experts; a rank's experts over its expert-data-parallel
// group, the size / ep ranks that hold the same experts (DeepSpeed's layout: expert-parallel
// groups are runs of ep consecutive ranks, rank r's expert-data-parallel group is r mod ep,
// r mod ep + ep, ..., r at place r / ep in it). Their optimizer state (stage 1), gradients
// (stage 2) and weights (stage 3) are sharded over that group, and their parts of a bucket
// reduced and their shards gathered over it. Under stages 0 to 2 they share the buckets of the
// dense parameters (DeepSpeed's one bucket, each parameter's slices reduced over its own group);
// stage 3 closes a bucket where the group changes (DeepSpeed's stage 3 under AutoEP; its own MoE
// layers refuse stage 3). Every gradient is averaged over every rank (DeepSpeed divides the whole
// bucket by the data-parallel world size). FSDP is refused, and so is a real run over several
// ranks (the groups are simulated: membill plan --ep).
typedef enum { PAR_GROUP_DATA, PAR_GROUP_EXPERT_DATA, PAR_NGROUPS } par_group_kind;

// A group of ranks a parameter is partitioned over: its size and this rank's place in it.
typedef struct {
    int size, rank;
} par_group;

// The expert-data-parallel group of this rank with experts split over ep ranks (ep dividing the
// communicator's size; 0 or 1: every rank).
par_group par_expert_data_group(const par_comm *c, int ep);

typedef enum { PAR_FSDP_NONE, PAR_FSDP_FULL_SHARD, PAR_FSDP_SHARD_GRAD_OP } par_fsdp;
typedef enum { PAR_OFFLOAD_NONE, PAR_OFFLOAD_OPTIMIZER, PAR_OFFLOAD_OPTIMIZER_PARAMS } par_offload;

// How one strategy shards, gathers and reduces.
typedef struct {
    const char *name;           // "DDP", "ZeRO-1" to "ZeRO-3", "FSDP full-shard", "FSDP shard-grad-op"
    const char *what;           // one line: what it shards
    int stage;                  // what is sharded: 1 optimizer state, 2 also gradients, 3 also weights
    bool dim0;                  // shards of whole rows, padded to N equal ones (FSDP); else flat, unpadded
    bool unit_gather;           // one all-gather per unit into a flat buffer, copied out; else per parameter
    bool reshard_after_forward; // stage 3: a unit freed after its forward (else after its backward)
    bool root_stays;            // the first unit gathered from the forward's start to the backward's end
    bool unit_reduce;           // gradients reduce-scattered per unit when its backward is done; else buckets
    bool reduce_every_backward; // with accumulation: reduced at each micro-batch (else the last only)
    bool group_buckets;         // a bucket holds one group's gradients, closed where the group changes
                                // (DeepSpeed's stage 3); else the groups share it, each part reduced apart
} par_strategy;

const par_strategy *par_strategy_of(int stage, par_fsdp fsdp);
const char *par_fsdp_name(par_fsdp f);       // "none", "full-shard", "shard-grad-op"
const char *par_offload_name(par_offload o); // "none", "optimizer", "optimizer+params"

typedef struct {
    int stage;           // 0 to 3 (FSDP: 3)
    par_fsdp fsdp;       // FSDP instead of ZeRO
    size_t bucket_bytes; // the cap of a reduction bucket (DDP's bucket_cap_mb, in bytes)
    int prefetch;        // stage 3: units gathered ahead of the one in use (0: none)
    par_offload offload; // stages 2 (optimizer only) and 3
    // FSDP's MixedPrecisionPolicy over 16-bit parameters: the shards of what trains are kept at
    // shard_bits (32: the optimizer steps on them, no master copy) and gradients reduced at
    // reduce_bits. 0: the parameters' own dtype.
    int shard_bits, reduce_bits;
    // A parameter that trains and that no node reached in a backward (an expert no token went to)
    // adds zeros to its bucket's reduction and gets its .grad from it, as DDP's
    // find_unused_parameters=True; false: it is an error.
    bool find_unused;
    int ep; // expert parallelism over this many ranks (0 or 1: none): the expert-data-parallel groups
} par_zero_config;

// The parameters gathered together in stage 3, a module of the model (a decoder block, the
// embedding), one unit per part of the forward, in forward order (an empty unit gathers
// nothing). A parameter may belong to two units (a tied embedding).
typedef struct {
    ag_tensor *const *params;
    size_t n;
} par_unit;

typedef struct par_zero par_zero;

// Shards the parameters (params[n]: each once, in the model's order, the frozen ones too) over
// c, each over its group (groups[n]; NULL: every one PAR_GROUP_DATA). For stage 3 the parameters
// must have been made without storage (ag_ctx_defer_params) and get their shards from
// par_zero_materialize. Installs the leaf hooks on ctx (ag_ctx_set_leaf_hooks), which must
// outlive it. The units are copied.
int par_zero_new(par_zero **out, const par_zero_config *cfg, par_comm *c, ag_ctx *ctx, ag_tensor *const *params,
                 size_t n, const par_group_kind *groups, const par_unit *units, size_t nunits, ag_err *err);
void par_zero_free(par_zero *z); // NULL is ignored; frees shards, buckets, gathered storage, host copies
const par_strategy *par_zero_strategy(const par_zero *z);

// Stage 3, as zero.Init: unit by unit, the unit's parameters get their full storage, fill()
// writes every parameter that has storage (a seeded init, a checkpoint's tensors), this rank's
// shards are copied out and the storage freed, so that no more than one unit is ever whole.
// Other stages: nothing (their parameters are whole from the start). With offload, the host
// copies are made afterwards.
typedef int (*par_fill_fn)(void *user, ag_err *err);
int par_zero_materialize(par_zero *z, par_fill_fn fill, void *user, ag_err *err);

// The forward's part hook (llama_forward_opts.on_part's shape, user = the par_zero): stage 3
// gathers unit `part` (and prefetches) before it and frees it after; once the backward has begun
// (a checkpointed block's recomputation), it gathers the unit and the next ones below it and
// frees those above. Other stages do nothing.
bool par_zero_on_part(void *user, int64_t part, bool before, ag_err *err);

// What the optimizer steps on: stage 0 the parameters themselves, stages 1 to 3 this rank's
// shard of each (views, named as their parameter; a parameter with an empty shard is left out),
// the parameters that train only. Owned by z. par_zero_steps_on_float32: the views are float32
// copies (offload's host masters, FSDP's float32 shards): the optimizer keeps no master of its own.
ag_tensor *const *par_zero_opt_params(const par_zero *z, size_t *n);
bool par_zero_steps_on_float32(const par_zero *z);
// Gradient accumulation: whether the coming backward is the last of the step (on by default).
void par_zero_set_sync(par_zero *z, bool sync);
// After each backward: the buckets still waiting reduced (none, when every parameter got a
// gradient), stage 3's units freed; after the last, the views' gradients set.
int par_zero_after_backward(par_zero *z, ag_err *err);
// Around the optimizer step: with offload it runs in host memory; afterwards the updated shards
// go back to the device and stages 1 and 2 all-gather every updated shard into the weights.
void par_zero_before_step(par_zero *z);
int par_zero_after_step(par_zero *z, ag_err *err);
// Every gradient set to none: the parameters' and the shards' (zero_grad(set_to_none=True)).
void par_zero_zero_grad(par_zero *z);
// Stage 3: every parameter gathered whole (for saving the weights), until par_zero_release_all.
// Other stages: nothing.
int par_zero_gather_all(par_zero *z, ag_err *err);
void par_zero_release_all(par_zero *z);
