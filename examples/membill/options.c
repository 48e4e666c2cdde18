// The options of every subcommand, in one table: name, value, type, range, default, the
// subcommands that take it, and its help. Parsing, defaults, help and the README's list all
// come from it, so they cannot drift apart.
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

// T_GPUS: a count, or "auto" (0). T_DEVICE: a size as GPU cards are sold (24GB is 24 GiB).
typedef enum { T_FLAG, T_STR, T_PATH, T_OUT, T_LONG, T_U64, T_DOUBLE, T_BYTES, T_DEVICE, T_CHOICE, T_GPUS } opt_type;

enum { TR = CLI_TRAIN, IN = CLI_INFER, CO = CLI_COMPARE, PL = CLI_PLAN, CH = CLI_CHECK, SN = CLI_SNAPSHOT };
#define ALL (TR | IN | CO | PL | CH)
#define RUNS (TR | IN | CO) // the commands that run a model for real

typedef struct {
    const char *name, *value; // "--seq-len", "N" (NULL for a flag)
    opt_type type;
    size_t offset;
    unsigned cmds;     // the subcommands that take it
    const char *def;   // the default as one would type it; NULL: none
    unsigned alt_cmds; // these subcommands default to alt_def instead
    const char *alt_def;
    double min, max;     // T_LONG, T_DOUBLE, T_BYTES bounds
    const char *choices; // T_CHOICE: "a|b|c"
    const char *help;    // NULL (with choices): made from data elsewhere, by `made` below
} opt_spec;

// The choices and help that data elsewhere makes (the frameworks' rows).
static const struct {
    const char *name;
    const char *(*choices)(void), *(*help)(void);
} made[] = {{"--framework", cli_framework_choices, cli_framework_help}};

static const char *choices(const opt_spec *s) {
    for (size_t i = 0; !s->choices && i < sizeof made / sizeof made[0]; i++)
        if (!strcmp(made[i].name, s->name)) return made[i].choices();
    return s->choices;
}

static const char *help_of(const opt_spec *s) {
    for (size_t i = 0; !s->help && i < sizeof made / sizeof made[0]; i++)
        if (!strcmp(made[i].name, s->name)) return made[i].help();
    return s->help;
}

