// membill plan's answers to "does it fit": the largest batch and longest sequence on a device,
// the fewest GPUs whose rank fits (--gpus auto), and the settings that fit when the asked one
// does not, each measured by the same meta run.
#include "plan.h"

#include <stdlib.h>
#include <string.h>

static int fits(const plan_setting *s, long B, long T, uint64_t device, bool *ok, uint64_t *total, ag_err *err) {
    plan_bill b;
    plan_setting at = *s;
    at.batch = B, at.seq_len = T;
    cli_device_set_gpus(&at.dev, at.gpus); // NCCL's buffers with more than one
    if (plan_measure_device(&at, B, T, &b, err) != 0) {
        // A tensor past what meta mode bills (2^48 elements, a petabyte) fits no device.
        if (!strstr(err->msg, "too large for one tensor")) return -1;
        err->msg[0] = 0;
        *ok = false;
        return 0;
    }
    uint64_t t = plan_per_gpu(&at, &b).total;
    if (total) *total = t;
    *ok = t <= device && !b.dev_oom;
    return 0;
}

// The largest value in [lo, hi] for which fits() holds (0 if none), by doubling then bisection.
static long largest(const plan_setting *s, bool vary_batch, long lo, long hi, uint64_t device, ag_err *err) {
    long good = 0, probe = lo;
    bool ok;
    while (probe <= hi) {
        if (fits(s, vary_batch ? probe : s->batch, vary_batch ? s->seq_len : probe, device, &ok, NULL, err) != 0)
            return -1;
        if (!ok) {
            if (!good) return 0; // not even the smallest fits
            break;
        }
        good = probe;
        if (probe == hi) return good;
        probe = probe > hi / 2 ? hi : probe * 2;
    }
    long bad = probe;
    while (bad - good > 1) {
        long mid = good + (bad - good) / 2;
        if (fits(s, vary_batch ? mid : s->batch, vary_batch ? s->seq_len : mid, device, &ok, NULL, err) != 0) return -1;
        if (ok)
            good = mid;
        else
            bad = mid;
    }
    return good;
}

#define BATCH_SEARCH_CAP (1L << 30)

int plan_fit(const plan_setting *s, uint64_t device, plan_fit_result *f, ag_err *err) {
    long most = (long)s->cfg.max_positions - (s->infer ? s->new_tokens - 1 : 0), shortest = s->infer ? 1 : 2;
    memset(f, 0, sizeof *f);
    f->max_batch = largest(s, true, 1, BATCH_SEARCH_CAP, device, err);
    f->max_seq = f->max_batch < 0 ? -1 : largest(s, false, shortest, most, device, err);
    if (f->max_batch < 0 || f->max_seq < 0) return -1;
    f->batch_capped = f->max_batch == BATCH_SEARCH_CAP;
    f->seq_capped = f->max_seq == most;
    if (!f->max_batch && !f->max_seq) {
        plan_setting one = *s;
        one.batch = 1;
        plan_bill b;
        if (plan_measure_device(&one, 1, shortest, &b, err) != 0) return -1;
        f->smallest = plan_per_gpu(&one, &b).total;
    }
    return 0;
}

// The fewest GPUs (1 to PLAN_MAX_GPUS) whose rank fits: doubling to the first that does, then
// bisection, so that N fits and N - 1 does not (0: none does).
int plan_min_gpus(const plan_setting *s, uint64_t device, long *out, ag_err *err) {
    plan_setting at = *s;
    const long step = plan_gpus_step(s); // counted in multiples of it
    bool ok = false;
    long bad = 0, good = 1;
    for (;; good *= 2) {
        at.gpus = good * step;
        if (fits(&at, s->batch, s->seq_len, device, &ok, NULL, err) != 0) return -1;
        if (ok) break;
        bad = good;
        if (good * step >= PLAN_MAX_GPUS) {
            *out = 0;
            return 0;
        }
    }
    while (good - bad > 1) {
        long k = bad + (good - bad) / 2;
        at.gpus = k * step;
        if (fits(&at, s->batch, s->seq_len, device, &ok, NULL, err) != 0) return -1;
        if (ok)
            good = k;
        else
            bad = k;
    }
    *out = good * step;
    return 0;
}

// ---- the settings that fit ---------------------------------------------------------------------

static void add(plan_suggestion *g, const char *a, const char *b) {
    snprintf(g->options[g->n++], sizeof g->options[0], "%s", a);
    if (b) snprintf(g->options[g->n++], sizeof g->options[0], "%s", b);
}

// One change to a setting: whether it changes anything there, and the change with its options.
typedef struct {
    bool (*applies)(const plan_setting *s);
    void (*apply)(plan_setting *s, plan_suggestion *g);
} fit_move;

