// The sharding strategies as data: what each shards, and how it gathers and reduces.
#include "parallel.h"

static const par_strategy strategies[] = {
    {"DDP", "every rank holds everything; gradients all-reduced in buckets", 0, false, false, false, false, false,
     false, false},
    {"ZeRO-1", "optimizer state sharded; gradients reduce-scattered, weights all-gathered", 1, false, false, false,
     false, false, false, false},
    {"ZeRO-2", "gradients sharded too: each rank keeps its shard of each bucket", 2, false, false, false, false, false,
     true, false},
    {"ZeRO-3", "weights sharded too: each block gathered around its forward and backward", 3, false, false, true, false,
     false, true, true},
    {"FSDP full-shard", "fully_shard: each block gathered in one all-gather around its forward and backward", 3, true,
     true, true, true, true, true, false},
    {"FSDP shard-grad-op",
     "fully_shard(reshard_after_forward=False): each block gathered from its forward to its "
     "backward",
     3, true, true, false, true, true, true, false},
};

const par_strategy *par_strategy_of(int stage, par_fsdp fsdp) {
    if (fsdp == PAR_FSDP_FULL_SHARD) return &strategies[4];
    if (fsdp == PAR_FSDP_SHARD_GRAD_OP) return &strategies[5];
    return stage >= 0 && stage <= 3 ? &strategies[stage] : NULL;
}

const char *par_fsdp_name(par_fsdp f) {
    static const char *const names[] = {"none", "full-shard", "shard-grad-op"};
    return (unsigned)f <= PAR_FSDP_SHARD_GRAD_OP ? names[f] : "?";
}

const char *par_offload_name(par_offload o) {
    static const char *const names[] = {"none", "optimizer", "optimizer+params"};
    return (unsigned)o <= PAR_OFFLOAD_OPTIMIZER_PARAMS ? names[o] : "?";
}