#define OFF(f) offsetof(cli_options, f)
#define BIG 1e15
static const opt_spec specs[] = {
    {"--model", "NAME", T_STR, OFF(model), RUNS | PL | CH, "smollm2-135m", 0, NULL, 0, 0, NULL,
     "a built-in preset (membill plan --list names them), or a Hugging Face id org/name[@revision]: its config.json "
     "(and tokenizer, weights) from the Hugging Face cache, else the Hub"},
    {"--download", NULL, T_FLAG, OFF(download), RUNS | CH, NULL, 0, NULL, 0, 0, NULL,
     "fetch the Hub model's safetensors weights into the Hugging Face cache first (their size said, a progress bar "
     "on stderr, resumable); without it weights not in the cache are a random init"},
    {"--offline", NULL, T_FLAG, OFF(offline), RUNS | PL | CH, NULL, 0, NULL, 0, 0, NULL,
     "the Hugging Face cache alone, never the Hub (as HF_HUB_OFFLINE=1)"},
    {"--config", "FILE", T_PATH, OFF(config), RUNS | PL, NULL, 0, NULL, 0, 0, NULL,
     "a Hugging Face config.json (model_type llama, mistral, qwen2, qwen3, mixtral, qwen2_moe, qwen3_moe, gemma2, "
     "gemma3_text, phi3, gpt_oss or deepseek_v3) instead of a preset"},
    {"--weights", "PATH", T_PATH, OFF(weights), RUNS, NULL, 0, NULL, 0, 0, NULL,
     "a .safetensors file, a model.safetensors.index.json (sharded), or a folder with config.json and "
     "model.safetensors or the index (default: random init)"},
    {"--tokens", "IDS", T_STR, OFF(tokens), RUNS, NULL, 0, NULL, 0, 0, NULL,
     "the input ids, 1,2,3; for infer, prompts separated by ';' make a batch (default: random ids)"},
    {"--prompt", "TEXT", T_STR, OFF(prompt), RUNS | CH, NULL, 0, NULL, 0, 0, NULL,
     "the input as text, through the tokenizer (its template's tokens included), repeated over --batch (check: the "
     "prompt of the speed and output claims, with a Hub --model)"},
    {"--prompt-file", "FILE", T_PATH, OFF(prompt_file), RUNS, NULL, 0, NULL, 0, 0, NULL,
     "the input as the text of FILE (UTF-8), as --prompt"},
    {"--tokenizer", "FILE", T_PATH, OFF(tokenizer), RUNS, NULL, 0, NULL, 0, 0, NULL,
     "a Hugging Face tokenizer.json (byte-level BPE) for --prompt (default: tokenizer.json of the --weights "
     "folder, else of the --config file's folder); infer also prints the generated text"},
    {"--ignore-eos", NULL, T_FLAG, OFF(ignore_eos), IN, NULL, 0, NULL, 0, 0, NULL,
     "generate all --new-tokens: without it a generation stops once every row has produced an eos_token_id of "
     "the config or of the model folder's generation_config.json"},
    {"--batch", "B", T_LONG, OFF(batch), RUNS | PL, "1", 0, NULL, 1, 1e12, NULL, "rows (per GPU in plan)"},
    {"--seq-len", "N", T_LONG, OFF(seq_len), RUNS | PL, "25", 0, NULL, 1, 1 << 24, NULL, "tokens per row"},
    {"--new-tokens", "N", T_LONG, OFF(new_tokens), IN | CO | PL, "40", PL, "1", 1, 1 << 20, NULL,
     "tokens to generate (plan: with --infer)"},
    {"--steps", "N", T_LONG, OFF(steps), TR, "1", 0, NULL, 1, 100000, NULL,
     "training steps; with 2 or more the timings are the median of steps 2..N"},
    {"--framework", "NAME", T_CHOICE, OFF(framework), TR | IN | CO | PL | CH, "pytorch", 0, NULL, 0, 0, NULL, NULL},
    {"--attention", "NAME", T_CHOICE, OFF(attention), TR | IN | CO | PL | CH, "eager", 0, NULL, 0, 0,
     "eager|flash|efficient|cudnn",
     "eager (the T x T probabilities materialised, as HF's eager path) or one of SDPA's fused kernels, key/value "
     "tiles with an online softmax and no T x T tensor: flash (FlashAttention-2), efficient and cudnn (CUDA only: "
     "the memory-efficient and cuDNN kernels, each keeping what its own code keeps; docs/gpu.md)"},
    {"--optimizer", "NAME", T_CHOICE, OFF(optimizer), TR | CO | PL, "adam", 0, NULL, 0, 0,
     "adam|adamw|sgd|sgd-momentum|none", "the optimizer, with torch.optim's defaults"},
    {"--adam-impl", "NAME", T_CHOICE, OFF(adam_impl), TR | CO | PL, "for-loop", PL, "foreach", 0, 0,
     "for-loop|foreach|fused",
     "Adam's implementation as torch.optim runs it: for-loop (the CPU default: 2 parameter-sized temporaries at a "
     "time), foreach (the accelerators' default: whole-model temporaries), fused (none)"},
    {"--lr", "X", T_DOUBLE, OFF(lr), TR | CO, "1e-5", 0, NULL, 0, 1e6, NULL, "learning rate"},
    {"--seed", "S", T_U64, OFF(seed), RUNS, "0", 0, NULL, 0, 0, NULL, "seed of the random init and random ids"},
    {"--threads", "N", T_LONG, OFF(threads), RUNS | CH, "2", 0, NULL, 1, 1024, NULL, "compute threads"},
    {"--checkpointing", NULL, T_FLAG, OFF(checkpointing), TR | PL, NULL, 0, NULL, 0, 0, NULL,
     "keep only each block's input; recompute the block in backward"},
    {"--lora-rank", "R", T_LONG, OFF(lora_rank), TR | CO | PL, "0", 0, NULL, 0, 1 << 20, NULL,
     "LoRA as PEFT: freeze the model, train an adapter of rank R on each target (0: full fine-tune; compare --lora: "
     "8 unless given)"},
    {"--lora-alpha", "A", T_DOUBLE, OFF(lora_alpha), TR | CO | PL, "8", 0, NULL, LLAMA_LORA_MIN_ALPHA,
     LLAMA_LORA_MAX_ALPHA, NULL, "LoRA's lora_alpha: the adapter's update is scaled by A / R"},
    {"--lora-targets", "LIST", T_STR, OFF(lora_targets), TR | CO | PL, "q_proj,v_proj", 0, NULL, 0, 0, NULL,
     "the linear layers that get adapters, PEFT's names (q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj; "
     "phi3: qkv_proj,o_proj,gate_up_proj,down_proj) or all-linear"},
    {"--lora-dropout", "P", T_DOUBLE, OFF(lora_dropout), TR | CO | PL, "0", 0, NULL, 0, 0.999, NULL,
     "dropout on each adapter's input (PEFT's lora_dropout), with the mask it keeps for backward"},
    {"--base-dtype", "NAME", T_CHOICE, OFF(base_dtype), TR | CO | PL, NULL, 0, NULL, 0, 0, "nf4|int4|int8",
     "QLoRA: the frozen base's linear weights as bitsandbytes' NF4 (double-quantised absmax, about 4.127 bits), "
     "int4 (a 2-byte scale per 64) or int8 (a 4-byte scale per row, LLM.int8's), dequantised in the compute dtype"},
    {"--adapter-dtype", "NAME", T_CHOICE, OFF(adapter_dtype), TR | IN | CO | PL, "float32", 0, NULL, 0, 0,
     "float32|base",
     "the adapters' dtype beside a 16-bit or quantised base: float32 (PEFT's get_peft_model and from_pretrained, "
     "autocast_adapter_dtype=True: float32 adapters, gradients and Adam state; the input cast to float32 for "
     "them) or base (the base's dtype: autocast_adapter_dtype=False, or the model cast after get_peft_model)"},
    {"--adapter", "DIR", T_PATH, OFF(adapter), TR | IN, NULL, 0, NULL, 0, 0, NULL,
     "a PEFT adapter folder (adapter_config.json, adapter_model.safetensors) to train on or generate with"},
    {"--lora", NULL, T_FLAG, OFF(lora), CO, NULL, 0, NULL, 0, 0, NULL,
     "full fine-tune, LoRA, QLoRA and inference of the same model side by side"},
    {"--routing", "HOW", T_STR, OFF(routing), TR | IN | PL, "balanced", 0, NULL, 0, 0, NULL,
     "how a meta run of a mixture of experts routes its tokens: balanced (tokens x k / experts each), worst (every "
     "token to the same k experts) or FILE (a real run's --routing-out)"},
    {"--routing-out", "FILE", T_OUT, OFF(routing_out), TR | IN, NULL, 0, NULL, 0, 0, NULL,
     "a real run's routing of a mixture of experts: the tokens each expert got, layer by layer (for --routing)"},
    {"--no-cache", NULL, T_FLAG, OFF(no_cache), IN | CO, NULL, 0, NULL, 0, 0, NULL,
     "recompute the whole sequence at every decode step instead of keeping a KV cache"},
    {"--mla-cache", "KIND", T_CHOICE, OFF(mla_cache), IN | CO | PL, "expanded", 0, NULL, 0, 0, "expanded|latent",
     "deepseek_v3's KV cache: expanded (transformers': every head's keys and values after kv_b_proj) or latent "
     "(DeepSeek's own: the compressed kv and the rope key a token, kv_b_proj absorbed into the attention)"},
    {"--meta", NULL, T_FLAG, OFF(meta), RUNS, NULL, 0, NULL, 0, 0, NULL,
     "shapes only: the same allocations and bill, no data, no compute"},
    {"--dtype", "NAME", T_CHOICE, OFF(dtype), TR | IN | PL, "fp32", 0, NULL, 0, 0,
     "fp32|bf16|fp16|bf16-mixed|fp16-mixed|bf16-mixed-fp32-grads|autocast-bf16|bf16-autocast",
     "what weights, gradients, state and activations are stored in (bf16: the model cast, as "
     "model.to(torch.bfloat16); autocast-bf16: float32 parameters under torch.autocast, with a pytorch "
     "framework; bf16-autocast: the bf16 model under torch.autocast, as the Trainer's bf16=True runs a bf16 "
     "checkpoint); real runs compute every one but fp16 training (loss scaling: --meta only); a generation takes fp32, "
     "bf16 or fp16"},
    {"--weight-dtype", "NAME", T_CHOICE, OFF(weight_dtype), IN | PL, NULL, 0, NULL, 0, 0,
     "fp32|bf16|fp16|int8|int4|auto",
     "a generation's weights (plan: with --infer): int8 1 byte, int4 half a byte and a 2-byte scale per group; auto "
     "the checkpoint's dtype"},
    {"--group-size", "N", T_LONG, OFF(group_size), IN | PL, "32", 0, NULL, 1, 1 << 20, NULL,
     "elements per scale of --weight-dtype int4"},
    {"--infer", NULL, T_FLAG, OFF(infer), PL, NULL, 0, NULL, 0, 0, NULL,
     "plan a generation (weights, KV cache, activations) instead of a training step"},
    {"--gpus", "N", T_GPUS, OFF(gpus), PL, "1", 0, NULL, 1, 1 << 20, NULL,
     "data-parallel devices (plan: one simulated rank of N); auto: the fewest, up to 4096, whose rank fits "
     "--device-memory"},
    {"--ep", "N", T_LONG, OFF(ep), PL, "1", 0, NULL, 1, 1 << 16, NULL,
     "expert parallelism: a mixture of experts' experts split over N of the --gpus (all-to-all of the routed "
     "tokens), the rest data-parallel; --zero 1 to 3 shard each rank's experts over the --gpus / N ranks that "
     "hold the same ones; the plan bills one rank"},
    {"--zero", "S", T_LONG, OFF(zero), TR | PL, "0", 0, NULL, 0, 3, NULL,
     "ZeRO stage: 0 DDP, 1 shards optimizer state, 2 also gradients, 3 also weights (train: a real sharded step "
     "under mpirun, MPI build)"},
    {"--fsdp", "MODE", T_CHOICE, OFF(fsdp), TR | PL, NULL, 0, NULL, 0, 0, "full-shard|shard-grad-op",
     "PyTorch FSDP2 (fully_shard on each block and the root) instead of --zero: every parameter sharded on dim 0, "
     "one all-gather per block; full-shard frees a block after its forward, shard-grad-op after its backward"},
    {"--offload", "WHAT", T_CHOICE, OFF(offload), TR | PL, NULL, 0, NULL, 0, 0, "optimizer|optimizer+params",
     "ZeRO-Offload (--zero 2 or 3) or FSDP's CPUOffloadPolicy (optimizer+params): the optimizer state, a float32 "
     "copy of the shards and the gradient shards in host memory, the step run there; +params: the weight shards "
     "too (--zero 3, --fsdp)"},
    {"--grad-accum", "K", T_LONG, OFF(grad_accum), TR | PL, "1", 0, NULL, 1, 65536, NULL,
     "gradient accumulation: K micro-batches of --batch rows, one optimizer step (each loss scaled by 1/K)"},
    {"--bucket-mb", "N", T_LONG, OFF(bucket_mb), TR | PL, "25", 0, NULL, 1, 1 << 20, NULL,
     "MiB of gradients per reduction bucket, as DDP's bucket_cap_mb (with --zero)"},
    {"--prefetch-layers", "N", T_LONG, OFF(prefetch_layers), TR | PL, "1", 0, NULL, 0, 1 << 20, NULL,
     "ZeRO-3: units (blocks) gathered ahead of the one in use"},
    {"--device-memory", "SIZE", T_DEVICE, OFF(device_memory), PL, NULL, 0, NULL, 1, BIG * 1e3, NULL,
     "memory of one device as GPU cards are sold, in GiB: 80GB and 80GiB are both 80 x 2^30 bytes (B for exact "
     "bytes); whether the run fits, the largest batch and longest sequence that do, and if not what would"},
    {"--overhead", "SIZE", T_BYTES, OFF(overhead), PL, "2GB", 0, NULL, 0, BIG, NULL,
     "framework overhead allowed per device"},
    {"--list", NULL, T_FLAG, OFF(list), PL, NULL, 0, NULL, 0, 0, NULL, "the built-in presets and their sizes"},
    {"--device", "NAME", T_CHOICE, OFF(device), TR | IN | PL, "cpu", 0, NULL, 0, 0, "cpu|cuda",
     "cpu: the bill as measured; cuda: also PyTorch's CUDA caching allocator replayed over the same allocations "
     "(allocated, reserved, fragments, at the peak and at each phase's end; docs/gpu.md)"},
    {"--gpu", "NAME", T_STR, OFF(gpu), TR | IN | PL, NULL, 0, NULL, 0, 0, NULL,
     "a named GPU (membill plan --list-gpus): --device cuda on its memory, with its CUDA context and NCCL's buffers; "
     "whether the run fits it"},
    {"--cuda-alloc-conf", "CONF", T_STR, OFF(cuda_alloc_conf), TR | IN | PL, NULL, 0, NULL, 0, 0, NULL,
     "PYTORCH_CUDA_ALLOC_CONF for the replay (default: the environment's): expandable_segments, max_split_size_mb, "
     "roundup_power2_divisions, garbage_collection_threshold, max_non_split_rounding_mb"},
    {"--memory-fraction", "F", T_DOUBLE, OFF(memory_fraction), TR | IN | PL, NULL, 0, NULL, 1e-6, 1, NULL,
     "torch.cuda.set_per_process_memory_fraction(F) of --gpu's memory (garbage_collection_threshold acts under it)"},
    {"--seq-lens", "LIST", T_STR, OFF(seq_lens), TR | PL, NULL, 0, NULL, 0, 0, NULL,
     "each step its own length, as a loader of varying lengths feeds them (512,2048,...): train runs one step a "
     "length; plan runs the lengths twice, the second pass the steady state"},
    {"--snapshot", "FILE.pickle", T_OUT, OFF(snapshot), TR | IN | PL, NULL, 0, NULL, 0, 0, NULL,
     "the simulated device's history as torch.cuda.memory._dump_snapshot writes it (pytorch.org/memory_viz opens "
     "it); with --device cuda or --gpu"},
    {"--list-gpus", NULL, T_FLAG, OFF(list_gpus), PL, NULL, 0, NULL, 0, 0, NULL,
     "the named GPUs: the memory PyTorch sees, the CUDA context, and where each figure comes from"},
    {"--against", "PLAN.json", T_PATH, OFF(against), SN, NULL, 0, NULL, 0, 0, NULL,
     "membill snapshot: a membill JSON report with --device cuda of the same run, to set beside the snapshot"},
    {"--budget", "SIZE", T_BYTES, OFF(budget), RUNS, NULL, 0, NULL, 1, BIG * 1e3, NULL,
     "stop with an out-of-memory report when the total would pass SIZE (16GB, 500MiB)"},
    {"--no-speed", NULL, T_FLAG, OFF(no_speed), CH, NULL, 0, NULL, 0, 0, NULL,
     "skip the speed claims (S1-S3), which take a few minutes"},
    {"--explain", NULL, T_FLAG, OFF(explain), TR, NULL, 0, NULL, 0, 0, NULL,
     "each category's formula worked out for this model, beside the claims"},
    {"--json", "FILE", T_OUT, OFF(json), ALL | SN, NULL, 0, NULL, 0, 0, NULL, "the whole report as JSON ('-': stdout)"},
    {"--timeline", "FILE.csv", T_OUT, OFF(timeline), TR | IN | PL, NULL, 0, NULL, 0, 0, NULL,
     "every allocation and free: time, phase, site, category, bytes"},
    {"--svg", "FILE.svg", T_OUT, OFF(svg), TR | IN | CO | PL, NULL, 0, NULL, 0, 0, NULL,
     "a stacked-area chart of live bytes by category, small categories on a scale of their own below (compare: "
     "both runs on one scale)"},
    {"--trace", "FILE.json", T_OUT, OFF(trace), TR | IN | PL, NULL, 0, NULL, 0, 0, NULL,
     "a Chrome trace-event file (opens in Perfetto): a counter track per category, every tensor a slice from "
     "allocation to free (plain malloc: its counter track)"},
    {"--html", "FILE.html", T_OUT, OFF(html), ALL, NULL, 0, NULL, 0, 0, NULL,
     "one self-contained page: the timeline to hover, pin and zoom (what was live at any moment), the bill"},
    {"--save-adapter", "DIR", T_STR, OFF(save_adapter), TR, NULL, 0, NULL, 0, 0, NULL,
     "the adapters after the last optimizer step as PEFT saves them: DIR/adapter_model.safetensors and "
     "DIR/adapter_config.json (DIR is made if absent)"},
    {"--dump-grads", "FILE", T_OUT, OFF(dump_grads), TR, NULL, 0, NULL, 0, 0, NULL,
     "the gradients of what trains after the last backward, F32 safetensors with HF names"},
    {"--save-weights", "FILE", T_OUT, OFF(save_weights), TR, NULL, 0, NULL, 0, 0, NULL,
     "the weights after the last optimizer step, F32 safetensors"},
    {"--quiet", NULL, T_FLAG, OFF(quiet), ALL | SN, NULL, 0, NULL, 0, 0, NULL, "no text report on stdout"},
    {"--progress", NULL, T_FLAG, OFF(progress), RUNS | CH, NULL, 0, NULL, 0, 0, NULL,
     "progress on stderr even when it is not a terminal (on a terminal it is shown anyway)"},
    {"--help", NULL, T_FLAG, OFF(help), ALL | SN, NULL, 0, NULL, 0, 0, NULL, "this help"},
};
#define NSPECS (sizeof specs / sizeof specs[0])
_Static_assert(NSPECS <= CLI_MAX_OPTIONS, "cli_options.given holds one flag per option");

