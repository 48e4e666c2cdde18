// What a run is made of: the config, where the weights come from, the token ids, and the
// options that only make sense together.
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool is_f32(const char *dtype) { return !dtype || strcmp(dtype, "fp32") == 0; }

// The LoRA options: each needs adapters (--lora-rank, an --adapter, compare's --lora).
static const char *lora_combinations(const cli_options *o, char *buf, size_t len) {
    bool adapters = o->lora_rank > 0 || o->adapter || o->lora;
    const char *const needs[] = {"--lora-alpha", "--lora-targets", "--lora-dropout", "--base-dtype", "--save-adapter"};
    for (size_t i = 0; i < sizeof needs / sizeof needs[0]; i++)
        if (!adapters && cli_given(o, needs[i])) {
            snprintf(buf, len, "%s configures LoRA: add --lora-rank R%s", needs[i],
                     o->cmd == CLI_COMPARE ? " and --lora"
                     : o->cmd == CLI_TRAIN ? " (or --adapter DIR)"
                                           : "");
            return buf;
        }
    if (o->cmd == CLI_COMPARE && cli_given(o, "--lora-rank") && !o->lora)
        return "--lora-rank in compare sets the LoRA column: add --lora";
    if (o->cmd == CLI_COMPARE && o->lora && cli_given(o, "--lora-rank") && o->lora_rank == 0)
        return "compare --lora needs a rank of 1 or more";
    if (o->meta && (o->save_adapter || o->adapter))
        return "--meta runs on shapes alone: --adapter and --save-adapter need data";
    if (o->adapter && o->save_adapter && strcmp(o->adapter, o->save_adapter) == 0)
        return "--save-adapter names the --adapter folder the run reads: give another folder";
    return NULL;
}

// The offset of the first byte of s that does not begin well-formed UTF-8 (no overlong forms,
// surrogates or code points past U+10FFFF), or -1.
static long utf8_fault(const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    for (long i = 0; s[i];) {
        unsigned char c = s[i];
        int n = c < 0x80 ? 0 : c >= 0xC2 && c <= 0xDF ? 1 : (c >> 4) == 0xE ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        if (n < 0) return i;
        for (int k = 1; k <= n; k++)
            if ((s[i + k] & 0xC0) != 0x80) return i;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] >= 0xA0) || (c == 0xF0 && s[i + 1] < 0x90) ||
            (c == 0xF4 && s[i + 1] >= 0x90))
            return i;
        i += n + 1;
    }
    return -1;
}

bool cli_sharded(const cli_options *o) { return cli_given(o, "--zero") || o->fsdp; }
// "<what>, which --framework <name> does not have: use --framework <those that do>".
static const char *framework_lacks(char *buf, size_t len, const char *what, ag_framework_field field,
                                   const char *name) {
    int n = snprintf(buf, len, "%s, which --framework %s does not have: use --framework", what, name);
    for (int f = 0, k = 0; f < AG_NFRAMEWORKS && n > 0 && (size_t)n < len; f++) {
        const ag_framework_row *r = ag_framework_row_of((ag_framework)f);
        bool has = field == AG_FWF_autocast ? AG_FW(r, autocast) : AG_FW(r, flash_available);
        if (has) n += snprintf(buf + n, len - (size_t)n, "%s %s", k++ ? " or" : "", AG_FW(r, name));
    }
    return buf;
}

