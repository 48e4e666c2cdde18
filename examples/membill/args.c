// Option parsing for every subcommand. One table: name, takes a value, where it goes.
#include "cli.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef enum { T_FLAG, T_STR, T_LONG, T_U64, T_DOUBLE, T_BYTES } opt_type;

typedef struct {
    const char *name;
    opt_type type;
    size_t offset;
    long min, max; // T_LONG bounds
} opt_spec;

#define OFF(f) offsetof(cli_options, f)
static const opt_spec specs[] = {
    {"--model", T_STR, OFF(model), 0, 0},
    {"--config", T_STR, OFF(config), 0, 0},
    {"--weights", T_STR, OFF(weights), 0, 0},
    {"--tokens", T_STR, OFF(tokens), 0, 0},
    {"--batch", T_LONG, OFF(batch), 1, 1 << 20},
    {"--seq-len", T_LONG, OFF(seq_len), 1, 1 << 24},
    {"--steps", T_LONG, OFF(steps), 1, 100000},
    {"--threads", T_LONG, OFF(threads), 1, 1024},
    {"--seed", T_U64, OFF(seed), 0, 0},
    {"--optimizer", T_STR, OFF(optimizer), 0, 0},
    {"--lr", T_DOUBLE, OFF(lr), 0, 0},
    {"--meta", T_FLAG, OFF(meta), 0, 0},
    {"--quiet", T_FLAG, OFF(quiet), 0, 0},
    {"--budget", T_BYTES, OFF(budget), 0, 0},
    {"--json", T_STR, OFF(json), 0, 0},
    {"--timeline", T_STR, OFF(timeline), 0, 0},
    {"--svg", T_STR, OFF(svg), 0, 0},
    {"--trace", T_STR, OFF(trace), 0, 0},
    {"--html", T_STR, OFF(html), 0, 0},
    {"--explain", T_FLAG, OFF(explain), 0, 0},
    {"--checkpointing", T_FLAG, OFF(checkpointing), 0, 0},
    {"--dump-grads", T_STR, OFF(dump_grads), 0, 0},
    {"--save-weights", T_STR, OFF(save_weights), 0, 0},
    {"--new-tokens", T_LONG, OFF(new_tokens), 1, 1 << 20},
    {"--no-cache", T_FLAG, OFF(no_cache), 0, 0},
    {"--no-speed", T_FLAG, OFF(no_speed), 0, 0},
    {"--gpus", T_LONG, OFF(gpus), 1, 1 << 20},
    {"--zero", T_LONG, OFF(zero), 0, 3},
    {"--device-memory", T_BYTES, OFF(device_memory), 0, 0},
    {"--overhead", T_BYTES, OFF(overhead), 0, 0},
    {"--list", T_FLAG, OFF(list), 0, 0},
    {"--dtype", T_STR, OFF(dtype), 0, 0},
    {"--weight-dtype", T_STR, OFF(weight_dtype), 0, 0},
    {"--group-size", T_LONG, OFF(group_size), 1, 1 << 20},
    {"--infer", T_FLAG, OFF(infer), 0, 0},
    {"--help", T_FLAG, OFF(help), 0, 0},
    {"-h", T_FLAG, OFF(help), 0, 0},
};

// Pure 16-bit runs keep the optimizer state in the parameters' dtype (as torch.optim does);
// mixed precision keeps 16-bit weights, gradients and activations, and a float32 master copy
// with float32 Adam state (DeepSpeed's 2 + 2 + 12 = 16 bytes a parameter). Megatron-LM
// accumulates the gradients in float32 ("main_grad"): 2 + 4 + 12 = 18.
static const cli_dtype dtypes[] = {
    {"fp32", "float32", 32, 32, 32, 32, false, 0, 0, NULL},
    {"bf16", "bfloat16", 16, 16, 16, 16, false, 0, 0, NULL},
    {"fp16", "float16", 16, 16, 16, 16, false, 0, 0, NULL},
    {"bf16-mixed", "bf16-mixed", 16, 16, 16, 32, true, 0, 0, NULL},
    {"fp16-mixed", "fp16-mixed", 16, 16, 16, 32, true, 0, 0, NULL},
    {"bf16-mixed-fp32-grads", "bf16-mixed-fp32-grads", 16, 16, 32, 32, true, 0, 0, NULL},
};

bool cli_parse_dtype(const char *name, cli_dtype *out) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(name ? name : "fp32", dtypes[i].name) == 0) {
            *out = dtypes[i];
            return true;
        }
    return false;
}

bool cli_parse_weight_dtype(const char *name, long group_size, cli_dtype *d) {
    static const struct {
        const char *name;
        int bits;
    } w[] = {{"fp32", 32}, {"bf16", 16}, {"fp16", 16}, {"int8", 8}, {"int4", 4}};
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        if (strcmp(name, w[i].name) == 0) {
            d->weight_bits = w[i].bits;
            d->weight_name = w[i].name;
            d->group = w[i].bits == 4 ? (group_size ? group_size : 32) : 0;
            d->scale_bytes = w[i].bits == 4 ? 2 : 0;
            return true;
        }
    return false;
}