static const cli_command commands[] = {
    {"train", CLI_TRAIN, "one real training step (forward, loss, backward, optimizer), billed byte by byte",
     "Runs forward, the next-token cross-entropy loss, backward and the optimizer step of a Llama-family\n"
     "model and bills every byte to a category: weights, gradients, optimizer state, activations, and\n"
     "what plain malloc takes (other). Prints each category's peak, the moment of the total peak and\n"
     "what held it, the four-copies rule, and the phases' times."},
    {"infer", CLI_INFER, "generation (prefill + greedy decode with a KV cache), billed the same way",
     "A prefill over the prompt, then greedy decode with a KV cache (the cache in its own category),\n"
     "billed like training, with the prefill and decode timings."},
    {"compare", CLI_COMPARE, "a training step and inference of the same model side by side",
     "A training step and a generation of the same model, category by category, with the ratio of\n"
     "their total peaks."},
    {"check", CLI_CHECK, "every claim that a run can measure: the figure measured, pass or fail",
     "Every claim of the two lessons membill checks, on SmolLM2-135M: weights (W), training (T), the KV\n"
     "cache (K), activations (A) and speed (S). Memory claims run in meta mode (exact, seconds); the\n"
     "speed claims run for real and take a few minutes (--no-speed skips them). Exits 1 if a claim fails."},
    {"plan", CLI_PLAN, "the same bill for any model and setting, on shapes alone, with the closed form",
     "The bill of a training step (or with --infer, of a generation) for any model, dtype and setting\n"
     "without running it: the same program in meta mode (every allocation and free at the dtype's\n"
     "element sizes, no data, no compute), beside the closed form of each category, per GPU when\n"
     "sharded, and whether it fits a device."},
    {"snapshot", CLI_SNAPSHOT, "a CUDA memory snapshot read: its peaks, timeline and largest blocks",
     "membill snapshot FILE.pickle reads what torch.cuda.memory._dump_snapshot wrote (a real GPU run's, or\n"
     "membill's own --snapshot): allocated and reserved bytes at the end, requested and reserved at their\n"
     "peaks over the trace, a timeline, and the largest blocks live at the peak; --against PLAN.json sets a\n"
     "membill report of the same run beside it. The pickle is read as data: anything else is refused."},
};