// --device, --gpu and what needs the device (docs/gpu.md).
static const char *device_combinations(const cli_options *o) {
    bool cuda = (o->device && !strcmp(o->device, "cuda")) || o->gpu;
    if (o->gpu && cli_given(o, "--device") && strcmp(o->device, "cuda") != 0)
        return "--gpu names a CUDA card: it does not go with --device cpu";
    if (o->gpu && cli_given(o, "--device-memory"))
        return "--gpu gives the device's memory: --device-memory is for a card that has no name here";
    if (!cuda && (o->cuda_alloc_conf || o->snapshot || cli_given(o, "--memory-fraction")))
        return "--cuda-alloc-conf, --memory-fraction and --snapshot are the CUDA allocator's: add --device cuda or "
               "--gpu";
    ag_attention_kind att = AG_ATTENTION_EAGER;
    cli_parse_attention(o->attention, &att); // the table allows only known names
    if (att != AG_ATTENTION_EAGER && !ag_device_row_of(cuda ? AG_DEVICE_CUDA : AG_DEVICE_CPU)->sdpa[att])
        return att == AG_ATTENTION_EFFICIENT
                   ? "--attention efficient is PyTorch's memory-efficient CUDA kernel: add --device cuda or --gpu"
                   : "--attention cudnn is cuDNN's CUDA kernel: add --device cuda or --gpu";
    if (cli_given(o, "--memory-fraction") && !o->gpu && !cli_given(o, "--device-memory"))
        return "--memory-fraction is a share of the card's memory: name the card (--gpu or --device-memory)";
    if (o->seq_lens && (o->tokens || o->prompt || o->prompt_file))
        return "--seq-lens gives each step's length: random ids, not --tokens or a prompt";
    if (o->seq_lens && cli_given(o, "--seq-len")) return "--seq-lens and --seq-len both give the length: give one";
    if (o->seq_lens && (cli_sharded(o) || (o->cmd == CLI_PLAN && (o->infer || o->gpus != 1))))
        return "--seq-lens varies one device's training steps: not with --infer, --gpus or --zero";
    if (cuda && o->cmd == CLI_TRAIN && cli_given(o, "--zero"))
        return "--zero runs real ranks on this machine: membill plan --gpus N --zero S --device cuda bills a rank's "
               "device";
    if (o->cmd == CLI_SNAPSHOT && !o->input) return "which snapshot? membill snapshot FILE.pickle";
    if (o->list_gpus && (o->list || cli_given(o, "--model") || o->config))
        return "--list-gpus lists the named GPUs: nothing to plan with it";
    return NULL;
}