static bool dtype_applies(const plan_setting *s) { return strcmp(s->dt.name, "bf16") != 0; }
static void dtype_apply(plan_setting *s, plan_suggestion *g) {
    cli_parse_dtype("bf16", &s->dt);
    cli_dtype_optim(&s->dt, &s->ocfg);
    add(g, "--dtype", "bf16");
}
static bool flash_applies(const plan_setting *s) {
    return s->attention == AG_ATTENTION_EAGER && AG_FW(ag_framework_row_of(s->framework), flash_available);
}
static void flash_apply(plan_setting *s, plan_suggestion *g) {
    s->attention = AG_ATTENTION_FLASH;
    add(g, "--attention", "flash");
}
static bool ckpt_applies(const plan_setting *s) { return !s->checkpointing; }
static void ckpt_apply(plan_setting *s, plan_suggestion *g) {
    s->checkpointing = true;
    add(g, "--checkpointing", NULL);
}
static bool lora_applies(const plan_setting *s) { return !s->lora.cfg.rank; }
static void lora_apply(plan_setting *s, plan_suggestion *g) {
    s->lora.cfg = (llama_lora_config){.rank = 8, .alpha = 8, .targets = LLAMA_LORA_DEFAULT_TARGETS};
    add(g, "--lora-rank", "8");
}
static bool qlora_applies(const plan_setting *s) { return s->lora.cfg.rank && !s->lora.base_dtype; }
static void qlora_apply(plan_setting *s, plan_suggestion *g) {
    s->lora.base_dtype = "nf4";
    add(g, "--base-dtype", "nf4");
}
static bool shard_applies(const plan_setting *s) { return s->gpus > 1 && s->zero < 3 && !s->fsdp; }
static void shard_apply(plan_setting *s, plan_suggestion *g) {
    s->zero = 3;
    add(g, "--zero", "3");
}
static bool offload_applies(const plan_setting *s) { return !s->offload; }
static void offload_apply(plan_setting *s, plan_suggestion *g) {
    if (!s->fsdp && s->zero < 2) s->zero = 2, add(g, "--zero", "2");
    s->offload = s->fsdp || s->zero == 3 ? PAR_OFFLOAD_OPTIMIZER_PARAMS : PAR_OFFLOAD_OPTIMIZER;
    add(g, "--offload", par_offload_name((par_offload)s->offload));
}
static bool batch_applies(const plan_setting *s) { return s->batch > 1; }
static void batch_apply(plan_setting *s, plan_suggestion *g) {
    char k[32];
    snprintf(k, sizeof k, "%ld", s->batch * (s->grad_accum > 1 ? s->grad_accum : 1));
    s->grad_accum = s->batch * (s->grad_accum > 1 ? s->grad_accum : 1);
    s->batch = 1;
    add(g, "--batch", "1");
    add(g, "--grad-accum", k); // the same rows a step
}

// The smallest change first: dtype, flash attention, checkpointing, LoRA, QLoRA's base, ZeRO-3,
// offload, batch.
static const fit_move moves[] = {{dtype_applies, dtype_apply},     {flash_applies, flash_apply},
                                 {ckpt_applies, ckpt_apply},       {lora_applies, lora_apply},
                                 {qlora_applies, qlora_apply},     {shard_applies, shard_apply},
                                 {offload_applies, offload_apply}, {batch_applies, batch_apply}};
#define NMOVES (int)(sizeof moves / sizeof moves[0])
#define MOST_MOVES 4 // changes combined at most

// The moves of `mask` applied in order, each where it changes something; false if one does not.
static bool apply_all(const plan_setting *s, unsigned mask, plan_setting *out, plan_suggestion *g) {
    *out = *s;
    memset(g, 0, sizeof *g);
    for (int k = 0; k < NMOVES; k++) {
        if (!(mask & (1u << k))) continue;
        if (!moves[k].applies(out)) return false;
        moves[k].apply(out, g);
    }
    return true;
}

static int popcount(unsigned m) {
    int n = 0;
    for (; m; m &= m - 1) n++;
    return n;
}

int plan_suggest(const plan_setting *s, uint64_t device, plan_suggestion *out, int *n, ag_err *err) {
    unsigned found[PLAN_SUGGESTIONS];
    *n = 0;
    for (int size = 1; size <= MOST_MOVES && *n < PLAN_SUGGESTIONS; size++)
        for (unsigned mask = 1; mask < (1u << NMOVES) && *n < PLAN_SUGGESTIONS; mask++) {
            if (popcount(mask) != size) continue;
            bool covered = false; // a smaller change that fits is within it
            for (int k = 0; k < *n && !covered; k++) covered = (found[k] & mask) == found[k];
            plan_setting t;
            if (covered || !apply_all(s, mask, &t, &out[*n])) continue;
            bool ok;
            if (fits(&t, t.batch, t.seq_len, device, &ok, &out[*n].total, err) != 0) return -1;
            if (ok) found[(*n)++] = mask;
        }
    return 0;
}