const cli_command *cli_find_command(const char *name) {
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(name, commands[i].name) == 0) return &commands[i];
    return NULL;
}

size_t cli_command_count(void) { return sizeof commands / sizeof commands[0]; }
const cli_command *cli_command_at(size_t i) { return i < cli_command_count() ? &commands[i] : NULL; }
const char *cli_command_name(size_t i) { return i < cli_command_count() ? commands[i].name : NULL; }
static const char *option_name(size_t i) { return i < NSPECS ? specs[i].name : NULL; }

void cli_usage_error(const cli_options *o, const char *fmt, ...) {
    char raw[1024], line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    ag_escape(line, sizeof line, raw);
    fprintf(stderr, "membill %s: %s\n", o->command, line);
}

static const opt_spec *find_spec(const char *name, size_t len) {
    for (size_t k = 0; k < NSPECS; k++)
        if (strlen(specs[k].name) == len && strncmp(specs[k].name, name, len) == 0) return &specs[k];
    return NULL;
}

bool cli_given(const cli_options *o, const char *name) {
    const opt_spec *s = find_spec(name, strlen(name));
    return s && o->given[s - specs];
}

// The names of the subcommands in a set, "train, plan".
static const char *command_names(unsigned cmds, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = 0;
    for (size_t i = 0; i < cli_command_count(); i++)
        if (cmds & commands[i].bit)
            n += (size_t)snprintf(buf + n, n < len ? len - n : 0, "%s%s", n ? ", " : "", commands[i].name);
    return buf;
}