// Every rule that ties two options together, per subcommand. The table has already refused
// options a subcommand does not take.
bool cli_check_combinations(const cli_options *o) {
    const char *bad = NULL;
    char buf[600], what[96];
    bool infer_plan = o->cmd == CLI_PLAN && o->infer;
    bool hub_id = llama_hub_is_id(o->model);
    ag_framework fw = CLI_DEFAULT_FRAMEWORK;
    cli_parse_framework(o->framework, &fw); // the table allows only known names
    const ag_framework_row *row = ag_framework_row_of(fw);
    cli_dtype dt = {0};
    const bool autocast = cli_parse_dtype(o->dtype, &dt) && dt.autocast;
    if (cli_given(o, "--model") && cli_given(o, "--config"))
        bad = "--model and --config both name a model: give one";
    else if ((o->download || o->offline) && !hub_id)
        bad = "--download and --offline apply to a Hugging Face id: --model org/name";
    else if (o->download && o->offline)
        bad = "--download fetches from the Hub, which --offline forbids";
    else if (o->download && (o->meta || o->weights))
        bad = o->meta ? "--meta reads no weights: --download does not apply"
                      : "--weights names the weights: --download would fetch the Hub model's";
    else if (o->cmd == CLI_CHECK && o->prompt && !hub_id)
        bad = "check's --prompt goes through the Hub model's tokenizer: give --model org/name";
    else if (o->meta && (o->weights || o->dump_grads || o->save_weights))
        bad = "--meta runs on shapes alone: --weights, --dump-grads and --save-weights need data";
    else if (cli_given(o, "--zero") && o->fsdp)
        bad = "--fsdp and --zero are two sharding strategies: give one";
    else if (o->cmd == CLI_TRAIN && !o->meta && cli_sharded(o) && !is_f32(o->dtype))
        bad = "--zero and --fsdp compute their shards in float32: another --dtype is a bill of plan --gpus N (or "
              "--meta)";
    else if (o->cmd == CLI_TRAIN && !o->meta && o->dtype && !strncmp(o->dtype, "fp16", 4))
        snprintf(buf, sizeof buf,
                 "--dtype %s trains in float16, which needs loss scaling that membill does not compute: it needs "
                 "--meta",
                 o->dtype),
            bad = buf;
    else if (autocast && !AG_FW(row, autocast))
        bad = framework_lacks(buf, sizeof buf,
                              (snprintf(what, sizeof what, "--dtype %s is torch.autocast's semantics", o->dtype), what),
                              AG_FWF_autocast, AG_FW(row, name));
    else if (o->attention && strcmp(o->attention, "eager") != 0 && !AG_FW(row, flash_available))
        bad = framework_lacks(
            buf, sizeof buf,
            (snprintf(what, sizeof what, "--attention %s is scaled_dot_product_attention", o->attention), what),
            AG_FWF_flash, AG_FW(row, name));
    else if (o->attention && (!strcmp(o->attention, "efficient") || !strcmp(o->attention, "cudnn")) &&
             AG_FW(row, flash) != AG_FLASH_SDPA)
        bad = (snprintf(buf, sizeof buf,
                        "--attention %s is a kernel of PyTorch's SDPA: --framework %s has its own "
                        "fused attention (--attention flash)",
                        o->attention, AG_FW(row, name)),
               buf);
    else if (o->cmd == CLI_INFER && autocast)
        snprintf(buf, sizeof buf, "--dtype %s is a training setting: a generation takes fp32, bf16 or fp16",
                 o->dtype),
            bad = buf;
    else if (cli_given(o, "--group-size") && !(o->weight_dtype && strcmp(o->weight_dtype, "int4") == 0))
        bad = "--group-size sets the elements per scale of --weight-dtype int4";
    else if (cli_given(o, "--lr") && o->optimizer && strcmp(o->optimizer, "none") == 0)
        bad = "--lr does not apply to --optimizer none";
    else if (cli_given(o, "--adam-impl") && o->optimizer && strcmp(o->optimizer, "adam") != 0 &&
             strcmp(o->optimizer, "adamw") != 0)
        snprintf(buf, sizeof buf, "--adam-impl is how Adam runs: it does not apply to --optimizer %s", o->optimizer),
            bad = buf;
    else if (o->cmd == CLI_PLAN && !o->infer &&
             (o->weight_dtype || cli_given(o, "--group-size") || cli_given(o, "--new-tokens")))
        bad = "--weight-dtype, --group-size and --new-tokens plan a generation: add --infer";
    else if (infer_plan && (cli_given(o, "--optimizer") || cli_given(o, "--adam-impl") || cli_given(o, "--gpus") ||
                            cli_sharded(o) || o->checkpointing || cli_given(o, "--bucket-mb") ||
                            cli_given(o, "--prefetch-layers") || o->offload || cli_given(o, "--grad-accum")))
        bad = "--infer plans one device's generation: --optimizer, --adam-impl, --gpus, --zero, --fsdp, --offload, "
              "--grad-accum, --bucket-mb, --prefetch-layers and --checkpointing are training settings";
    else if (o->cmd == CLI_TRAIN && !cli_sharded(o) &&
             (cli_given(o, "--bucket-mb") || cli_given(o, "--prefetch-layers")))
        bad = "--bucket-mb and --prefetch-layers set up a sharded step: add --zero or --fsdp";
    else if (cli_given(o, "--prefetch-layers") && o->zero != 3 && !o->fsdp)
        snprintf(buf, sizeof buf,
                 "--prefetch-layers gathers the weights of the blocks ahead, which only --zero 3 and --fsdp shard: it "
                 "does not apply to --zero %ld",
                 o->zero),
            bad = buf;
    else if (o->offload && !o->fsdp && !(cli_given(o, "--zero") && o->zero >= 2))
        bad = "--offload moves a sharded optimizer to the host: add --zero 2, --zero 3 or --fsdp";
    else if (o->offload && !strcmp(o->offload, "optimizer+params") && !o->fsdp && o->zero != 3)
        bad = "--offload optimizer+params moves the weight shards too, which --zero 3 and --fsdp have: --zero 2 "
              "keeps whole weights on every device (--offload optimizer)";
    else if (o->offload && o->fsdp && !strcmp(o->offload, "optimizer"))
        bad = "FSDP's CPUOffloadPolicy moves the parameter shards with the optimizer: --offload optimizer+params";
    else if (o->cmd == CLI_PLAN && cli_given(o, "--gpus") && o->gpus == 0 && !o->device_memory && !o->gpu)
        bad =
            "--gpus auto looks for the fewest GPUs whose share fits one device: add --device-memory SIZE or --gpu NAME";
    else if (o->cmd == CLI_TRAIN && cli_sharded(o) && o->dump_grads)
        bad = "--dump-grads writes whole gradients, which --zero and --fsdp shard or reduce in buckets: use it "
              "without them";
    else if (o->cmd == CLI_INFER && o->tokens && strchr(o->tokens, ';') && cli_given(o, "--batch"))
        bad = "--batch repeats one prompt: give several prompts with ';' or --batch, not both";
    else if ((o->prompt != NULL) + (o->prompt_file != NULL) + (o->tokens != NULL) > 1)
        bad = "--prompt, --prompt-file and --tokens each give the input: give one";
    else if (o->tokenizer && !o->prompt && !o->prompt_file && o->cmd != CLI_INFER)
        bad = "--tokenizer reads --prompt or --prompt-file: give one of them";
    else if (o->cmd == CLI_COMPARE && o->tokens && strchr(o->tokens, ';'))
        bad = "compare trains on one prompt repeated over --batch: give one prompt";
    else if (o->ep > 1 && o->gpus != 0 && (o->gpus < o->ep || o->gpus % o->ep != 0))
        snprintf(buf, sizeof buf,
                 "--ep %ld splits the experts over %ld of the --gpus: --gpus must be a multiple of it (or auto)", o->ep,
                 o->ep),
            bad = buf;
    else if (o->ep > 1 && o->fsdp)
        bad = "--ep shards each rank's experts over their expert-data-parallel group under --zero (DeepSpeed's): "
              "--fsdp with experts split is not modelled";
    else if (o->ep > 1 && o->infer)
        bad = "--ep plans a training step: a generation with its experts split is not modelled";
    else if (cli_given(o, "--routing") && o->cmd != CLI_PLAN && !o->meta)
        bad = "--routing sets how a meta run routes its tokens; a real run routes by its routers (--routing-out "
              "records their choices): add --meta";
    else if (o->routing_out && o->meta)
        bad = "--routing-out records a real run's routing: --meta routes by --routing";
    if (!bad) bad = lora_combinations(o, buf, sizeof buf);
    long fault = !bad && o->prompt ? utf8_fault(o->prompt) : -1;
    if (fault >= 0)
        snprintf(buf, sizeof buf, "--prompt: byte %ld is not valid UTF-8 (the text must be UTF-8)", fault), bad = buf;
    if (!bad) bad = device_combinations(o);
    if (!bad) {
        // Two outputs on stdout would interleave.
        const char *outs[] = {o->json, o->timeline,   o->svg,          o->trace,
                              o->html, o->dump_grads, o->save_weights, o->snapshot};
        int dashes = 0;
        for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) dashes += outs[i] && strcmp(outs[i], "-") == 0;
        if (dashes > 1) bad = "only one output can go to stdout ('-')";
    }
    if (!bad && o->dtype && !(o->cmd == CLI_TRAIN || (o->cmd == CLI_PLAN && !o->infer))) {
        cli_dtype d;
        ag_err e;
        if (!cli_infer_dtype(o, &d, &e)) snprintf(buf, sizeof buf, "%s", e.msg), bad = buf;
    }
    if (bad) cli_usage_error(o, "%s", bad);
    return !bad;
}