bool cli_dtype_is_f32(const cli_dtype *d) {
    return !d->name || (d->act_bits == 32 && d->weight_bits == 32 && d->grad_bits == 32 && d->state_bits == 32 &&
                        !d->master);
}

ag_meta_dtype cli_meta_dtype(const cli_dtype *d) {
    if (!d->name) return ag_meta_dtype_f32();
    return (ag_meta_dtype){.act_bits = d->act_bits, .weight_bits = d->weight_bits, .grad_bits = d->grad_bits,
                           .group = d->group, .scale_bytes = d->scale_bytes};
}

void cli_dtype_optim(const cli_dtype *d, optim_config *c) {
    c->state_bits = d->name ? d->state_bits : 32;
    c->master = d->name && d->master;
}

const char *cli_dtype_bytes_text(const cli_dtype *d, optim_kind kind, char *buf, size_t len) {
    cli_dtype f;
    if (!d->name) cli_parse_dtype(NULL, &f), d = &f;
    int states = (int)(optim_state_bytes_per_element(kind) / sizeof(float)), n;
    n = snprintf(buf, len, "%d + %d", d->weight_bits / 8, d->grad_bits / 8);
    if (d->master && kind != OPTIM_NONE) n += snprintf(buf + n, len - (size_t)n, " + 4");
    for (int i = 0; i < states && (size_t)n < len; i++) n += snprintf(buf + n, len - (size_t)n, " + %d", d->state_bits / 8);
    return buf;
}

static bool set_value(cli_options *o, const opt_spec *s, const char *v) {
    char *base = (char *)o + s->offset, *end = NULL;
    errno = 0;
    switch (s->type) {
    case T_STR: *(const char **)base = v; return true;
    case T_LONG: {
        long x = strtol(v, &end, 10);
        if (errno || end == v || *end || x < s->min || x > s->max) {
            fprintf(stderr, "membill: %s expects a whole number from %ld to %ld, not '%s'\n", s->name, s->min, s->max, v);
            return false;
        }
        *(long *)base = x;
        return true;
    }
    case T_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end || v[0] == '-') {
            fprintf(stderr, "membill: %s expects a non-negative whole number, not '%s'\n", s->name, v);
            return false;
        }
        *(uint64_t *)base = x;
        return true;
    }
    case T_DOUBLE: {
        double x = strtod(v, &end);
        if (errno || end == v || *end || !(x >= 0) || x > 1e6) {
            fprintf(stderr, "membill: %s expects a non-negative number, not '%s'\n", s->name, v);
            return false;
        }
        *(double *)base = x;
        if (s->offset == OFF(lr)) o->lr_given = true;
        return true;
    }
    case T_BYTES:
        if (s->offset == OFF(overhead)) o->overhead_given = true;
        if (!mp_parse_bytes(v, (uint64_t *)base) || (*(uint64_t *)base == 0 && s->offset != OFF(overhead))) {
            fprintf(stderr, "membill: %s expects a size such as 16GB, 500MiB or 123456, not '%s'\n", s->name, v);
            return false;
        }
        return true;
    case T_FLAG: break;
    }
    return false;
}

bool cli_parse(cli_options *o, int argc, char **argv) {
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
        const opt_spec *s = NULL;
        for (size_t k = 0; k < sizeof specs / sizeof specs[0]; k++)
            if (strlen(specs[k].name) == len && strncmp(specs[k].name, arg, len) == 0) s = &specs[k];
        if (!s) {
            fprintf(stderr, "membill %s: unknown option '%s' (see membill %s --help)\n", o->command, arg, o->command);
            return false;
        }
        if (s->type == T_FLAG) {
            if (eq) {
                fprintf(stderr, "membill: %s takes no value\n", s->name);
                return false;
            }
            *(bool *)((char *)o + s->offset) = true;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "membill: %s needs a value\n", s->name);
            return false;
        }
        if (!set_value(o, s, v)) return false;
    }
    return true;
}