// Digits only: no sign, no space, no hex (strtol would take ' -1' as a number).
static bool all_digits(const char *v) {
    if (!*v) return false;
    for (const char *p = v; *p; p++)
        if (*p < '0' || *p > '9') return false;
    return true;
}

static bool set_number(const cli_options *o, const opt_spec *s, const char *v, char *base) {
    errno = 0;
    if (s->type == T_LONG) {
        long x = all_digits(v) ? strtol(v, NULL, 10) : -1;
        if (errno || x < (long)s->min || x > (long)s->max) {
            cli_usage_error(o, "%s expects a whole number from %.0f to %.0f, not '%s'", s->name, s->min, s->max, v);
            return false;
        }
        *(long *)base = x;
        return true;
    }
    if (s->type == T_U64) {
        unsigned long long x = all_digits(v) ? strtoull(v, NULL, 10) : 0;
        if (!all_digits(v) || errno) {
            cli_usage_error(o, "%s expects a whole number from 0 to 18446744073709551615, not '%s'", s->name, v);
            return false;
        }
        *(uint64_t *)base = x;
        return true;
    }
    char *end = NULL;
    double x = (*v >= '0' && *v <= '9') || *v == '.' ? strtod(v, &end) : NAN;
    if (errno || !end || *end || !isfinite(x) || x < s->min || x > s->max) {
        cli_usage_error(o, "%s expects a number from %g to %g, not '%s'", s->name, s->min, s->max, v);
        return false;
    }
    *(double *)base = x;
    return true;
}