int cli_run_end(int rc, bool *clean, ag_err *err) {
    *clean = true;
    for (int c = 0; c < MP_OTHER; c++)
        if (mp_get_counter(c).live != 0 || mp_get_host_counter(c).live != 0) *clean = false;
    const mp_oom_record *r = mp_oom();
    if (rc != 0 || !r->happened) return rc;
    ag_err_set(err, "over the memory budget of %llu bytes: %s %s took %llu bytes in phase %s",
               (unsigned long long)r->budget, r->category == MP_OTHER ? "plain malloc after" : "tensor",
               r->category == MP_OTHER ? mp_site_name(r->live.site) : mp_site_name(r->site),
               (unsigned long long)r->requested, mp_phase_name(r->live.phase));
    return -1;
}

// A weights file (a .safetensors or an index, not a folder) takes its config from --model or
// --config, else the default preset: one that does not fit it is refused before the run, saying
// where the config came from (and of a config.json beside the file, that it was not read). A file
// that does not open is left to the run, which names why.
static int check_weights_file(const cli_options *o, const llama_config *cfg, const char *st, ag_err *err) {
    llama_ckpt *ck = NULL;
    ag_err e;
    int rc = llama_ckpt_open(&ck, st, &e) != 0 || llama_ckpt_check_params(ck, cfg, false, &e) == 0 ? 0 : -1;
    llama_ckpt_close(ck);
    if (rc == 0) return 0;
    char beside[4200];
    struct stat sb;
    const char *slash = strrchr(st, '/');
    snprintf(beside, sizeof beside, "%.*sconfig.json", slash ? (int)(slash - st + 1) : 0, st);
    bool there = stat(beside, &sb) == 0;
    if (o->config)
        ag_err_set(err, "%s; the config is --config %s", e.msg, o->config);
    else if (cli_given(o, "--model"))
        ag_err_set(err, "%s; the config is --model %s", e.msg, o->model);
    else
        ag_err_set(err,
                   "%s; the config is the default preset %s: a weights file takes its config from --model or "
                   "--config%s%s%s",
                   e.msg, o->model, there ? "; the folder's own is --config " : "", there ? beside : "",
                   there ? ", or --weights with the folder" : "");
    return EXIT_RUN_FAILED;
}