void cli_usage_train(FILE *f) {
    fputs("usage: membill train [options]\n"
          "One real training step of a Llama-family model (forward, next-token cross-entropy,\n"
          "backward, optimizer step), with every byte billed to weight, gradient, optimizer,\n"
          "activation, cache or other.\n\n"
          "  --model NAME          built-in preset (default smollm2-135m)\n"
          "  --config FILE         a Hugging Face config.json (Llama family)\n"
          "  --weights PATH        .safetensors file, or a folder with config.json and model.safetensors\n"
          "                        (default: random init, normal std 0.02, norms 1, from --seed)\n"
          "  --tokens 1,2,3        input token ids (default: --seq-len random ids)\n"
          "  --seq-len N           tokens per row (default 25)\n"
          "  --batch B             rows (default 1)\n"
          "  --steps N             training steps (default 1); N >= 2 shows the steady state apart\n"
          "  --optimizer NAME      adam (default), adamw, sgd, sgd-momentum, none\n"
          "  --lr X                learning rate (default 1e-5)\n"
          "  --seed S              seed for init and random tokens (default 0)\n"
          "  --threads N           threads (default 2)\n"
          "  --checkpointing       keep only each block's input; recompute the block in backward\n"
          "  --meta                shapes only: the same allocations and bill, no data, no compute\n"
          "  --dtype NAME          with --meta: fp32 (default), bf16, fp16, bf16-mixed, fp16-mixed,\n"
          "                        bf16-mixed-fp32-grads (real runs compute in float32)\n"
          "  --budget SIZE         stop with an out-of-memory report past SIZE (16GB, 500MiB, ...)\n"
          "  --json FILE           the whole report as JSON ('-' for stdout)\n"
          "  --timeline FILE.csv   every allocation and free: time, phase, site, category, bytes\n"
          "  --svg FILE.svg        a stacked-area chart of live bytes by category over the run\n"
          "  --trace FILE.json     a Chrome trace-event file (opens in Perfetto): a counter per category\n"
          "  --html FILE.html      one page: the chart, the bill, the top sites, what it means\n"
          "  --explain             each category's formula worked out for this model, beside the claims\n"
          "  --dump-grads FILE     parameter gradients after backward, F32 safetensors, HF names\n"
          "  --save-weights FILE   the weights after the optimizer step, F32 safetensors\n"
          "  --quiet               no text report (with --json)\n",
          f);
}

void cli_usage_plan(FILE *f) {
    fputs("usage: membill plan [options]\n"
          "The bill of a training step (or with --infer, of a generation) for any model, dtype and\n"
          "setting without running it: the same program in meta mode (every allocation and free at\n"
          "the dtype's element sizes, no data, no compute), beside the closed form of each category,\n"
          "per GPU when sharded, and whether it fits.\n\n"
          "  --list                the built-in presets, with their parameter counts\n"
          "  --model NAME          built-in preset (default smollm2-135m)\n"
          "  --config FILE         a Hugging Face config.json (Llama family)\n"
          "  --batch B             rows per GPU (default 1)\n"
          "  --seq-len N           tokens per row (default 25)\n"
          "  --optimizer NAME      adam (default), adamw, sgd, sgd-momentum, none\n"
          "  --checkpointing       keep only each block's input; recompute the block in backward\n"
          "  --dtype NAME          fp32 (default), bf16, fp16 (state in the parameters' dtype),\n"
          "                        bf16-mixed, fp16-mixed (16-bit weights and gradients, fp32 master\n"
          "                        and Adam state: 16 bytes a parameter), bf16-mixed-fp32-grads\n"
          "                        (Megatron-LM's float32 main_grad: 18); with --infer fp32, bf16, fp16\n"
          "  --gpus N              data-parallel GPUs (default 1)\n"
          "  --zero 0|1|2|3        ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also weights\n"
          "  --device-memory SIZE  memory of one device (e.g. 80GB): fits or not, largest batch and\n"
          "                        longest sequence that fit\n"
          "  --overhead SIZE       framework overhead allowed per device (default 2GB)\n"
          "  --infer               a generation instead: weights, KV cache, activations, overhead\n"
          "  --new-tokens N        with --infer: tokens generated (default 1: the cache holds the prompt)\n"
          "  --weight-dtype NAME   with --infer: fp32, bf16, fp16, int8 (1 byte, no scales) or int4\n"
          "                        (half a byte and one fp16 scale per group of a row); norms stay in --dtype\n"
          "  --group-size N        elements per int4 scale (default 32)\n"
          "  --json FILE           the report as JSON ('-' for stdout)\n",
          f);
}

void cli_usage_infer(FILE *f) {
    fputs("usage: membill infer [options]\n"
          "Generation as a user runs it: a prefill over the prompt, then greedy decode with a KV cache,\n"
          "billed the same way as training (the cache in its own category).\n\n"
          "  --model NAME          built-in preset (default smollm2-135m)\n"
          "  --config FILE         a Hugging Face config.json (Llama family)\n"
          "  --weights PATH        .safetensors file, or a folder with config.json and model.safetensors\n"
          "  --tokens 1,2,3        the prompt's ids; rows separated by ';' make a batch of prompts,\n"
          "                        left-padded to the longest (default: --seq-len random ids)\n"
          "  --seq-len N           prompt length (default 25)\n"
          "  --batch B             copies of the prompt (default 1)\n"
          "  --new-tokens N        tokens to generate (default 40)\n"
          "  --no-cache            recompute the whole sequence at every step instead of caching\n"
          "  --dtype NAME          with --meta: fp32 (default), bf16 or fp16 activations and cache\n"
          "  --weight-dtype NAME   with --meta: fp32, bf16, fp16, int8 or int4 weights; --group-size N\n"
          "                        elements per int4 scale (default 32)\n"
          "  --seed S, --threads N, --meta, --budget SIZE, --json FILE, --timeline FILE.csv,\n"
          "  --svg FILE, --trace FILE, --html FILE, --quiet   as for membill train\n",
          f);
}