// A size written well but too large to hold: a number, then a unit that mp_parse_bytes knows.
static bool well_formed_size(const char *v) {
    char *end = NULL, one[16];
    uint64_t x;
    if (!((*v >= '0' && *v <= '9') || *v == '.') || !(strtod(v, &end) > 0) || end == v) return false;
    return snprintf(one, sizeof one, "1%s", end) < (int)sizeof one && *end && mp_parse_bytes(one, &x);
}

// A size with its unit: v as typed, text as read (the GPU reading of --device-memory). A bare
// number is ambiguous (80: bytes or GB?) unless it is zero; a size past the range says the range.
static bool set_size(const cli_options *o, const opt_spec *s, const char *v, const char *text, char *base) {
    uint64_t x = 0;
    bool bare = all_digits(v) && strspn(v, "0") != strlen(v), parsed = !bare && mp_parse_bytes(text, &x);
    if (parsed && (double)x >= s->min && (double)x <= s->max) {
        *(uint64_t *)base = x;
        return true;
    }
    if (parsed || (!bare && well_formed_size(text))) {
        char most[32];
        cli_commas(most, sizeof most, (uint64_t)s->max);
        if (s->type == T_DEVICE)
            cli_usage_error(o, "%s expects a size from %.0fB to %s bytes, not '%s'", s->name, s->min, most, v);
        else
            cli_usage_error(o, "%s expects a size from %.0fB to %.0fTB (%s bytes), not '%s'", s->name, s->min,
                            s->max / 1e12, most, v);
        return false;
    }
    if (s->type == T_DEVICE)
        cli_usage_error(o,
                        "%s expects a size with its unit as GPU memory is sold, such as 24GB or 80GiB (both read as "
                        "GiB, 2^30 bytes; KiB, MiB and TiB alike; B for bytes), not '%s'",
                        s->name, v);
    else
        cli_usage_error(o,
                        "%s expects a size with its unit, such as 80GB, 500MiB or %sB for bytes (units: B, kB, MB, GB, "
                        "TB = 10^3..10^12; KiB, MiB, GiB, TiB = 2^10..2^40), not '%s'",
                        s->name, bare ? v : "123456", v);
    return false;
}