int cli_load_config(const cli_options *o, llama_config *cfg, char *st_path, size_t st_len, ag_err *err) {
    char cfg_from_weights[4096] = "";
    st_path[0] = 0;
    if (o->weights && llama_weights_resolve(o->weights, cfg_from_weights, st_path, st_len, err) != 0)
        return EXIT_RUN_FAILED;
    if (cfg_from_weights[0] && (cli_given(o, "--model") || cli_given(o, "--config"))) {
        ag_err_set(err, "--weights %s is a folder with its own config.json: %s would name the model a second time",
                   o->weights, cli_given(o, "--model") ? "--model" : "--config");
        return EXIT_USAGE; // two options name the model
    }
    const char *cfg_file = o->config ? o->config : (cfg_from_weights[0] ? cfg_from_weights : NULL);
    if (cfg_file && llama_config_load(cfg, cfg_file, err) != 0) return EXIT_RUN_FAILED;
    if (cfg_file && o->hub) snprintf(cfg->name, sizeof cfg->name, "%s", cli_hub_name(o->hub));
    if (!cfg_file) {
        ag_err why = {{0}};
        if (llama_config_preset(cfg, o->model, &why) != 0) {
            char hint[96];
            const char *mean = cli_did_you_mean(hint, sizeof hint, o->model, llama_preset_name, llama_preset_count());
            if (strncmp(why.msg, "unknown model", 13) != 0) // a preset of a family not modelled yet: its reason
                ag_err_set(err, "--model: %s", why.msg);
            else
                ag_err_set(err, "--model: unknown preset '%s'%s", o->model,
                           *mean ? mean : " (membill plan --list names them)");
            return EXIT_USAGE;
        }
    }
    if (o->mla_cache && strcmp(o->mla_cache, "latent") == 0) {
        if (cfg->mla.kv_lora_rank <= 0) {
            ag_err_set(err, "--mla-cache latent: model_type \"%s\" has no latent attention (deepseek_v3 has)",
                       llama_family_name(cfg->family));
            return EXIT_USAGE;
        }
        cfg->mla.latent_cache = true;
    }
    // a Hub id's files are one checkpoint: its config is the checkpoint's own
    return st_path[0] && !cfg_from_weights[0] && !o->hub ? check_weights_file(o, cfg, st_path, err) : 0;
}

// One id of an id list: digits only, any number of them (an id too large for any vocabulary is
// still an id, and told so).
static int parse_id(const char *p, long item, int64_t vocab, int32_t *id, const char **end, ag_err *err) {
    const char *q = p;
    while (*q >= '0' && *q <= '9') q++;
    if (q == p || (*q && *q != ',')) {
        ag_err_set(err, "--tokens: item %ld is not a token id (expected comma-separated ids such as 1,2,3)", item);
        return EXIT_USAGE;
    }
    *end = q;
    while (*p == '0' && p + 1 < q) p++; // leading zeros change nothing
    unsigned long long v = (size_t)(q - p) <= 9 ? strtoull(p, NULL, 10) : ULLONG_MAX;
    if (v >= LLAMA_MAX_VOCAB) {
        ag_err_set(err, "--tokens: item %ld is id %.*s%s, past any vocabulary (ids are 0 to %d)", item,
                   (int)(q - p > 40 ? 40 : q - p), p, q - p > 40 ? "..." : "", LLAMA_MAX_VOCAB - 1);
        return EXIT_USAGE;
    }
    if (vocab && (int64_t)v >= vocab) {
        ag_err_set(err, "--tokens: item %ld is id %llu, past the model's %lld ids (vocab_size)", item, v,
                   (long long)vocab);
        return EXIT_RUN_FAILED;
    }
    *id = (int32_t)v;
    return 0;
}