// As GPU vendors label memory: the decimal-looking units are read as binary ones (24GB: 24 GiB).
static bool set_device(const cli_options *o, const opt_spec *s, const char *v, char *base) {
    static const char *const dec[] = {"kb", "mb", "gb", "tb", "k", "m", "g", "t"};
    static const char *const bin[] = {"KiB", "MiB", "GiB", "TiB", "KiB", "MiB", "GiB", "TiB"};
    char text[96];
    size_t num = strspn(v, "0123456789.eE+-");
    snprintf(text, sizeof text, "%s", v);
    for (size_t i = 0; i < sizeof dec / sizeof dec[0] && num < sizeof text; i++)
        if (strcasecmp(v + num, dec[i]) == 0) snprintf(text + num, sizeof text - num, "%s", bin[i]);
    return set_size(o, s, v, text, base);
}

static bool set_gpus(const cli_options *o, const opt_spec *s, const char *v, char *base) {
    bool is_auto = strcmp(v, "auto") == 0;
    errno = 0;
    long x = is_auto ? 0 : all_digits(v) ? strtol(v, NULL, 10) : -1;
    if (!is_auto && (errno || x < (long)s->min || x > (long)s->max)) {
        cli_usage_error(o, "%s expects a whole number from %.0f to %.0f, or auto, not '%s'", s->name, s->min, s->max,
                        v);
        return false;
    }
    *(long *)base = x;
    return true;
}

static bool set_choice(const cli_options *o, const opt_spec *s, const char *v, char *base) {
    size_t n = strlen(v);
    for (const char *p = choices(s); *p;) {
        const char *bar = strchr(p, '|');
        size_t k = bar ? (size_t)(bar - p) : strlen(p);
        if (k == n && strncmp(p, v, n) == 0) {
            *(const char **)base = v;
            return true;
        }
        p += k + (bar != NULL);
    }
    char list[256];
    snprintf(list, sizeof list, "%s", choices(s));
    for (char *c = list; *c; c++)
        if (*c == '|') *c = ',';
    cli_usage_error(o, "%s must be one of %s, not '%s'", s->name, list, v);
    return false;
}

static bool set_value(const cli_options *o, const opt_spec *s, const char *v) {
    char *base = (char *)o + s->offset;
    switch (s->type) {
    case T_STR:
    case T_PATH:
    case T_OUT:
        // "--json --quiet" is a forgotten value, not a file named --quiet; "-" is stdout.
        if (!*v || (v[0] == '-' && !(s->type == T_OUT && v[1] == 0))) {
            cli_usage_error(o, "%s needs a %s, not '%s'%s", s->name, s->value, v,
                            v[0] == '-' && v[1] ? " (write ./NAME for a file whose name starts with '-')" : "");
            return false;
        }
        *(const char **)base = v;
        return true;
    case T_LONG:
    case T_U64:
    case T_DOUBLE: return set_number(o, s, v, base);
    case T_BYTES: return set_size(o, s, v, v, base);
    case T_DEVICE: return set_device(o, s, v, base);
    case T_GPUS: return set_gpus(o, s, v, base);
    case T_CHOICE: return set_choice(o, s, v, base);
    case T_FLAG: break;
    }
    return false;
}

// The table's defaults, through the same setters as the user's values.
static void apply_defaults(cli_options *o) {
    for (size_t k = 0; k < NSPECS; k++) {
        const opt_spec *s = &specs[k];
        const char *d = (s->alt_cmds & o->cmd) ? s->alt_def : s->def;
        if (d && (s->cmds & o->cmd) && !set_value(o, s, d)) abort(); // a bad default is a bug
    }
}

bool cli_parse(cli_options *o, const cli_command *cmd, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->command = cmd->name;
    o->cmd = cmd->bit;
    o->argc = argc;
    o->argv = argv;
    apply_defaults(o);
    for (int i = 2; i < argc; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        if (strcmp(arg, "-h") == 0) arg = "--help";
        size_t len = eq && strncmp(arg, "--", 2) == 0 ? (size_t)(eq - arg) : strlen(arg);
        const opt_spec *s = strncmp(arg, "--", 2) == 0 ? find_spec(arg, len) : NULL;
        char names[64];
        if (!s && o->cmd == CLI_SNAPSHOT && arg[0] != '-' && !o->input) { // membill snapshot FILE
            o->input = arg;
            continue;
        }
        if (!s) {
            char typed[80], hint[96];
            snprintf(typed, sizeof typed, "%.*s", (int)(len < 79 ? len : 79), arg);
            if (arg[0] == '-' && cli_suggest(typed, option_name, NSPECS))
                cli_usage_error(o, "unknown option '%.*s'%s", (int)len, arg,
                                cli_did_you_mean(hint, sizeof hint, typed, option_name, NSPECS));
            else if (arg[0] == '-')
                cli_usage_error(o, "unknown option '%.*s' (see membill %s --help)", (int)len, arg, o->command);
            else
                cli_usage_error(o, "unexpected argument '%s': options start with -- (see membill %s --help)", arg,
                                o->command);
            return false;
        }
        if (!(s->cmds & o->cmd)) {
            cli_usage_error(o, "%s does not apply to %s (it belongs to %s)", s->name, o->command,
                            command_names(s->cmds, names, sizeof names));
            return false;
        }
        if (o->given[s - specs]) {
            cli_usage_error(o, "%s is given twice", s->name);
            return false;
        }
        o->given[s - specs] = 1;
        if (s->type == T_FLAG) {
            if (eq && len < strlen(arg)) {
                cli_usage_error(o, "%s takes no value", s->name);
                return false;
            }
            *(bool *)((char *)o + s->offset) = true;
            continue;
        }
        const char *v = eq && len < strlen(arg) ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            cli_usage_error(o, "%s needs a value (%s)", s->name, s->value);
            return false;
        }
        if (!set_value(o, s, v)) return false;
    }
    return true;
}

// --help of one subcommand: its description, then every option it takes, from the table.
void cli_usage(FILE *f, const cli_command *cmd) {
    fprintf(f, "usage: membill %s %s[options]\n%s\n\n", cmd->name, cmd->bit == CLI_SNAPSHOT ? "FILE.pickle " : "",
            cmd->description);
    for (size_t k = 0; k < NSPECS; k++) {
        const opt_spec *s = &specs[k];
        if (!(s->cmds & cmd->bit)) continue;
        char head[64];
        snprintf(head, sizeof head, "%s%s%s", s->name, s->value ? " " : "", s->value ? s->value : "");
        const char *d = (s->alt_cmds & cmd->bit) ? s->alt_def : s->def;
        fprintf(f, "  %-22s %s", head, help_of(s));
        if (s->type == T_CHOICE) fprintf(f, ": %s", choices(s));
        if (d) fprintf(f, " (default %s)", d);
        fputc('\n', f);
    }
}

void cli_usage_all(FILE *f) {
    fputs("usage: membill COMMAND [options]\n\n", f);
    for (size_t i = 0; i < cli_command_count(); i++) fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
    fputs("\nmembill help COMMAND (or membill COMMAND --help) lists a command's options; membill help frameworks\n"
          "[--markdown] what each --framework keeps; membill --version prints the version.\n",
          f);
}

// Every option as a Markdown table (the README's list is this output).
void cli_options_markdown(FILE *f) {
    fputs("| option | train | infer | compare | check | plan | snapshot | default | meaning |\n", f);
    fputs("|---|:-:|:-:|:-:|:-:|:-:|:-:|---|---|\n", f);
    static const unsigned order[] = {CLI_TRAIN, CLI_INFER, CLI_COMPARE, CLI_CHECK, CLI_PLAN, CLI_SNAPSHOT};
    for (size_t k = 0; k < NSPECS; k++) {
        const opt_spec *s = &specs[k];
        fprintf(f, "| `%s%s%s` |", s->name, s->value ? " " : "", s->value ? s->value : "");
        for (int c = 0; c < 6; c++) fputs(s->cmds & order[c] ? " x |" : "   |", f);
        if (s->def && s->alt_cmds)
            fprintf(f, " %s (plan %s) |", s->def, s->alt_def);
        else
            fprintf(f, " %s |", s->def ? s->def : "");
        fprintf(f, " %s", help_of(s));
        if (s->type == T_CHOICE) { // a '|' would split the cell
            fputs(": ", f);
            for (const char *p = choices(s); *p; p++) fputs(*p == '|' ? ", " : (char[2]){*p, 0}, f);
        }
        fputs(" |\n", f);
    }
}