int cli_parse_tokens(const char *text, int64_t vocab, int32_t **out, long *n, ag_err *err) {
    long cap = 16, count = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    const char *p = text;
    while (ids) {
        const char *end;
        int32_t id;
        int rc = parse_id(p, count + 1, vocab, &id, &end, err);
        if (rc != 0) {
            free(ids);
            return rc;
        }
        if (count == cap) {
            int32_t *grown = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!grown) break;
            ids = grown;
        }
        ids[count++] = id;
        if (!*end) {
            *out = ids;
            *n = count;
            return 0;
        }
        p = end + 1;
    }
    free(ids);
    ag_err_set(err, "--tokens: out of memory");
    return EXIT_RUN_FAILED;
}

int cli_make_tokens(const cli_options *o, const llama_config *cfg, const cli_text *text, bool meta, int32_t **out,
                    long *batch, long *seq_len, ag_err *err) {
    int32_t *row = NULL;
    long B = o->batch, T = o->seq_len;
    *out = NULL;
    if (text->ids && !(row = malloc((size_t)text->n * sizeof *row))) {
        ag_err_set(err, "out of memory");
        return EXIT_RUN_FAILED;
    }
    if (text->ids) memcpy(row, text->ids, (size_t)text->n * sizeof *row), T = text->n;
    if (o->tokens || text->ids) {
        int rc = o->tokens ? cli_parse_tokens(o->tokens, cfg->vocab, &row, &T, err) : 0;
        if (rc != 0) return rc;
        if (cli_given(o, "--seq-len") && o->seq_len != T) {
            ag_err_set(err, "%s gives %ld ids but --seq-len says %ld", o->tokens ? "--tokens" : "the prompt", T,
                       o->seq_len);
            free(row);
            return o->tokens ? EXIT_USAGE : EXIT_RUN_FAILED; // the prompt's count is the tokenizer's
        }
    }
    if (T > cfg->max_positions) {
        ag_err_set(err, "%ld tokens exceed the model's %lld positions (max_position_embeddings)", T,
                   (long long)cfg->max_positions);
        free(row);
        return EXIT_RUN_FAILED;
    }
    *batch = B;
    *seq_len = T;
    // A prompt from another tokenizer than the model's: its ids past the vocabulary.
    for (long i = 0; text->ids && i < T; i++)
        if (row[i] >= cfg->vocab) {
            ag_err_set(err,
                       "the prompt's token %ld is id %d, past the model's %lld ids (vocab_size): a tokenizer of "
                       "another model?",
                       i, row[i], (long long)cfg->vocab);
            free(row);
            return EXIT_RUN_FAILED;
        }
    if (meta) { // a bill of shapes reads no ids
        free(row);
        return 0;
    }
    if ((uint64_t)B * (uint64_t)T > ((uint64_t)1 << 31) / sizeof(int32_t)) {
        ag_err_set(err, "--batch %ld x --seq-len %ld: %llu tokens, more than a real run takes (2^29); --meta bills it",
                   B, T, (unsigned long long)B * (unsigned long long)T);
        free(row);
        return EXIT_USAGE;
    }
    int32_t *ids = malloc((size_t)(B * T) * sizeof *ids);
    if (!ids) {
        free(row);
        ag_err_set(err, "out of memory for %ld x %ld token ids", B, T);
        return EXIT_RUN_FAILED;
    }
    uint64_t s = o->seed * 0x9e3779b97f4a7c15ULL + 12345;
    for (long i = 0; i < B * T; i++) {
        if (row) {
            ids[i] = row[i % T];
        } else { // xorshift: any fixed, seeded sequence of ids in range will do
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            ids[i] = (int32_t)(s % (uint64_t)cfg->vocab);
        }
    }
    free(row);
    if (llama_check_tokens(cfg, ids, (size_t)(B * T), err) != 0) {
        free(ids);
        return EXIT_RUN_FAILED;
    }
    *out = ids;
    return 0;
}

const char *cli_commas(char *buf, size_t len, uint64_t v) {
    char digits[32];
    int n = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v), k = 0;
    size_t j = 0;
    for (int i = 0; i < n && j + 2 < len; i++) {
        if (i && (n - i) % 3 == 0) buf[j++] = ',';
        buf[j++] = digits[i];
        k++;
    }
    buf[j] = 0;
    return buf;
}
